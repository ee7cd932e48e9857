"""Error statistics between a reference tensor and its approximation (pure functions).

Invariant: statistics are computed in float64 over the positions where the reference is finite;
non-finite positions are reported separately as a count of mismatches (NaN matches NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ErrorStats:
    relative_error: float  # ||a - r|| / ||r|| (0 when both are zero, inf when only r is)
    snr_db: float  # 10 log10(sum r^2 / sum (a - r)^2); inf when exact
    max_abs_error: float
    nonfinite_mismatches: int

    def __str__(self) -> str:
        return (
            f"rel={self.relative_error:.4g} snr={self.snr_db:.2f}dB max_abs={self.max_abs_error:.4g} "
            f"nonfinite_mismatches={self.nonfinite_mismatches}"
        )


def error_stats(reference: torch.Tensor, approx: torch.Tensor) -> ErrorStats:
    if reference.shape != approx.shape:
        raise ValueError(f"shapes differ: {tuple(reference.shape)} vs {tuple(approx.shape)}")
    ref = reference.detach().double().reshape(-1)
    app = approx.detach().double().reshape(-1)
    finite = torch.isfinite(ref)
    both_nan = torch.isnan(ref) & torch.isnan(app)
    mismatches = int(((~finite) & ~both_nan & (ref != app)).sum())
    diff = (app - ref)[finite]
    signal = float((ref[finite] ** 2).sum())
    noise = float((diff**2).sum())
    if noise == 0.0:
        relative, snr = 0.0, math.inf
    elif signal == 0.0:
        relative, snr = math.inf, -math.inf
    else:
        relative, snr = math.sqrt(noise / signal), 10.0 * math.log10(signal / noise)
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    return ErrorStats(relative, snr, max_abs, mismatches)
