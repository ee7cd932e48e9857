"""cloudd's scheduler on real torchrun jobs (2 processes each, one node with 2 devices, so one job
runs at a time): three digits jobs submitted at once, the long one first.

Under LAS the long job is preempted when the short ones arrive (they have attained less service),
waits as ``preempted`` in the queue, and resumes from the checkpoint its trainer wrote when the
lease was revoked; both short jobs end before it. Under FIFO the same submission runs in order,
never preempted. Every job ends with the parameters of an uninterrupted run of its steps: the short
ones those of single-process training, the long one those of its job file run by torchrun without
a lease revoked.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from cloud.jobs.torchrun import read_progress
from tests.harness.cloud_http import call
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import Cloudd, start_cloudd
from tests.harness.pipeline_reference import (
    max_relative_difference,
    merged_checkpoint,
    reference_grad_accumulation,
)
from tests.harness.torchrun import run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

BATCH, MICRO, LR = 32, 2, 0.05
# in submission order; the long one trains for seconds (digits steps take ~10-20 ms here), longer
# than the lease term below, so LAS preempts it once the short ones arrive
STEPS = {"long": 1000, "short-a": 10, "short-b": 10}
MIN_RUN_S = "2"  # --scheduler-min-run: seconds a run trains before a preemption is carried out


def _spec(steps: int) -> dict:
    return {
        "model": "digits_cnn",
        "nproc": 2,
        "stages": 2,
        "batch_size": BATCH,
        "microbatches": MICRO,
        "lr": LR,
        "epochs": -(-steps // 44),  # digits: 1437 training rows, 44 steps of 32 an epoch
        "max_steps": steps,
    }


def _run_three(tmp_path, policy: str) -> tuple[Cloudd, dict[str, str], list[dict]]:
    """Submit the three jobs at once and wait for all of them; (cloudd, name -> job id, every
    /v1/jobs listing seen while they ran)."""
    server = start_cloudd(
        tmp_path / policy,
        extra_args=("--nodes", "local:2:cpu", "--scheduler-policy", policy, "--scheduler-min-run", MIN_RUN_S),
    )
    ids = {}
    for name, steps in STEPS.items():
        status, job = call(f"{server.url}/v1/jobs", OP, "POST", _spec(steps))
        assert status == 201, job
        ids[name] = job["id"]
    seen = []
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        listing = call(f"{server.url}/v1/jobs", OP)[1]
        seen.append(listing)
        if all(j["state"] in ("succeeded", "failed", "cancelled") for j in listing["jobs"]):
            break
        time.sleep(0.5)
    return server, ids, seen


def _checkpoints(server: Cloudd, job_id: str) -> Path:
    return server.data_dir / "jobs" / job_id / "checkpoints"


def _check_parameters(server: Cloudd, job_id: str, steps: int) -> None:
    """A short job against single-process training (the tolerance of test_preemption.py)."""
    got = merged_checkpoint(_checkpoints(server, job_id), 2, steps)
    want = reference_grad_accumulation(steps, BATCH, MICRO, lr=LR).state_dict()
    assert max_relative_difference(got, want) <= 1e-4, job_id


def _check_equals_uninterrupted(server: Cloudd, job_id: str, steps: int, tmp_path: Path) -> None:
    """The long job against the same job file run by torchrun without interruption."""
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    shutil.copy(server.data_dir / "jobs" / job_id / "job.toml", reference / "job.toml")
    (reference / "lease").touch()  # held for good
    events = run_job(reference / "job.toml", 2, timeout_s=600)
    assert not any(e["event"] in ("resume", "preempted") for e in events)
    got = merged_checkpoint(_checkpoints(server, job_id), 2, steps)
    want = merged_checkpoint(reference / "checkpoints", 2, steps)
    # the same kernels on the same plan: a resumed run equals the uninterrupted one to rounding
    assert max_relative_difference(got, want) <= 1e-6


def _final(server: Cloudd, ids: dict[str, str]) -> dict[str, dict]:
    jobs = {}
    for name, job_id in ids.items():
        status, job = call(f"{server.url}/v1/jobs/{job_id}", OP)
        assert status == 200 and job["state"] == "succeeded", (job, server.log_text()[-3000:])
        jobs[name] = job
    return jobs


def _progress(server: Cloudd, job_id: str) -> list[dict]:
    return read_progress(server.data_dir / "jobs" / job_id / "progress.jsonl")


def test_las_preempts_the_long_job_for_the_short_ones_and_resumes_it(tmp_path):
    server, ids, seen = _run_three(tmp_path, "las")
    try:
        jobs = _final(server, ids)
        long = jobs["long"]
        assert long["schedule"]["preemptions"] >= 1
        events = _progress(server, ids["long"])
        stops = [e["step"] for e in events if e["event"] == "preempted"]
        resumes = [e["from_step"] for e in events if e["event"] == "resume"]
        assert stops and resumes[: len(stops)] == stops  # each run resumed where the last one stopped
        # both short jobs ended before the long one, which waited as preempted in the queue meanwhile
        assert all(jobs[s]["finished_ts"] < long["finished_ts"] for s in ("short-a", "short-b"))
        waiting = [
            j["schedule"]
            for listing in seen
            for j in listing["jobs"]
            if j["id"] == ids["long"] and j["state"] == "preempted"
        ]
        assert waiting and all(w["queue_position"] is not None for w in waiting)
        assert any(w["decision"] and w["decision"]["decision"] == "preempt" for w in waiting)
        assert long["schedule"]["attained_service_s"] > 0 and long["schedule"]["throughput"]["cpu"] > 0
        for name in ("short-a", "short-b"):
            _check_parameters(server, ids[name], STEPS[name])
        _check_equals_uninterrupted(server, ids["long"], STEPS["long"], tmp_path)
    finally:
        server.stop()


def test_fifo_runs_the_same_submission_in_order_without_preemption(tmp_path):
    server, ids, _ = _run_three(tmp_path, "fifo")
    try:
        jobs = _final(server, ids)
        order = [jobs[name] for name in STEPS]
        for earlier, later in zip(order, order[1:], strict=False):
            assert earlier["finished_ts"] <= later["started_ts"]
        for name, job_id in ids.items():
            assert jobs[name]["schedule"]["preemptions"] == 0
            events = _progress(server, job_id)
            assert not any(e["event"] in ("preempted", "resume") for e in events)
            assert events[-1] == {**events[-1], "event": "done", "step": STEPS[name]}
        for name in ("short-a", "short-b"):
            _check_parameters(server, ids[name], STEPS[name])
    finally:
        server.stop()
