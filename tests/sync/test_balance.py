"""Balancing math, pure: splits, damping, EWMA with hysteresis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cloud.training.sync.split import (
    SpeedTracker,
    imbalance,
    should_resplit,
    speeds_from_generations,
    split_batch,
    step_towards,
)


@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=8), st.integers(8, 512))
def test_split_sums_to_global_batch(speeds: list[float], global_batch: int) -> None:
    sizes = split_batch(speeds, global_batch)
    assert sum(sizes) == global_batch and min(sizes) >= 1


def test_half_speed_rank_gets_a_third() -> None:
    assert split_batch([2.0, 1.0], 96) == (64, 32)
    assert imbalance([2.0, 1.0], (64, 32)) == 1.0
    assert imbalance([2.0, 1.0], (48, 48)) == 2.0


def test_damped_step_keeps_total() -> None:
    assert step_towards((64, 64), (86, 42), 0.5) == (75, 53)
    assert sum(step_towards((10, 20, 30), (30, 20, 10), 0.33)) == 60


def test_declared_generations() -> None:
    assert speeds_from_generations(["v100", "k80"], {"v100": 2.0, "k80": 1.0}) == (2.0, 1.0)


def test_hysteresis_ignores_small_drift_and_follows_real_change() -> None:
    tracker = SpeedTracker(alpha=0.5, hysteresis=0.1)
    tracker.observe([100.0, 100.0])
    tracker.observe([104.0, 98.0])
    assert not tracker.should_rebalance((50, 50))
    for _ in range(3):
        tracker.observe([100.0, 50.0])  # rank 1 slowed down
    assert tracker.should_rebalance((50, 50))


def test_affine_cost_fit_and_split() -> None:
    from cloud.training.sync.split import affine_split, fit_affine

    fixed, per_sample = fit_affine([(32, 0.006 + 32 * 0.001), (64, 0.006 + 64 * 0.001)])
    assert abs(fixed - 0.006) < 1e-12 and abs(per_sample - 0.001) < 1e-12
    assert fit_affine([(50, 0.05)]) == (0.0, 0.001)  # one size seen: no fixed part can be told apart
    sizes = affine_split([(0.006, 0.001), (0.012, 0.002)], 128)  # rank 1: everything twice as slow
    times = [0.006 + sizes[0] * 0.001, 0.012 + sizes[1] * 0.002]
    assert sum(sizes) == 128 and abs(times[0] - times[1]) < 0.003


def test_resplitting_starts_past_the_hysteresis_and_settles_close_to_balanced() -> None:
    hysteresis, settle_within = 0.1, 0.02
    assert not should_resplit(1.08, False, hysteresis, settle_within)  # inside the band: leave it
    assert should_resplit(1.12, False, hysteresis, settle_within)  # past it: start
    assert should_resplit(1.05, True, hysteresis, settle_within)  # started: go on inside the band...
    assert not should_resplit(1.015, True, hysteresis, settle_within)  # ...until within settle_within
