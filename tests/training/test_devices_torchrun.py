"""The job's ``[train] device`` under real torchrun (2 processes, the digits CNN): ``cuda`` on a
machine without CUDA is refused in one line naming the field; ``auto`` says where each rank runs,
and a job checkpointed on ``cpu`` resumes under ``auto`` (a GPU where there is one) to the
parameters of uninterrupted training."""

from __future__ import annotations

import pytest
import torch

from cloud.jobs.torchrun import launch_job, read_progress
from tests.harness.pipeline_reference import (
    max_relative_difference,
    merged_checkpoint,
    reference_grad_accumulation,
)
from tests.harness.torchrun import run_job, write_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: cuda is not refused")
def test_cuda_job_without_a_gpu_fails_with_one_line_naming_the_field(tmp_path):
    job = write_job(tmp_path, schedule="1f1b-flush", microbatches=2, batch_size=16, steps=2)
    job.write_text(job.read_text().replace("seed = 0", 'seed = 0\ndevice = "cuda"'))
    proc = launch_job(job, 2, tmp_path)
    assert proc.wait(120) != 0
    log = (tmp_path / "torchrun.log").read_text()
    refusals = [line for line in log.splitlines() if line.startswith("[train] invalid job:")]
    # one per rank that got that far: torchrun stops the other rank once the first has exited, and
    # on a loaded box that rank may still be importing torch
    assert 1 <= len(refusals) <= 2 and len(set(refusals)) == 1, log[-3000:]
    assert refusals[0].startswith('[train] invalid job: train.device: "cuda" but ')
    events = read_progress(tmp_path / "progress.jsonl")
    assert [(e["event"], e["code"]) for e in events] == [("error", 2)]


def test_job_checkpointed_on_cpu_resumes_under_auto(tmp_path):
    batch, micro, steps = 16, 2, 8
    stages = [(0, 4), (5, 8)]
    job = write_job(
        tmp_path,
        schedule="1f1b-flush",
        microbatches=micro,
        batch_size=batch,
        steps=steps // 2,
        stages=stages,
        checkpoint_every=2,
        extra_train='device = "cpu"',
    )
    first = run_job(job, 2)
    assert first[-1]["event"] == "done" and first[-1]["step"] == steps // 2
    job.write_text(
        job.read_text()
        .replace(f"max_steps = {steps // 2}", f"max_steps = {steps}")
        .replace('device = "cpu"', 'device = "auto"')
    )
    events = run_job(job, 2)
    assert [e["from_step"] for e in events if e["event"] == "resume"] == [steps // 2]
    assert events[-1]["event"] == "done" and events[-1]["step"] == steps
    where = "cuda" if torch.cuda.is_available() else "cpu"
    log = (tmp_path / "torchrun.log").read_text()
    for rank in (0, 1):
        assert f"[train] rank {rank}: device {where}" in log
    got = merged_checkpoint(tmp_path / "ckpt", len(stages), steps)
    want = reference_grad_accumulation(steps, batch, micro).state_dict()
    # As the other 6-to-8-step equivalence tests on the CPU; a GPU's kernels round differently.
    assert max_relative_difference(got, want) <= (1e-5 if where == "cpu" else 1e-3)
