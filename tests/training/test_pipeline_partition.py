"""PipeDream's partitioning DP equals brute force on random profiles; plans print and parse."""

from __future__ import annotations

import random

import pytest

from cloud.training.partition import LayerCost, Plan, brute_force, even_plan, partition, plan_cost


def random_profile(rng: random.Random, n: int) -> list[LayerCost]:
    return [
        LayerCost(
            rng.uniform(1e-4, 1e-2),
            rng.uniform(1e-4, 2e-2),
            rng.choice([1, 10, 1000]) * rng.randint(1, 4096),
            rng.choice([0, 1, 100]) * rng.randint(1, 100_000),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_brute_force(seed):
    rng = random.Random(seed)
    layers = random_profile(rng, rng.randint(1, 7))
    workers = rng.randint(1, 5)
    bandwidth = rng.choice([1e6, 1e8, 1e10])
    ratio = rng.choice([1.0, 4.0])
    straight = rng.random() < 0.3 and workers <= len(layers)
    dp = partition(layers, workers, bandwidth, compression_ratio=ratio, straight=straight)
    bf = brute_force(layers, workers, bandwidth, compression_ratio=ratio, straight=straight)
    assert dp.time_per_minibatch_s == pytest.approx(bf.time_per_minibatch_s, rel=1e-12)
    assert dp.workers == workers
    assert plan_cost(layers, dp.stages, bandwidth, ratio) == pytest.approx(dp.time_per_minibatch_s, rel=1e-12)
    if straight:
        assert set(dp.replicas) == {1}


def test_compute_bound_chain_splits_evenly_and_slow_links_favour_fewer_cuts():
    layers = [LayerCost(1.0, 2.0, 1000, 0) for _ in range(4)]
    plan = partition(layers, 2, 1e12, straight=True)
    assert [(s.first, s.last) for s in plan.stages] == [(0, 1), (2, 3)]
    assert plan.time_per_minibatch_s == pytest.approx(6.0)
    # With parameters free to all-reduce, replicating the whole model is as good as any split.
    heavy_links = [LayerCost(1.0, 2.0, 10**9, 0) for _ in range(4)]
    assert partition(heavy_links, 2, 1e6).replicas == (2,)


def test_plan_text_round_trip_and_even_plan():
    plan = Plan.parse("0-2x1 | 3-5x2 @ 0.125s")
    assert plan.replicas == (1, 2) and plan.workers == 3
    assert Plan.parse(plan.text()) == plan
    assert [(s.first, s.last) for s in even_plan(9, 3).stages] == [(0, 2), (3, 5), (6, 8)]
    with pytest.raises(ValueError):
        partition(random_profile(random.Random(0), 2), 3, 1e9, straight=True)
