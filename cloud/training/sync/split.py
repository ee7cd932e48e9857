"""Heterogeneous ranks, the math: per-rank batch sizes so that all ranks finish together.

Pure functions and one small value-holding tracker; no torch.distributed. ``split_batch`` gives
each rank a share of the global batch proportional to its speed (largest remainder, at least
``min_per_rank`` each); ``SpeedTracker`` smooths measured speeds (EWMA) and says when the current
split has drifted far enough from balanced to be worth changing (hysteresis, so noise does not
make ranks reshuffle every iteration).

Invariant: ``sum(split_batch(speeds, G)) == G`` for every input, and each share is >= min_per_rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def split_batch(speeds: Sequence[float], global_batch: int, min_per_rank: int = 1) -> tuple[int, ...]:
    """Samples per rank proportional to ``speeds`` (samples/s), summing to ``global_batch``."""
    n = len(speeds)
    if n == 0 or global_batch < n * min_per_rank:
        raise ValueError(f"global batch {global_batch} cannot give {n} ranks {min_per_rank} each")
    if any(s <= 0 for s in speeds):
        raise ValueError(f"speeds must be positive, got {list(speeds)}")
    spare = global_batch - n * min_per_rank
    total = sum(speeds)
    exact = [spare * s / total for s in speeds]
    sizes = [int(e) for e in exact]
    by_remainder = sorted(range(n), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in by_remainder[: spare - sum(sizes)]:
        sizes[i] += 1
    result = tuple(size + min_per_rank for size in sizes)
    assert sum(result) == global_batch
    return result


def fit_affine(observations: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``seconds = fixed + per_sample * samples`` from (samples, seconds) pairs.

    Falls back to no fixed part when the batch size has not varied enough to tell them apart.
    """
    if not observations:
        raise ValueError("no observations to fit")
    ns = [n for n, _ in observations]
    ts = [t for _, t in observations]
    mean_n, mean_t = sum(ns) / len(ns), sum(ts) / len(ts)
    var = sum((n - mean_n) ** 2 for n in ns)
    if max(ns) - min(ns) >= 2 and var > 0:
        per_sample = sum((n - mean_n) * (t - mean_t) for n, t in observations) / var
        fixed = mean_t - per_sample * mean_n
        if per_sample > 0 and fixed >= 0:
            return fixed, per_sample
    return 0.0, mean_t / mean_n


def affine_split(
    costs: Sequence[tuple[float, float]], global_batch: int, min_per_rank: int = 1
) -> tuple[int, ...]:
    """Batch shares that equalise ``fixed_r + per_sample_r * n_r`` across ranks (sum = global batch)."""
    finish = (global_batch + sum(fixed / per for fixed, per in costs)) / sum(1 / per for _, per in costs)
    shares = [max(float(min_per_rank), (finish - fixed) / per) for fixed, per in costs]
    return split_batch(shares, global_batch, min_per_rank)


def step_towards(current: Sequence[int], target: Sequence[int], gain: float) -> tuple[int, ...]:
    """Move ``current`` a fraction ``gain`` of the way to ``target``, keeping the same total.

    Damping matters because real cost is affine (a fixed per-iteration part plus a per-sample
    part): a split from samples/s alone overshoots, and a full step would oscillate.
    """
    if sum(current) != sum(target):
        raise ValueError(f"{list(current)} and {list(target)} have different totals")
    exact = [c + gain * (t - c) for c, t in zip(current, target, strict=True)]
    sizes = [int(round(e)) for e in exact]
    drift = sum(target) - sum(sizes)
    sign = 1 if drift > 0 else -1
    order = sorted(range(len(sizes)), key=lambda i: (exact[i] - sizes[i]) * sign, reverse=True)
    for i in order[: abs(drift)]:
        sizes[i] += 1 if drift > 0 else -1
    return tuple(sizes)


def should_resplit(
    predicted_imbalance: float, settling: bool, hysteresis: float, settle_within: float
) -> bool:
    """Two thresholds, as a thermostat has: an imbalance past ``1 + hysteresis`` starts re-splitting,
    which goes on (``settling``) until it is within ``1 + settle_within``. With one threshold the
    split would stop anywhere inside the band, up to ``hysteresis`` slower than balanced for good."""
    return predicted_imbalance > 1 + (settle_within if settling else hysteresis)


def iteration_times(speeds: Sequence[float], sizes: Sequence[int]) -> tuple[float, ...]:
    return tuple(size / speed for size, speed in zip(sizes, speeds, strict=True))


def imbalance(speeds: Sequence[float], sizes: Sequence[int]) -> float:
    """Slowest rank's predicted time over the fastest's (1.0 = balanced)."""
    times = iteration_times(speeds, sizes)
    return max(times) / min(times)


def speeds_from_generations(
    generations: Sequence[str], relative_speed: Mapping[str, float]
) -> tuple[float, ...]:
    """Declared node generations as starting speeds, before anything is measured."""
    unknown = sorted(set(generations) - set(relative_speed))
    if unknown:
        raise ValueError(f"no declared speed for generations {unknown}; known: {sorted(relative_speed)}")
    return tuple(float(relative_speed[g]) for g in generations)


@dataclass
class SpeedTracker:
    """EWMA of per-rank speeds; ``should_rebalance`` compares the split against them."""

    alpha: float = 0.5  # weight of the newest measurement
    hysteresis: float = 0.08  # re-split only when predicted slowest/fastest exceeds 1 + this
    speeds: tuple[float, ...] | None = None

    def observe(self, measured: Sequence[float]) -> tuple[float, ...]:
        if self.speeds is None:
            self.speeds = tuple(measured)
        else:
            self.speeds = tuple(
                self.alpha * m + (1 - self.alpha) * s for m, s in zip(measured, self.speeds, strict=True)
            )
        return self.speeds

    def should_rebalance(self, sizes: Sequence[int]) -> bool:
        return self.speeds is not None and imbalance(self.speeds, sizes) > 1 + self.hysteresis
