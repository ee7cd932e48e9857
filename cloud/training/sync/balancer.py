"""Heterogeneous ranks, the mechanism: measure speeds, hand out batch shares, weight the sum.

Every rank sees the same global batch order; rank r trains on its slice ``[offset_r, offset_r +
size_r)``. Each rank times its own compute (forward + backward, not the all-reduce, which would
make every rank look equally slow) and calls ``end_iteration``; every ``every`` iterations the
ranks all-gather (samples, seconds) per iteration, fit each rank's cost as fixed + per-sample
seconds over its recent history (small batches are less efficient, so a samples/s split alone
overshoots), smooth it (EWMA), and, past the hysteresis, move part of the way to the split that
equalises predicted times, at the same iteration on every rank, re-splitting until the predicted
imbalance is within ``settle_within``. Gradients are scaled by
size_r / global before the all-reduce SUM (``weighted_allreduce`` or
``SyncScheduler.set_sample_weight``), so the update is the global batch's mean gradient,
exactly as if one process had taken the whole batch.

Works for any process group: a pipeline's replicated stage passes its own group.

Invariant: all ranks hold the same ``sizes`` at every iteration, and ``sum(sizes) == global_batch``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from cloud.training.sync.split import (
    SpeedTracker,
    affine_split,
    fit_affine,
    should_resplit,
    split_batch,
    step_towards,
)


class Balancer:
    def __init__(
        self,
        global_batch: int,
        *,
        group: dist.ProcessGroup | None = None,
        declared_speeds: Sequence[float] | None = None,
        alpha: float = 0.5,
        hysteresis: float = 0.08,
        every: int = 2,
        gain: float = 0.5,
        min_per_rank: int = 1,
        history: int = 8,
        settle_within: float = 0.02,
        progress_path: str | Path | None = None,
    ) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.global_batch = global_batch
        self.every = every
        self.gain = gain  # fraction of the way to the proportional split taken per re-split
        self.min_per_rank = min_per_rank
        self.tracker = SpeedTracker(alpha, hysteresis)
        self.settle_within = min(settle_within, hysteresis)  # see ``should_resplit``
        self._settling = False
        self.sizes = split_batch(declared_speeds or [1.0] * self.world, global_batch, min_per_rank)
        # the tracker smooths (fixed, per-sample) cost pairs per rank; its hysteresis gates re-splits
        self.iteration = 0
        self.predicted_imbalance = 1.0
        self.decisions: list[dict] = []
        self.progress_path = Path(progress_path) if progress_path else None
        self._samples = 0
        self._seconds = 0.0
        self._iterations = 0
        # per rank: recent (samples, seconds) per iteration, to fit fixed + per-sample cost
        self._history: list[deque] = [deque(maxlen=history) for _ in range(self.world)]

    @property
    def local_size(self) -> int:
        return self.sizes[self.rank]

    @property
    def weight(self) -> float:
        """Scale for local gradients (summed over the local slice) before the all-reduce SUM."""
        return self.local_size / self.global_batch

    def my_slice(self) -> slice:
        start = sum(self.sizes[: self.rank])
        return slice(start, start + self.local_size)

    def record(self, samples: int, compute_s: float) -> None:
        self._samples += samples
        self._seconds += compute_s
        self._iterations += 1

    def end_iteration(self) -> bool:
        """Count an iteration; every ``every`` exchange speeds and maybe re-split. True if re-split."""
        self.iteration += 1
        if self.iteration % self.every:
            return False
        local = torch.tensor(
            [float(self._samples), self._seconds, float(self._iterations)], dtype=torch.float64
        )
        gathered = [torch.zeros_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local, group=self.group)
        self._samples, self._seconds, self._iterations = 0, 0.0, 0
        for rank, (samples, seconds, iterations) in enumerate(g.tolist() for g in gathered):
            if samples > 0 and seconds > 0:
                self._history[rank].append((samples / iterations, seconds / iterations))
        if any(not h for h in self._history):
            return False
        # smoothed cost model per rank: EWMA over the fitted (fixed, per-sample) seconds
        fitted = [fit_affine(list(h)) for h in self._history]
        smoothed = self.tracker.observe([v for cost in fitted for v in cost])
        costs = [(smoothed[2 * r], smoothed[2 * r + 1]) for r in range(self.world)]
        predicted = [fixed + per * n for (fixed, per), n in zip(costs, self.sizes, strict=True)]
        self.predicted_imbalance = max(predicted) / min(predicted)
        self._settling = should_resplit(
            self.predicted_imbalance, self._settling, self.tracker.hysteresis, self.settle_within
        )
        if not self._settling:
            return False
        before = self.sizes
        target = affine_split(costs, self.global_batch, self.min_per_rank)
        self.sizes = step_towards(before, target, self.gain)
        if self.sizes == before:
            self._settling = False  # as close as whole samples get
            return False
        self._log(
            {
                "iteration": self.iteration,
                "action": "rebalance",
                "sizes_before": list(before),
                "sizes": list(self.sizes),
                "target": list(target),
                "cost_ms": [[round(f * 1e3, 3), round(p * 1e3, 4)] for f, p in costs],
                "predicted_imbalance_before": round(self.predicted_imbalance, 3),
            }
        )
        return True

    def status(self) -> dict:
        smoothed = self.tracker.speeds
        costs = None
        if smoothed:
            costs = [
                [round(smoothed[2 * r] * 1e3, 3), round(smoothed[2 * r + 1] * 1e3, 4)]
                for r in range(self.world)
            ]
        return {
            "sizes": list(self.sizes),
            "iteration": self.iteration,
            "cost_ms_fixed_per_sample": costs,
            "predicted_imbalance": round(self.predicted_imbalance, 3),
            "decisions": list(self.decisions),
        }

    def _log(self, entry: dict) -> None:
        self.decisions.append(entry)
        if self.progress_path is not None and self.rank == 0:
            with self.progress_path.open("a") as out:
                out.write(json.dumps({"kind": "balance", **entry}) + "\n")


def weighted_allreduce(
    params: Iterable[torch.nn.Parameter], weight: float, group: dist.ProcessGroup | None = None
) -> None:
    """grad <- sum over ranks of weight_r * grad_r, in one flat message."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([grad.reshape(-1) for grad in grads]).mul_(weight)
    dist.all_reduce(flat, group=group)
    offset = 0
    for grad in grads:
        count = grad.numel()
        grad.copy_(flat[offset : offset + count].view_as(grad))
        offset += count
