"""Lookup tables for non-uniform (log-spaced) mantissa levels.

Nearest-level rounding is ``bucketize(r, midpoints)`` (the number of midpoints below r, r = |x|/2**E
in [0, 1)). Per element that is a binary search; instead the float32 bits of r, shifted right by
16, pick one of 32768 buckets (sign 0, 8 exponent bits, 7 mantissa bits). ``base[key]`` counts
the midpoints below the bucket's bottom and ``threshold[key]`` is the one midpoint inside the
bucket (+inf if none), so the index is ``base + (r > threshold)``: two gathers and three passes.

Invariant: for every float32 r >= 0 that is not NaN, ``base[key] + (r > threshold[key])`` equals
``torch.bucketize(r, midpoints)``; ``level_tables`` checks that no bucket holds two midpoints
(buckets are 2**-7 of an octave wide; levels are at least 4/126 octave apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from models.numerics.format import _log_levels

N_KEYS = 1 << 15  # non-negative float32 bit patterns >> 16


@dataclass(frozen=True)
class LevelTables:
    levels: torch.Tensor  # float32, max_code + 1: level k relative to 2**E
    signed_levels: torch.Tensor  # float32, 2 * max_code + 1: decode table indexed by code
    base: torch.Tensor  # float32, N_KEYS
    threshold: torch.Tensor  # float32, N_KEYS


@lru_cache(maxsize=16)
def _cpu_tables(max_code: int) -> LevelTables:
    levels = torch.tensor(_log_levels(max_code), dtype=torch.float32)
    midpoints = ((levels[1:] + levels[:-1]) / 2).numpy()  # float32: the very values bucketize used
    keys = np.arange(N_KEYS, dtype=np.uint32)
    low = (keys << 16).view(np.float32)
    high = np.append(((keys[1:]) << 16).view(np.float32), np.float32(np.inf))
    base = np.searchsorted(midpoints, low, side="left")  # midpoints strictly below low
    inside = np.searchsorted(midpoints, high, side="left") - base  # midpoints in [low, high)
    nan_keys = np.isnan(low)
    if (inside[~nan_keys] > 1).any():
        raise ValueError(f"log levels for max_code {max_code} are closer than one table bucket")
    threshold = np.where(inside > 0, midpoints[np.minimum(base, len(midpoints) - 1)], np.float32(np.inf))
    base = np.where(nan_keys, len(midpoints), base)
    threshold = np.where(nan_keys, np.float32(np.inf), threshold)
    return LevelTables(
        levels,
        torch.cat([-levels.flip(0)[:-1], levels]),
        torch.from_numpy(base.astype(np.float32)),
        torch.from_numpy(threshold.astype(np.float32)),
    )


def level_tables(max_code: int, device: torch.device | str = "cpu") -> LevelTables:
    tables = _cpu_tables(max_code)
    if torch.device(device).type == "cpu":
        return tables
    return LevelTables(
        *(t.to(device) for t in (tables.levels, tables.signed_levels, tables.base, tables.threshold))
    )
