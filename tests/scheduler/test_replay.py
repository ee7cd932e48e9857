"""bench/_scheduler_replay: a real-mode record replayed in the simulator, against hand-computed JCTs."""

from __future__ import annotations

from typing import Any

import pytest

from bench._scheduler_replay import compare


def job(name: str, steps: int, end: float) -> dict[str, Any]:
    return {
        "name": name,
        "devices": 2,
        "steps": steps,
        "submit": 100.0,
        "end": end,
        "steps_per_s": {"cpu": 10.0},
    }


def record(**policies: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodes": [{"name": "local", "devices": 2, "generation": "cpu"}],
        "min_run_s": 0.0,
        "round_interval_s": 1.0,
        "startup_s_mean": 2.0,
        "policies": {p: {"jobs": jobs} for p, jobs in policies.items()},
    }


def test_the_simulated_jct_adds_the_measured_startup_and_tail() -> None:
    real = record(fifo=[job("a", 100, end=115.0) | {"tail_s": 3.0}])
    errors, rows = compare(real)
    # startup 2 + 100 steps / 10 + tail 3 = 15 s; steps only: 10 s
    assert rows == [
        {
            "policy": "fifo",
            "job": "a",
            "real_jct_s": 15.0,
            "sim_jct_s": pytest.approx(15.0),
            "steps_only_jct_s": 10.0,
            "own_costs_jct_s": pytest.approx(13.0),  # no runs recorded: no startup of its own
        }
    ]
    assert errors["sim_vs_real_jct_error"] == pytest.approx(0.0)
    assert errors["sim_vs_real_jct_error_steps_only"] == pytest.approx(5.0 / 15.0)
    assert errors["sim_vs_real_jct_error_own_costs"] == pytest.approx(2.0 / 15.0)


def test_own_costs_are_each_policys_mean_startup_and_tail() -> None:
    fifo = job("a", 100, end=125.0) | {"tail_s": 5.0, "runs": [{"startup_s": 10.0}]}
    las = job("b", 100, end=112.0) | {"tail_s": 1.0, "runs": [{"startup_s": 1.0}, {"startup_s": None}]}
    _, rows = compare(record(fifo=[fifo], las=[las]))
    # fifo: 10 + 10 + 5; las: 1 + 10 + 1. Pooled: startup 2 (the record's), tail 3.
    assert [(r["job"], r["own_costs_jct_s"], r["sim_jct_s"]) for r in rows] == [
        ("a", pytest.approx(25.0), pytest.approx(15.0)),
        ("b", pytest.approx(12.0), pytest.approx(15.0)),
    ]


def test_every_policy_is_replayed_and_fifo_queues_the_second_job() -> None:
    real = {
        "real": record(
            fifo=[job("a", 100, end=112.0), job("b", 100, end=124.0)], las=[job("c", 50, end=107.0)]
        )
    }
    errors, rows = compare(real)
    # No tails measured: fifo a = 2 + 10, b starts at 12: 12 + 2 + 10; las c = 2 + 5.
    assert [(r["job"], r["sim_jct_s"]) for r in rows] == [
        ("a", pytest.approx(12.0)),
        ("b", pytest.approx(24.0)),
        ("c", pytest.approx(7.0)),
    ]
    assert errors["sim_vs_real_jct_error"] == pytest.approx(0.0)


def test_a_missing_field_is_named() -> None:
    broken = job("a", 100, end=115.0)
    del broken["steps_per_s"]
    with pytest.raises(ValueError, match="fifo job a: steps_per_s: missing"):
        compare(record(fifo=[broken]))
