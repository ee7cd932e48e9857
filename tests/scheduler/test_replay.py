"""bench/_scheduler_replay: a real-mode record replayed in the simulator, against hand-computed JCTs."""

from __future__ import annotations

import pytest

from bench._scheduler_replay import compare


def one_job(end_s: float) -> dict[str, object]:
    return {
        "policy": "las",
        "start_overhead_s": 2.0,
        "round_s": 5.0,
        "jobs": [
            {
                "job_id": "a",
                "devices": 2,
                "submit_s": 100.0,
                "total_steps": 100,
                "steps_per_s": 10.0,
                "end_s": end_s,
            }
        ],
    }


def test_the_simulated_jct_is_overhead_plus_steps_over_throughput() -> None:
    error, rows = compare(one_job(end_s=115.0))  # real JCT 15 s; simulated 2 + 100/10 = 12 s
    assert rows == [{"policy": "las", "job_id": "a", "real_jct_s": 15.0, "sim_jct_s": pytest.approx(12.0)}]
    assert error == pytest.approx(3.0 / 15.0)


def test_runs_are_pooled_and_fifo_queues_the_second_job() -> None:
    fifo = one_job(end_s=112.0)
    fifo["policy"] = "fifo"
    fifo["jobs"] = [*fifo["jobs"], {**fifo["jobs"][0], "job_id": "b", "end_s": 124.0}]  # type: ignore[list-item]
    error, rows = compare({"runs": [one_job(end_s=112.0), fifo]})
    assert [r["sim_jct_s"] for r in rows] == pytest.approx([12.0, 12.0, 24.0])
    assert error == pytest.approx(0.0)


def test_a_missing_field_is_named() -> None:
    record = one_job(end_s=115.0)
    del record["jobs"][0]["steps_per_s"]  # type: ignore[index]
    with pytest.raises(ValueError, match="run 0 job a: steps_per_s: missing"):
        compare(record)
