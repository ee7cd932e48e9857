"""Helpers for the torchrun tests: job files, launching, the single-process reference."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import torch
from torch import nn

from cloud.training import checkpoint
from cloud.training.jobs import launch_job, read_progress
from cloud.training.run import DigitsStream
from models.digits import digits_cnn


def write_job(tmp: Path, *, schedule: str, microbatches: int, batch_size: int, steps: int = 0,
              epochs: int = 1,
              stages: list[tuple[int, int]] | None = None, replicas: list[int] | None = None,
              checkpoint_every: int = 0, lr: float = 0.05, extra_train: str = "") -> Path:
    partition = 'mode = "even"'
    if stages:
        replicas = replicas or [1] * len(stages)
        partition = f'mode = "explicit"\nstages = {[list(s) for s in stages]}\nreplicas = {replicas}'
    job = tmp / "job.toml"
    job.write_text(f"""
[train]
schedule = "{schedule}"
microbatches = {microbatches}
batch_size = {batch_size}
epochs = {epochs}
max_steps = {steps}
lr = {lr}
seed = 0
{extra_train}
[partition]
{partition}
[checkpoint]
dir = "ckpt"
every = {checkpoint_every}
[progress]
file = "progress.jsonl"
log_every = 5
""")
    return job


def run_job(job: Path, nproc: int, timeout: float = 120.0) -> list[dict]:
    proc = launch_job(job, nproc, job.parent)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        from cloud.training.jobs import cancel_job
        cancel_job(proc)
        raise
    log = (job.parent / "torchrun.log").read_text()
    assert code == 0, f"torchrun exited {code}:\n{log[-4000:]}"
    return read_progress(job.parent / "progress.jsonl")


def wait_for_event(path: Path, event: str, timeout: float, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in read_progress(path):
            if record["event"] == event:
                return record
        assert proc.poll() is None, f"job exited {proc.returncode} before {event}"
        time.sleep(0.05)
    raise TimeoutError(f"no {event} event in {path} after {timeout}s")


def merged_checkpoint(ckpt: Path, n_stages: int, step: int) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for stage in range(n_stages):
        merged.update(checkpoint.load_stage(ckpt, stage, step)["model"])
    return merged


def reference_grad_accumulation(steps: int, batch_size: int, microbatches: int, lr: float = 0.05,
                                seed: int = 0) -> nn.Sequential:
    """Single process: same init, same data order, gradient accumulation over the microbatches."""
    torch.manual_seed(seed)
    model = digits_cnn()
    stream = DigitsStream(seed, batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        x, y = stream.minibatch(step)
        optimizer.zero_grad()
        for xb, yb in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
            (loss_fn(model(xb), yb) / microbatches).backward()
        optimizer.step()
    return model


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in a)
