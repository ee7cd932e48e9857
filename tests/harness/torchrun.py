"""torchrun for tests: pipeline job files run through ``cloud.jobs.torchrun`` (``write_job``,
``run_job``, ``wait_for_event``), and test worker modules run under torchrun (``run_workers``),
with the worker side of that (``init_worker``, ``write_result``).

A worker module (e.g. tests/sync/worker_policy.py) is started as ``torchrun -m tests.sync.<worker>
<out>``; each rank writes ``<out>/rank<r>.json`` and the test reads them after torchrun exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from cloud.jobs.torchrun import cancel_job, launch_job, read_progress
from tests.harness.poll import wait_until
from tests.harness.processes import REPO, ProcessExited, free_port, repo_env

# --- pipeline jobs (cloud.training.run under torchrun) ----------------------------------------------


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
    sections: str = "",
    log_every: int = 5,
) -> Path:
    """``<tmp>/job.toml`` for the digits model; checkpoints in ckpt/, progress in progress.jsonl;
    ``sections``: more TOML at the end (e.g. ``[sync]``)."""
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
log_every = {log_every}
{sections}
""")
    return job


def run_job(job: Path, nproc: int, timeout_s: float = 120.0) -> list[dict]:
    """Run the job to the end in its own directory (must exit 0); its progress events."""
    proc = launch_job(job, nproc, job.parent)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        cancel_job(proc)
        raise
    log = (job.parent / "torchrun.log").read_text()
    assert code == 0, f"torchrun exited {code}:\n{log[-4000:]}"
    return read_progress(job.parent / "progress.jsonl")


def wait_for_event(path: Path, event: str, timeout_s: float, proc: subprocess.Popen) -> dict:
    """The first ``event`` record in the progress file ``path`` of the running job ``proc``."""

    def first() -> dict | None:
        found = next((record for record in read_progress(path) if record["event"] == event), None)
        if found is None and proc.poll() is not None:
            raise ProcessExited(f"job exited {proc.returncode} before a {event} event")
        return found

    found = wait_until(first, timeout_s, f"a {event} event in {path}")
    assert found is not None  # wait_until returns only a value its check (truthiness) passed
    return found


# --- test workers under torchrun ---------------------------------------------------------------------


def run_workers(module: str, out: Path, nproc: int = 2, timeout_s: float = 150.0) -> list[dict]:
    """``torchrun -m module out`` with ``nproc`` ranks on this machine (gloo, one thread each);
    returns each rank's result (``write_result``), rank 0 first."""
    out.mkdir(parents=True, exist_ok=True)
    command = [
        str(Path(sys.executable).with_name("torchrun")),
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "-m",
        module,
        str(out),
    ]
    env = repo_env(OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=env, cwd=REPO, timeout=timeout_s, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def init_worker() -> tuple[int, int]:
    """In a worker: one thread, the gloo process group; (rank, world size)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def write_result(result: dict) -> None:
    """In a worker: write ``<out>/rank<r>.json`` (``out`` is the worker's first argument), then leave
    the process group."""
    out = Path(sys.argv[1])
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    os.environ.pop("MASTER_PORT", None)
