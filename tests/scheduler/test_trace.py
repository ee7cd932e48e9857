"""The trace file format and the Philly-like generator."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cloud.scheduler.trace import KINDS, TraceError, load, parse, philly_like, save

SAMPLE = Path(__file__).resolve().parents[2] / "cloud" / "scheduler" / "traces" / "sample.jsonl"


def test_save_then_load_gives_the_same_trace(tmp_path: Path) -> None:
    trace = philly_like(50, capacity=64, seed=1)
    save(trace, tmp_path / "t.jsonl")
    assert load(tmp_path / "t.jsonl") == trace


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"job_id": "a", "submit_s": 0, "devices": 0, "total_steps": 5}', "line 2: devices: must be >= 1"),
        ('{"job_id": "a", "submit_s": 0, "devices": 1}', "line 2: total_steps: missing"),
        (
            '{"job_id": "a", "submit_s": "x", "devices": 1, "total_steps": 5}',
            "line 2: submit_s: wrong type str",
        ),
        (
            '{"job_id": "a", "submit_s": 0, "devices": 1, "total_steps": 5, "gpus": 1}',
            "line 2: gpus: unknown field",
        ),
        (
            '{"job_id": "a", "submit_s": 0, "devices": 1, "total_steps": 5, "throughput": {"v100": 0}}',
            "line 2: throughput",
        ),
        ("not json", "line 2: (line): not JSON"),
    ],
)
def test_a_bad_line_is_refused_naming_the_line_and_field(line: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse(["# a comment", line])
    assert message in str(caught.value)


def test_duplicate_job_ids_are_refused() -> None:
    line = '{"job_id": "a", "submit_s": 0, "devices": 1, "total_steps": 5}'
    with pytest.raises(TraceError, match="line 2: job_id: duplicate 'a'"):
        parse([line, line])


def test_generator_follows_the_philly_shape_and_its_seed() -> None:
    trace = philly_like(2000, capacity=64, seed=5)
    assert trace == philly_like(2000, capacity=64, seed=5) != philly_like(2000, capacity=64, seed=6)
    sizes = Counter(j.devices for j in trace)
    assert set(sizes) == {1, 2, 4, 8}
    assert 0.65 < sizes[1] / len(trace) < 0.75 and 0.02 < sizes[8] / len(trace) < 0.08
    speedups = [j.throughput["new"] / j.throughput["old"] for j in trace]
    assert min(speedups) >= 1.2 - 1e-9 and max(speedups) <= 3.0 + 1e-9
    assert {j.kind for j in trace} == set(KINDS)
    run_s = sorted(j.total_steps / j.throughput["old"] for j in trace)
    median, p99 = run_s[len(run_s) // 2], run_s[int(len(run_s) * 0.99)]
    assert p99 > 20 * median  # heavy tail
    gaps = [b.submit_s - a.submit_s for a, b in zip(trace, trace[1:], strict=False)]
    assert all(g >= 0 for g in gaps)


def test_the_sample_trace_in_the_repository_loads() -> None:
    trace = load(SAMPLE)
    assert len(trace) >= 20 and all(j.throughput for j in trace)
