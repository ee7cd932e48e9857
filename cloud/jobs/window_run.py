"""Entry point of a sensor-window job: ``torchrun ... -m cloud.jobs.window_run --job job.toml``.

The anomaly model is an autoencoder (MSE against its own input), which ``cloud.training.run``
cannot train yet (its data is digits only and its loss cross-entropy). This module is the
separate, minimal path: the same trainer parts (even plan, schedules, ``StageExecutor``,
per-stage checkpoints, ``ProgressLog`` lines) over ``dataset.pt`` in the job's folder, which
``cloud.jobs.datasets`` built from uploaded telemetry. It goes away once run.py takes a dataset
and a loss from the job file (see docs/dashboard.md, "Training on uploaded data").

Invariant (as run.py's): the data order depends only on (seed, step), and a step's checkpoint is
announced only after every stage wrote it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from cloud.training import checkpoint
from cloud.training.job import JobError, build_model, load_job
from cloud.training.run import ProgressLog, choose_plan
from cloud.training.runtime import StageExecutor
from cloud.training.schedules import build_schedule


def train(job_path: Path) -> int:
    job = load_job(job_path)
    rank, world, t = dist.get_rank(), dist.get_world_size(), job.train
    progress = ProgressLog(job.progress.file, rank == 0)
    torch.manual_seed(t.seed)
    model = build_model(job.model.name)
    x = torch.load(job_path.parent / "dataset.pt", weights_only=True)["x"]
    steps_per_epoch = max(1, len(x) // t.batch_size)
    micro = t.batch_size // t.microbatches
    plan = choose_plan(job, model, x[:micro], world)
    schedule = build_schedule(t.schedule, plan.replicas, t.microbatches, vertical_sync=t.vertical_sync)
    topology = schedule.topology
    groups = [dist.new_group(topology.stage_ranks(s)) for s in range(topology.n_stages)]
    stage, replica = topology.stage_replica_of(rank)
    span = plan.stages[stage]
    module = model[span.first:span.last + 1]
    has_params = any(True for _ in module.parameters())
    optimizer = torch.optim.SGD(module.parameters(), lr=t.lr, momentum=t.momentum) if has_params else None
    executor = StageExecutor(module, topology, rank, optimizer=optimizer, loss_fn=nn.MSELoss(),
                             replica_group=groups[stage], timeout_s=t.comm_timeout_s)
    total = steps_per_epoch * t.epochs
    total = min(total, t.max_steps) if t.max_steps else total
    progress.write("start", plan=plan.text(), schedule=t.schedule, world=world, total_steps=total,
                   dataset="sensor_windows", samples=len(x))
    last_ranks = set(topology.stage_ranks(topology.n_stages - 1))
    step, started = 0, time.perf_counter()
    while step < total:
        epoch, index = divmod(step, steps_per_epoch)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(t.seed + epoch))
        batch = x[order[index * t.batch_size:(index + 1) * t.batch_size]]
        if len(batch) < t.batch_size:  # fewer windows than one minibatch: repeat them
            batch = batch.repeat(math.ceil(t.batch_size / len(batch)), 1)[:t.batch_size]
        chunks = batch.chunk(t.microbatches)
        mine = [b for b in range(t.microbatches) if topology.rank_for(stage, b) == rank]
        stats = executor.run_step(schedule, {b: chunks[b] for b in mine} if stage == 0 else None,
                                  {b: chunks[b] for b in mine} if rank in last_ranks else None)
        step += 1
        mine_stats = torch.tensor([stats.busy_s, stats.idle_s, stats.loss_sum, stats.n_losses],
                                  dtype=torch.float64)
        table = [torch.zeros_like(mine_stats) for _ in range(world)]
        dist.all_gather(table, mine_stats)
        table = torch.stack(table)
        loss = float(table[:, 2].sum() / table[:, 3].sum())
        elapsed, started = time.perf_counter() - started, time.perf_counter()
        per_stage = [{"stage": s, "busy_s": round(float(table[topology.stage_ranks(s), 0].sum()), 4),
                      "idle_s": round(float(table[topology.stage_ranks(s), 1].sum()), 4)}
                     for s in range(topology.n_stages)]
        progress.write("step", step=step, epoch=step / steps_per_epoch, loss=loss,
                       samples_per_s=t.batch_size / elapsed, stages=per_stage)
        if step == total or (job.checkpoint.every and step % job.checkpoint.every == 0):
            if replica == 0:
                checkpoint.save_stage(job.checkpoint.dir, stage, step, {
                    "step": step, "model": module.state_dict(),
                    "optimizer": optimizer.state_dict() if optimizer else None}, keep=job.checkpoint.keep)
            dist.barrier()
            progress.write("checkpoint", step=step)
    progress.write("done", step=step)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="sensor-window autoencoder job (run under torchrun)")
    parser.add_argument("--job", required=True, type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        return train(args.job.resolve())
    except (JobError, ValueError, OSError) as exc:
        ProgressLog(str(args.job.resolve().parent / "progress.jsonl"), dist.get_rank() == 0).write(
            "error", code=2, message=str(exc))
        print(f"[window_run] rank {os.environ.get('RANK')}: {exc}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
