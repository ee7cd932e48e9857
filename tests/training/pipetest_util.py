"""Helpers for the torchrun tests: job files, launching, the single-process reference."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from cloud.jobs.torchrun import launch_job, read_progress
from cloud.training import checkpoint
from cloud.training.run import DigitsStream
from cloud.training.schedules import build_schedule
from models.digits import digits_cnn


def write_job(
    tmp: Path,
    *,
    schedule: str,
    microbatches: int,
    batch_size: int,
    steps: int = 0,
    epochs: int = 1,
    stages: list[tuple[int, int]] | None = None,
    replicas: list[int] | None = None,
    checkpoint_every: int = 0,
    lr: float = 0.05,
    extra_train: str = "",
) -> Path:
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
        from cloud.jobs.torchrun import cancel_job

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


def reference_grad_accumulation(
    steps: int, batch_size: int, microbatches: int, lr: float = 0.05, seed: int = 0
) -> nn.Sequential:
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


def reference_pipedream(
    steps: int,
    batch_size: int,
    microbatches: int,
    stages: list[tuple[int, int]],
    *,
    vertical_sync: bool = False,
    lr: float = 0.05,
    seed: int = 0,
) -> nn.Sequential:
    """Single process: PipeDream's update rule as the 1F1B-stash schedule orders it. Microbatch b
    runs forward and backward on stage s's weights after the updates s applied before its F (with
    vertical sync: the updates stage 0 had applied); every backward updates its stage once."""
    torch.manual_seed(seed)
    model = digits_cnn()
    stream = DigitsStream(seed, batch_size)
    modules = [model[first : last + 1] for first, last in stages]
    optimizers = [
        torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) if list(m.parameters()) else None
        for m in modules
    ]
    schedule = build_schedule("1f1b-stash", [1] * len(stages), microbatches, vertical_sync=vertical_sync)
    uses = [
        schedule.stash_versions() if vertical_sync else schedule.updates_before_forward(s)
        for s in range(len(stages))
    ]
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        x, y = stream.minibatch(step)
        versions = [[_detached(m)] for m in modules]  # versions[s][k]: stage s after k updates
        for b, (xb, yb) in enumerate(zip(x.chunk(microbatches), y.chunk(microbatches), strict=True)):
            weights = [versions[s][uses[s][b]] for s in range(len(stages))]
            h = xb
            for module, params in zip(modules, weights, strict=True):
                h = functional_call(module, params, (h,))
            flat = [p for params in weights for p in params.values()]
            grads = iter(torch.autograd.grad(loss_fn(h, yb), flat))
            for module, optimizer, stage_versions in zip(modules, optimizers, versions, strict=True):
                for p in module.parameters():
                    p.grad = next(grads)
                if optimizer is not None:  # a stage without parameters (pool + flatten)
                    optimizer.step()
                stage_versions.append(_detached(module))
    return model


def _detached(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone().requires_grad_(True) for name, p in module.named_parameters()}


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in a)
