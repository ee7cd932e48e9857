"""The inference engine measures what one input costs on this box: timed probe runs when a model is
loaded (so a model that never ran here still has a figure), then the median of its real batches."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.camera.inference import MIN_COST_BATCHES, PROBE_RUNS, InferenceEngine
from models.inference import InferenceInput
from tests.harness.camera import scene_artifact, ticking


def frame(seq: int) -> InferenceInput:
    rng = np.random.default_rng(seq)
    return InferenceInput("cam1", seq, 0.0, rng.integers(0, 255, (240, 320, 3), dtype=np.uint8))


async def run_batch_of(engine: InferenceEngine, size: int, first_seq: int) -> None:
    for seq in range(first_seq, first_seq + size):  # submitted before the worker wakes: one batch
        engine.submit(frame(seq))
    for _ in range(size):
        assert await engine.next_result(30) is not None


async def test_cost_is_the_probe_until_real_batches_replace_it_and_a_swap_starts_over() -> None:
    engine = InferenceEngine(max_batch=8, timer=ticking(0.01))
    assert engine.cost_per_input() == (None, "probe")
    assert (await engine.start(scene_artifact("1"))).ok
    try:
        assert engine.cost_per_input() == (pytest.approx(0.01), "probe")  # PROBE_RUNS runs of 0.01 s
        for k in range(MIN_COST_BATCHES):
            await run_batch_of(engine, 4, 4 * k)
            if k < MIN_COST_BATCHES - 1:
                assert engine.cost_per_input() == (pytest.approx(0.01), "probe")
        assert engine.counters.batches == MIN_COST_BATCHES and engine.counters.largest_batch == 4
        assert engine.cost_per_input() == (pytest.approx(0.0025), "batches")  # 0.01 s per batch of 4
        assert engine.cost_status() == {
            "cost_s_per_input": pytest.approx(0.0025),
            "cost_from": "batches",
            "cost_batches": MIN_COST_BATCHES,
        }
        assert (await engine.swap(scene_artifact("2"))).ok
        assert engine.cost_per_input() == (pytest.approx(0.01), "probe")  # the new model's own figure
    finally:
        await engine.stop()
    assert PROBE_RUNS >= 3  # a median of several runs, not one


async def test_a_small_model_measures_far_below_a_raspberry_pi_class_cost() -> None:
    engine = InferenceEngine()
    assert (await engine.start(scene_artifact())).ok
    try:
        cost, source = engine.cost_per_input()
        assert source == "probe" and cost is not None and 0 < cost < 0.45  # the catalog's Pi figure
        await run_batch_of(engine, 2, 0)
        assert 0 < engine.cost_status()["cost_s_per_input"] < 0.45
    finally:
        await engine.stop()
