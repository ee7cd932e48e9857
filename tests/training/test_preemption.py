"""Under real torchrun (2 processes, gloo): a job whose lease is revoked stops at a step both ranks
agree on, writes a complete checkpoint of it, logs ``preempted`` and every worker exits with
EXIT_PREEMPTED; step lines carry steps/s; a rerun resumes from that checkpoint and ends with the
parameters of an uninterrupted run of the same steps."""

from __future__ import annotations

import re

import pytest

from cloud.jobs.torchrun import cancel_job, launch_job, read_progress
from cloud.training import checkpoint
from cloud.training.run import EXIT_PREEMPTED
from tests.harness.pipeline_reference import (
    max_relative_difference,
    merged_checkpoint,
    reference_grad_accumulation,
)
from tests.harness.poll import wait_until
from tests.harness.torchrun import run_job, write_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

LEASE = '[preemption]\nlease = "lease"\n'


def _worker_exit_codes(log: str) -> list[int]:
    """The exit codes torchrun's failure report names, one per failed worker."""
    return [int(code) for code in re.findall(r"exitcode\s*:\s*(-?\d+)", log)]


def test_revoked_lease_preempts_and_the_rerun_equals_an_uninterrupted_run(tmp_path):
    batch, micro, steps = 16, 2, 40
    pipeline = {"schedule": "gpipe", "stages": [(0, 3), (4, 8)]}  # gpipe: gradient accumulation too
    job = write_job(
        tmp_path,
        microbatches=micro,
        batch_size=batch,
        steps=steps,
        epochs=4,
        log_every=1,
        sections=LEASE,
        **pipeline,
    )
    lease = tmp_path / "lease"
    lease.touch()
    progress = tmp_path / "progress.jsonl"
    proc = launch_job(job, 2, tmp_path)
    try:
        wait_until(
            lambda: any(e["event"] == "step" and e["step"] >= 3 for e in read_progress(progress)),
            240,
            "step 3 of the job",
        )
        lease.unlink()  # revoke
        code = proc.wait(120)
    finally:
        cancel_job(proc)
    log = (tmp_path / "torchrun.log").read_text()
    events = read_progress(progress)
    preempted = [e for e in events if e["event"] == "preempted"]
    assert code != 0 and len(preempted) == 1, log[-3000:]
    stopped = preempted[0]["step"]
    assert 3 <= stopped < steps
    assert not any(e["event"] == "done" for e in events)
    assert checkpoint.latest_complete_step(tmp_path / "ckpt", 2) == stopped
    # every worker that torchrun reports on left with EXIT_PREEMPTED (none crashed or was killed)
    codes = _worker_exit_codes(log)
    assert codes and set(codes) == {EXIT_PREEMPTED}, log[-3000:]
    # no step past the agreed one was trained by anyone: the progress log ends at it
    assert max(e["step"] for e in events if e["event"] == "step") == stopped
    # each step line carries the measured rate cloudd keeps per node generation
    assert all(e["steps_per_s"] > 0 for e in events if e["event"] == "step")

    lease.touch()  # granted again: the rerun resumes
    events = run_job(job, 2, timeout_s=240)
    resumed = [e for e in events if e["event"] == "resume"]
    assert resumed and resumed[-1]["from_step"] == stopped
    assert events[-1] == {**events[-1], "event": "done", "step": steps}
    got = merged_checkpoint(tmp_path / "ckpt", 2, steps)
    want = reference_grad_accumulation(steps, batch, micro).state_dict()
    # the tolerance of test_killed_job_resumes_from_last_complete_checkpoint (a wrong resume: ~1e-1)
    assert max_relative_difference(got, want) <= 1e-4
