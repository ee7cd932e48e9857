"""Entry point of a training job: ``torchrun ... -m cloud.training.run --job job.toml``.

Every rank loads the job and its data (scikit-learn's digits, or a tensor file with the loss the
job names: cross-entropy, MSE, or reconstruction MSE with y = x), checks one forward of the model
against the loss, builds the same model from the same seed, agrees on one plan (rank 0
profiles and partitions, then broadcasts), builds its stage, resumes from the last complete
checkpoint, and runs steps with ``StageExecutor``. Rank 0 appends JSON lines to the progress
file: ``start`` (plan, dataset, loss, rows), ``resume``, ``step`` (loss, samples/s, per-stage
busy/idle seconds; with compression on, also ``compression``: activation and wire bytes,
formats), ``compression_decision`` (one per adaptive format change), ``eval`` (classification
with held-out rows only), ``checkpoint`` (written only once every stage's file is on disk),
``done`` or ``error``.

Exit codes (of each worker; torchrun itself exits 1 when any worker fails):
0 done, 2 invalid job file (or a data file that does not fit it), 3 plan does not fit the world
size, 4 training diverged (loss not finite), 5 checkpoint belongs to a different plan or schedule.

Invariant: the data order depends only on (seed, step), so a resumed job trains on exactly the
minibatches an uninterrupted one would have.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from cloud.training import checkpoint, comm
from cloud.training.compression.stage import StageCompression
from cloud.training.compression.wire_codec import register_wire_codecs
from cloud.training.executor import StageExecutor
from cloud.training.jobfile import DataSection, JobConfig, JobError, build_model, load_job
from cloud.training.partition import Plan, StagePlan, even_plan, partition
from cloud.training.profiler import cached_profile
from cloud.training.schedules import Topology, build_schedule, schedule_name

EXIT_OK, EXIT_BAD_JOB, EXIT_PLAN, EXIT_DIVERGED, EXIT_CHECKPOINT = 0, 2, 3, 4, 5


class JobFailed(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class ProgressLog:
    """Rank 0's JSON-lines progress file (appended, flushed per line) plus a human line on stdout."""

    def __init__(self, path: str, enabled: bool):
        self.path, self.enabled = Path(path), enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields) -> None:
        if not self.enabled:
            return
        record = {"event": event, "time": round(time.time(), 3), **fields}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        human = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items() if k != "stages"
        )
        print(f"[train] {event} {human}", flush=True)


class MinibatchStream:
    """Minibatches of a training set in the order of ``models.digits.train_single_process`` (one
    randperm per epoch from one generator seeded with the job seed); a trailing partial minibatch is
    dropped. ``test_x``/``test_y`` are the held-out rows (possibly none)."""

    def __init__(
        self,
        train_x: torch.Tensor,
        train_y: torch.Tensor,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        seed: int,
        batch_size: int,
    ):
        if len(train_x) < batch_size:
            raise JobError(f"train.batch_size: {batch_size} > the {len(train_x)} training rows of the data")
        self.train_x, self.train_y, self.test_x, self.test_y = train_x, train_y, test_x, test_y
        self.seed, self.batch_size = seed, batch_size
        self.steps_per_epoch = len(train_y) // batch_size
        self._order: tuple[int, torch.Tensor] | None = None  # (epoch, its row order), the last one used

    def _order_of(self, epoch: int) -> torch.Tensor:
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch + 1):
                order = torch.randperm(len(self.train_y), generator=generator)
            self._order = (epoch, order)
        return self._order[1]

    def minibatch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = divmod(step, self.steps_per_epoch)
        rows = self._order_of(epoch)[index * self.batch_size : (index + 1) * self.batch_size]
        return self.train_x[rows], self.train_y[rows]


class DigitsStream(MinibatchStream):
    def __init__(self, seed: int, batch_size: int):
        from models.digits import load_digits_split

        split = load_digits_split(seed)
        super().__init__(split.train_x, split.train_y, split.test_x, split.test_y, seed, batch_size)


def tensor_file_stream(data: DataSection, seed: int, batch_size: int) -> MinibatchStream:
    """The job's tensor file, checked against its loss, split by a generator seeded with ``seed``."""
    try:
        tensors = torch.load(data.path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise JobError(f"data.path: cannot load {data.path}: {exc}") from exc
    x = tensors.get("x") if isinstance(tensors, dict) else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or not len(x):
        raise JobError(f"data.path: {data.path} must hold {{'x': float tensor (N, ...), 'y': ...}}")
    if data.loss == "reconstruction":
        y = x
    else:
        y = tensors.get("y")
        if not isinstance(y, torch.Tensor) or len(y) != len(x):
            raise JobError(f"data.path: loss {data.loss} needs 'y' with one row per row of x ({len(x)})")
        if data.loss == "cross_entropy" and (y.is_floating_point() or y.dim() != 1):
            raise JobError("data.loss: cross_entropy needs y as integer class indices of shape (N,)")
        if data.loss == "mse" and not y.is_floating_point():
            raise JobError("data.loss: mse needs y as float targets")
        y = y.long() if data.loss == "cross_entropy" else y
    test, train = split_rows(len(x), data.test_fraction, seed)
    return MinibatchStream(x[train], y[train], x[test], y[test], seed, batch_size)


def split_rows(rows: int, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out row indices, training row indices) of a tensor file: the quality gate
    (cloud/rollout/gate.py) evaluates on exactly the rows a job held out."""
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    n_test = int(rows * test_fraction)
    return order[:n_test], order[n_test:]


def loss_function(data: DataSection) -> nn.Module:
    return nn.CrossEntropyLoss() if data.loss == "cross_entropy" else nn.MSELoss()


def check_loss_fits(
    model: nn.Sequential, loss_fn: nn.Module, data: DataSection, x: torch.Tensor, y: torch.Tensor
) -> None:
    """One forward of the whole model on a few rows (eval mode, no grad: no state changes), so that a
    model that does not take x, or whose output does not fit y, fails as a bad job naming the shapes."""
    model.eval()
    try:
        with torch.no_grad():
            output = model(x)
    except RuntimeError as exc:
        raise JobError(f"model.name: the model does not take x of shape {tuple(x.shape)}: {exc}") from exc
    finally:
        model.train()
    problem = ""
    if data.loss != "cross_entropy" and output.shape != y.shape:
        problem = "shapes differ"  # MSELoss would broadcast them and train on nonsense
    else:
        try:
            loss_fn(output, y)
        except (RuntimeError, IndexError) as exc:
            problem = str(exc)
    if problem:
        raise JobError(
            f"data.loss: {data.loss} of the model's output {tuple(output.shape)} against y "
            f"{tuple(y.shape)}: {problem}"
        )


def choose_plan(job: JobConfig, model: nn.Sequential, sample: torch.Tensor, world: int) -> Plan:
    """Every rank calls this; rank 0 decides and broadcasts, so all ranks hold the same plan."""
    p = job.partition
    bandwidth = p.bandwidth
    if p.mode == "auto" and bandwidth == 0:
        bandwidth = comm.measure_bandwidth()  # collective: all ranks take part
    text = [""]  # rank 0's plan, or its error; the others receive it
    if dist.get_rank() == 0:
        try:
            if p.mode == "explicit":
                replicas = p.replicas or [1] * len(p.stages)
                spans = zip(p.stages, replicas, strict=True)
                plan = Plan(tuple(StagePlan(f, last, r) for (f, last), r in spans), math.nan)
            elif p.mode == "even":
                plan = even_plan(len(model), world)
            else:
                costs = cached_profile(model, sample, p.profile_cache, threads=job.train.threads)
                plan = partition(
                    costs,
                    world,
                    bandwidth,
                    compression_ratio=p.compression_ratio,
                    straight=p.straight or job.train.schedule == "1f1b-stash",
                )
            text[0] = plan.text()
        except ValueError as exc:
            text[0] = f"error: {exc}"
    dist.broadcast_object_list(text, src=0)
    if text[0].startswith("error:"):
        raise JobFailed(EXIT_PLAN, text[0])
    plan = Plan.parse(text[0])
    covered = [i for s in plan.stages for i in range(s.first, s.last + 1)]
    if plan.workers != world or covered != list(range(len(model))):
        raise JobFailed(EXIT_PLAN, f"plan {text[0]} does not cover {len(model)} layers on {world} ranks")
    return plan


def _gather_stats(values: list[float]) -> torch.Tensor:
    mine = torch.tensor(values, dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return torch.stack(everyone)


def train(job: JobConfig) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    t = job.train
    register_wire_codecs()  # every rank: a BFP payload names its codec in the message header
    progress = ProgressLog(job.progress.file, rank == 0)
    torch.manual_seed(t.seed)
    model = build_model(job.model.name)
    data = job.data
    stream = (
        DigitsStream(t.seed, t.batch_size)
        if data.dataset == "digits"
        else tensor_file_stream(data, t.seed, t.batch_size)
    )
    loss_fn = loss_function(data)
    micro = t.batch_size // t.microbatches
    sample_x, sample_y = stream.minibatch(0)
    check_loss_fits(model, loss_fn, data, sample_x[:micro], sample_y[:micro])
    plan = choose_plan(job, model, sample_x[:micro], world)
    schedule = build_schedule(
        schedule_name(t.schedule), plan.replicas, t.microbatches, vertical_sync=t.vertical_sync
    )
    topology = schedule.topology
    groups = [dist.new_group(topology.stage_ranks(s)) for s in range(topology.n_stages)]
    stage, replica = topology.stage_replica_of(rank)
    span = plan.stages[stage]
    module = model[span.first : span.last + 1]  # keeps the global layer indices in state_dict keys
    has_params = any(True for _ in module.parameters())
    optimizer = torch.optim.SGD(module.parameters(), lr=t.lr, momentum=t.momentum) if has_params else None
    c = job.compression
    # Gist may replace the module by a GraphModule sharing its parameters: checkpoints keep `module`.
    compression = StageCompression(
        module, activations=c.activations, fmt=c.format, gist=c.gist, window=c.window, min_numel=c.min_numel
    )
    reports_compression = c.activations != "none" or t.wire_codec != "fp32"
    executor = StageExecutor(
        compression.module,
        topology,
        rank,
        optimizer=optimizer,
        loss_fn=loss_fn,
        codec=comm.codec_by_name(t.wire_codec),
        replica_group=groups[stage],
        timeout_s=t.comm_timeout_s,
        activation_context=compression.context,
    )
    identity = {
        "plan": [[s.first, s.last, s.replicas] for s in plan.stages],
        "schedule": t.schedule,
        "microbatches": t.microbatches,
        "batch_size": t.batch_size,
        "seed": t.seed,
        "dataset": data.dataset,
        "loss": data.loss,
    }
    total = stream.steps_per_epoch * t.epochs
    total = min(total, t.max_steps) if t.max_steps else total
    progress.write(
        "start",
        plan=plan.text(),
        schedule=t.schedule,
        world=world,
        total_steps=total,
        dataset=data.dataset,
        loss=data.loss,
        train_rows=len(stream.train_y),
        test_rows=len(stream.test_y),
    )

    step = 0
    resume = checkpoint.latest_complete_step(job.checkpoint.dir, topology.n_stages)
    if resume is not None:
        state = checkpoint.load_stage(job.checkpoint.dir, stage, resume)
        if state["identity"] != identity:
            raise JobFailed(EXIT_CHECKPOINT, f"checkpoint step {resume} is of {state['identity']}")
        module.load_state_dict(state["model"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        step = resume
        progress.write("resume", from_step=resume)
    dist.barrier()  # nobody writes a checkpoint before every rank has chosen where to resume

    eval_every = job.progress.eval_every or stream.steps_per_epoch
    evaluates = len(stream.test_y) > 0
    window_start, window_samples = time.perf_counter(), 0
    window = [0.0] * 7
    last_stage_ranks = set(topology.stage_ranks(topology.n_stages - 1))
    while step < total:
        x, y = stream.minibatch(step)
        xs, ys = x.chunk(t.microbatches), y.chunk(t.microbatches)
        mine = [b for b in range(t.microbatches) if topology.rank_for(stage, b) == rank]
        compression.before_step(step)
        stats = executor.run_step(
            schedule,
            {b: xs[b] for b in mine} if stage == 0 else None,
            {b: ys[b] for b in mine} if rank in last_stage_ranks else None,
        )
        step += 1
        window = [
            a + b
            for a, b in zip(
                window,
                [
                    stats.busy_s,
                    stats.idle_s,
                    stats.loss_sum,
                    stats.n_losses,
                    stats.bytes_sent,
                    stats.wire_bytes_fp32,
                    stats.wire_bytes_sent,
                ],
                strict=True,
            )
        ]
        window_samples += t.batch_size
        if step % job.progress.log_every == 0 or step == total:
            table = _gather_stats(window)
            loss = float(table[:, 2].sum() / table[:, 3].sum())
            if not math.isfinite(loss):
                raise JobFailed(EXIT_DIVERGED, f"loss {loss} at step {step}")
            elapsed = time.perf_counter() - window_start
            per_stage = [
                {
                    "stage": s,
                    "busy_s": round(float(table[topology.stage_ranks(s), 0].sum()), 4),
                    "idle_s": round(float(table[topology.stage_ranks(s), 1].sum()), 4),
                }
                for s in range(topology.n_stages)
            ]
            extra: dict[str, dict] = {}
            decisions: list[dict] = []
            if reports_compression:
                extra["compression"], decisions = _compression_window(compression, table, stage, step, loss)
            progress.write(
                "step",
                step=step,
                epoch=step / stream.steps_per_epoch,
                loss=loss,
                samples_per_s=window_samples / elapsed,
                stages=per_stage,
                **extra,
            )
            for decision in decisions:
                progress.write("compression_decision", **decision)
            window, window_samples, window_start = [0.0] * 7, 0, time.perf_counter()
        if evaluates and (step % eval_every == 0 or step == total):
            evaluate(
                executor,
                stream,
                topology,
                micro,
                progress,
                step,
                last_stage_ranks,
                classify=data.loss == "cross_entropy",
            )
        if (job.checkpoint.every and step % job.checkpoint.every == 0) or step == total:
            if replica == 0:
                checkpoint.save_stage(
                    job.checkpoint.dir,
                    stage,
                    step,
                    {
                        "identity": identity,
                        "step": step,
                        "model": module.state_dict(),
                        "optimizer": optimizer.state_dict() if optimizer else None,
                    },
                    keep=job.checkpoint.keep,
                )
            dist.barrier()
            progress.write("checkpoint", step=step)
    progress.write("done", step=step)
    return EXIT_OK


def _compression_window(
    compression: StageCompression, table: torch.Tensor, stage: int, step: int, loss: float
) -> tuple[dict, list[dict]]:
    """Every rank calls this at a progress line: the adaptive controllers decide (same step on
    every rank), then rank 0 gathers each stage's bytes, formats and decisions."""
    compression.record_loss(loss)
    decisions = [{"stage": stage, **d} for d in compression.decide(step)]
    mine = {"stage": stage, **compression.report(), "decisions": decisions}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    formats, merged = {}, []
    for report in everyone:
        formats.update(report["formats"])
        merged += report["decisions"]
    summary = {
        "saved_bytes_fp32": sum(r["saved_bytes_fp32"] for r in everyone),
        "saved_bytes_stored": sum(r["saved_bytes_stored"] for r in everyone),
        "wire_bytes_fp32": int(table[:, 5].sum()),
        "wire_bytes_sent": int(table[:, 6].sum()),
        "encode_s": round(sum(r["encode_s"] for r in everyone), 4),
        "decode_s": round(sum(r["decode_s"] for r in everyone), 4),
        "formats": dict(sorted(formats.items())),
    }
    # A replica's decisions repeat its stage's (same layers, same losses): keep one per (stage, layer).
    unique = {(d["stage"], d["layer"]): d for d in merged}
    return summary, list(unique.values())


def evaluate(
    executor: StageExecutor,
    stream: MinibatchStream,
    topology: Topology,
    micro: int,
    progress: ProgressLog,
    step: int,
    last_stage_ranks: set[int],
    *,
    classify: bool,
) -> None:
    test_x, test_y = stream.test_x, stream.test_y
    chunk = max(micro, 64)
    xs, ys = test_x.split(chunk), test_y.split(chunk)
    loss_sum, correct, count = executor.evaluate(xs, ys, len(xs), classify=classify)
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64)
    dist.all_reduce(totals)
    loss = float(totals[0] / totals[2])
    accuracy = float(totals[1] / totals[2]) if classify else None  # a regression has no accuracy
    progress.write("eval", step=step, loss=loss, accuracy=accuracy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Pipeline-parallel training job (run under torchrun).")
    parser.add_argument("--job", required=True, help="job TOML file")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        job = load_job(args.job)
    except JobError as exc:
        print(f"[train] invalid job: {exc}", file=sys.stderr)
        return EXIT_BAD_JOB
    progress = ProgressLog(job.progress.file, rank == 0)
    torch.set_num_threads(job.train.threads)
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # plain `python -m`: a one-process job
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        dist.init_process_group("gloo", timeout=timedelta(seconds=job.train.comm_timeout_s))
    try:
        return train(job)
    except (JobFailed, JobError) as exc:
        code = exc.code if isinstance(exc, JobFailed) else EXIT_BAD_JOB
        progress.write("error", code=code, message=str(exc))
        print(f"[train] rank {rank}: {exc}", file=sys.stderr)
        return code
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
