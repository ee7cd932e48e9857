"""The aggregation math, as pure functions of flat update vectors (no state, no I/O).

- FedAvg (McMahan et al., AISTATS'17): the mean of client deltas weighted by sample count.
- FedBuff (Nguyen et al., AISTATS'22): the same mean over a buffer of K asynchronous updates, each
  weight also scaled by a staleness discount s(tau) = 1 / sqrt(1 + tau).
- Clipping: each delta scaled to L2 norm <= C before averaging (bounds one gateway's influence).
- Robust options (Yin et al., ICML'18): coordinate-wise median, coordinate-wise trimmed mean.

- State coordinates (``state`` masks: BatchNorm running statistics) hold values, not deltas: they
  are averaged like the rest (a convex combination, so a mean of variances stays non-negative) but
  never clipped, and the global model takes the average itself, not ``server_lr`` times a step.

Invariant: every function returns a new tensor and never modifies its arguments; weights are
normalised here, so callers pass raw (samples x discount) values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def staleness_discount(staleness: int) -> float:
    """FedBuff's polynomial discount 1/sqrt(1 + tau); tau < 0 is treated as 0."""
    return 1.0 / math.sqrt(1.0 + max(0, staleness))


def clip_by_norm(
    delta: torch.Tensor, max_norm: float | None, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, bool]:
    """(delta scaled to norm <= max_norm, whether it was scaled); coordinates in ``state`` are
    values: they neither count towards the norm nor scale."""
    if max_norm is None:
        return delta.clone(), False
    moving = delta if state is None else delta.masked_fill(state, 0.0)
    norm = float(torch.linalg.vector_norm(moving))
    if norm <= max_norm or norm == 0.0:
        return delta.clone(), False
    scaled = delta * (max_norm / norm)
    return (scaled if state is None else torch.where(state, delta, scaled)), True


def weighted_mean(deltas: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    if not deltas or len(deltas) != len(weights):
        raise ValueError(f"need matching, non-empty deltas and weights ({len(deltas)} vs {len(weights)})")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError("weights must sum to > 0")
    stacked = torch.stack(list(deltas))
    w = torch.tensor([float(x) / total for x in weights], dtype=stacked.dtype)
    return (w[:, None] * stacked).sum(dim=0)


def coordinate_median(deltas: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per coordinate, the median (the lower of the two middles for an even count)."""
    return torch.stack(list(deltas)).median(dim=0).values


def trimmed_mean(deltas: Sequence[torch.Tensor], trim_fraction: float) -> torch.Tensor:
    """Per coordinate, drop the floor(f * n) largest and smallest values, average the rest."""
    n = len(deltas)
    k = int(trim_fraction * n)
    if n - 2 * k < 1:
        raise ValueError(f"trim_fraction {trim_fraction} leaves nothing of {n} updates")
    ordered = torch.stack(list(deltas)).sort(dim=0).values
    return ordered[k : n - k].mean(dim=0)


def apply_delta(
    weights: torch.Tensor, delta: torch.Tensor, server_lr: float, state: torch.Tensor | None = None
) -> torch.Tensor:
    """weights + server_lr * delta; where ``state`` is set, ``delta`` is the new value itself."""
    stepped = weights + server_lr * delta
    return stepped if state is None else torch.where(state, delta, stepped)
