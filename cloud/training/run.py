"""Entry point of a training job: ``torchrun ... -m cloud.training.run --job job.toml``.

Every rank loads the job and its data (scikit-learn's digits, or a tensor file with the loss the
job names: cross-entropy, MSE, or reconstruction MSE with y = x), checks one forward of the model
against the loss, builds the same model from the same seed on the rank's device (``[train] device``
resolved by ``cloud.training.device``, which also picks NCCL or gloo), agrees on one plan (rank 0
profiles and partitions, then broadcasts), builds its stage, resumes from the last complete
checkpoint, and runs steps with ``StageExecutor``; the job's optional features (compression,
bf16, sync, balance, toggle) are set up by ``features.StageFeatures``. Rank 0 appends JSON lines
to the progress file (``progress.py``): ``phase`` (starting, training, evaluating), ``start``
(plan, dataset, loss, rows, ``features``), ``resume``, ``step`` (loss, samples/s, per-stage
busy/idle seconds, and one sub-object per feature that runs: ``compression``, ``sync``,
``balance``, ``toggle``), ``compression_decision`` (one per adaptive format change), ``eval``
(with held-out rows only), ``checkpoint`` (written only once every stage's file is on disk),
``done``, ``preempted`` (the lease was revoked: ``lease.py``; written after the checkpoint of
that step) or ``error``.

Exit codes (of each worker; torchrun itself exits 1 when any worker fails):
0 done, 2 invalid job file (or a data file that does not fit it, or ``device = "cuda"`` without a
GPU), 3 plan does not fit the world size, 4 training diverged (loss not finite), 5 checkpoint
belongs to a different plan or schedule, 6 preempted (a complete checkpoint of the step it stopped
at is on disk; a rerun resumes from it). A step with ``samples_per_s`` also has ``steps_per_s``.

Invariant: the data order depends only on (seed, step), so a resumed job trains on exactly the
minibatches an uninterrupted one would have. With ``[toggle]`` it also depends on the answers
recorded in earlier epochs: a checkpoint keeps the selection of its epoch, and a resume from one
taken at an epoch's end continues exactly; from one inside an epoch it loses that epoch's answers.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from cloud.training import checkpoint, comm
from cloud.training.compression.wire_codec import register_wire_codecs
from cloud.training.data.stream import MinibatchStream, check_loss_fits, load_stream, loss_function
from cloud.training.device import DeviceUnavailable, Placement, activate, placement_for
from cloud.training.executor import StageExecutor
from cloud.training.features import StageFeatures, toggle_stream
from cloud.training.jobfile import JobConfig, JobError, build_model, load_job
from cloud.training.lease import Lease
from cloud.training.partition import Plan, StagePlan, even_plan, partition
from cloud.training.profiler import cached_profile
from cloud.training.progress import ProgressLog, ProgressWindow, write_refusal
from cloud.training.schedules import Schedule, Topology, build_schedule, schedule_name

EXIT_OK, EXIT_BAD_JOB, EXIT_PLAN, EXIT_DIVERGED, EXIT_CHECKPOINT, EXIT_PREEMPTED = 0, 2, 3, 4, 5, 6


class JobFailed(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


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
            elif (resumed := _checkpointed_plan(job, world)) is not None:
                plan = resumed  # a measured partition may differ run to run: resume the saved one
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


def _checkpointed_plan(job: JobConfig, world: int) -> Plan | None:
    """The plan of the job's last complete checkpoint when it fits ``world`` ranks (rank 0 only)."""
    stage0 = checkpoint.stage_steps(job.checkpoint.dir, 0)
    if not stage0:
        return None
    # the number of stages is the checkpoint's own: read it from the newest stage-0 file
    saved = checkpoint.load_stage(job.checkpoint.dir, 0, stage0[-1])["identity"]["plan"]
    step = checkpoint.latest_complete_step(job.checkpoint.dir, len(saved))
    if step is None:
        return None
    stages = checkpoint.load_stage(job.checkpoint.dir, 0, step)["identity"]["plan"]
    plan = Plan(tuple(StagePlan(*span) for span in stages), math.nan)
    return plan if plan.workers == world else None


def train(job: JobConfig, placement: Placement) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    t = job.train
    register_wire_codecs()  # every rank: a BFP payload names its codec in the message header
    progress = ProgressLog(job.progress.file, rank == 0)
    progress.write("phase", phase="starting")
    torch.manual_seed(t.seed)
    model = build_model(job.model.name)
    if job.model.init:  # a warm start (e.g. the production version): every rank the same weights
        model.load_state_dict(torch.load(job.model.init, weights_only=True), strict=True)
    data = job.data
    stream = toggle_stream(job, load_stream(data, t.seed, t.batch_size))
    loss_fn = loss_function(data)
    micro = t.batch_size // t.microbatches
    sample_x, sample_y = stream.minibatch(0)
    check_loss_fits(model, loss_fn, data, sample_x[:micro], sample_y[:micro])
    model.to(placement.device)  # before the plan, so that rank 0 profiles where the stages will run
    plan = choose_plan(job, model, sample_x[:micro].to(placement.device), world)
    schedule = build_schedule(
        schedule_name(t.schedule), plan.replicas, t.microbatches, vertical_sync=t.vertical_sync
    )
    topology = schedule.topology
    groups = [dist.new_group(topology.stage_ranks(s)) for s in range(topology.n_stages)]
    channels = comm.Channels.create([topology.stage_ranks(s) for s in range(topology.n_stages)])
    stage, _ = topology.stage_replica_of(rank)
    span = plan.stages[stage]
    module = model[span.first : span.last + 1]  # keeps the global layer indices in state_dict keys
    features = StageFeatures(job, module, topology, rank, groups, stream)
    try:
        optimizer = None
        if any(True for _ in module.parameters()) and not features.owns_optimizer:
            optimizer = (
                torch.optim.Adam(module.parameters(), lr=t.lr)
                if t.optimizer == "adam"
                else torch.optim.SGD(module.parameters(), lr=t.lr, momentum=t.momentum)
            )
        executor = StageExecutor(
            features.compression.module,
            topology,
            rank,
            optimizer=optimizer,
            loss_fn=loss_fn,
            codec=comm.codec_by_name(t.wire_codec),
            replica_group=groups[stage],
            timeout_s=t.comm_timeout_s,
            activation_context=features.compression.context,
            autocast=features.autocast,
            flush_gradients=features.hand_off,
            record_answers=features.toggle is not None,
            device=placement.device,
            channels=channels,
            all_reduce=features.all_reduce,
        )
        stage_checkpoint = StageCheckpoint(job, plan, topology, module, optimizer, features)
        total = stream.total_steps(t.epochs)
        total = min(total, t.max_steps) if t.max_steps else total
        notes = features.notes()
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
            features=features.flags(),
            **({"notes": notes} if notes else {}),
        )
        step = stage_checkpoint.resume(progress)
        progress.write("phase", phase="training")
        code = _run_steps(job, executor, schedule, stream, features, stage_checkpoint, progress, step, total)
    finally:
        features.close()
    # Leave together: a rank that tore gloo down while its peer still wrote its last progress lines
    # sometimes aborted in the teardown (docs/measurements/2026-11-training-sync.md, bench/_torchrun.py).
    dist.barrier()
    return code


def _run_steps(
    job: JobConfig,
    executor: StageExecutor,
    schedule: Schedule,
    stream: MinibatchStream,
    features: StageFeatures,
    stage_checkpoint: StageCheckpoint,
    progress: ProgressLog,
    step: int,
    total: int,
) -> int:
    """Train from ``step`` to ``total``; EXIT_OK, or EXIT_PREEMPTED once the lease is revoked."""
    t, rank, topology = job.train, executor.rank, schedule.topology
    stage = executor.stage
    last_stage_ranks = set(topology.stage_ranks(topology.n_stages - 1))
    window = ProgressWindow()
    lease = Lease(job.preemption.lease, job.preemption.check_every)
    while step < total:
        sizes = features.microbatch_sizes()
        x, y = stream.minibatch(step)
        xs, ys = x.split(sizes), y.split(sizes)
        mine = [b for b in range(t.microbatches) if topology.rank_for(stage, b) == rank]
        features.compression.before_step(step)
        stats = executor.run_step(
            schedule,
            {b: xs[b] for b in mine} if stage == 0 else None,
            {b: ys[b] for b in mine} if rank in last_stage_ranks else None,
            batch_samples=t.batch_size if features.balance else None,
        )
        features.record_answers(stream.rows(step).split(sizes), stats.answers)
        step += 1
        features.end_step(stats.busy_s)
        epoch_ended = stream.locate(step)[1] == 0
        if epoch_ended:
            features.end_epoch()  # before a checkpoint of this step: it saves the next epoch's choice
        window.add(stats, t.batch_size)
        if step % job.progress.log_every == 0 or step == total:
            loss = window.write(progress, features, topology, stage, step, stream)
            if not math.isfinite(loss):
                raise JobFailed(EXIT_DIVERGED, f"loss {loss} at step {step}")
        eval_every = job.progress.eval_every
        if len(stream.test_y) and ((step % eval_every == 0 if eval_every else epoch_ended) or step == total):
            progress.write("phase", phase="evaluating")
            classify = job.data.loss == "cross_entropy"
            micro = t.batch_size // t.microbatches
            evaluate(executor, stream, topology, micro, progress, step, last_stage_ranks, classify=classify)
            if step < total:
                progress.write("phase", phase="training")
        saved = (job.checkpoint.every and step % job.checkpoint.every == 0) or step == total
        if saved:
            stage_checkpoint.save(step)
            progress.write("checkpoint", step=step)
        if step < total and lease.revoked(step):  # the last step just finishes: nothing to resume
            if not saved:
                stage_checkpoint.save(step)
                progress.write("checkpoint", step=step)
            progress.write("preempted", step=step, total_steps=total)
            return EXIT_PREEMPTED
    progress.write("done", step=step)
    return EXIT_OK


class StageCheckpoint:
    """This rank's stage in the job's checkpoints: its weights, optimizer state and (toggle) data
    selection, written by the stage's first replica; a checkpoint of another plan, schedule or
    feature set is refused."""

    def __init__(
        self,
        job: JobConfig,
        plan: Plan,
        topology: Topology,
        module: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        features: StageFeatures,
    ):
        t = job.train
        self.dir, self.keep, self.n_stages = job.checkpoint.dir, job.checkpoint.keep, topology.n_stages
        self.stage, self.replica = topology.stage_replica_of(dist.get_rank())
        self.module, self.optimizer, self.features = module, optimizer, features
        self.identity = {
            "plan": [[s.first, s.last, s.replicas] for s in plan.stages],
            "schedule": t.schedule,
            "microbatches": t.microbatches,
            "batch_size": t.batch_size,
            "seed": t.seed,
            "dataset": job.data.dataset,
            "loss": job.data.loss,
            **features.identity(),
        }

    def resume(self, progress: ProgressLog) -> int:
        """The step to start from (0, or the last complete checkpoint's, whose state is loaded)."""
        step = 0
        resume = checkpoint.latest_complete_step(self.dir, self.n_stages)
        if resume is not None:
            state = checkpoint.load_stage(self.dir, self.stage, resume)
            if state["identity"] != self.identity:
                raise JobFailed(EXIT_CHECKPOINT, f"checkpoint step {resume} is of {state['identity']}")
            self.module.load_state_dict(state["model"])
            self.features.load_optimizer_state(self.optimizer, state["optimizer"])
            if self.features.toggle is not None:
                self.features.toggle.load_state_dict(state["toggle"])
            step = resume
            progress.write("resume", from_step=resume)
        dist.barrier()  # nobody writes a checkpoint before every rank has chosen where to resume
        return step

    def save(self, step: int) -> None:
        """Every rank: the syncs in flight applied, the stage's first replica writes, all wait."""
        self.features.finish()
        if self.replica == 0:
            state = {
                "identity": self.identity,
                "step": step,
                "model": self.module.state_dict(),
                "optimizer": self.features.optimizer_state(self.optimizer),
            }
            if self.features.toggle is not None:
                state["toggle"] = self.features.toggle.state_dict()
            checkpoint.save_stage(self.dir, self.stage, step, state, keep=self.keep)
        dist.barrier()


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
    totals = torch.tensor([loss_sum, correct, count], dtype=torch.float64, device=comm.wire_device())
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
    try:
        placement = placement_for(job.train.device)
    except DeviceUnavailable as exc:
        write_refusal(job.progress.file, EXIT_BAD_JOB, str(exc))
        print(f"[train] invalid job: {exc}", file=sys.stderr)
        return EXIT_BAD_JOB
    progress = ProgressLog(job.progress.file, rank == 0)
    torch.set_num_threads(job.train.threads)
    activate(placement)
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # plain `python -m`: a one-process job
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
        dist.init_process_group(placement.backend, timeout=timedelta(seconds=job.train.comm_timeout_s))
    print(f"[train] rank {rank}: {placement.describe()}", flush=True)
    try:
        return train(job, placement)
    except (JobFailed, JobError) as exc:
        code = exc.code if isinstance(exc, JobFailed) else EXIT_BAD_JOB
        progress.write("error", code=code, message=str(exc))
        print(f"[train] rank {rank}: {exc}", file=sys.stderr)
        return code
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's finalization: the process groups are destroyed above, but
    # Python still holds their objects, and gloo's threads torn down while the interpreter is being
    # finalized sometimes abort the rank ("terminate called without an active exception", seen in
    # about one loaded test run in ten) after a job that finished. Everything the job writes is
    # flushed per line already; stdout and stderr are flushed here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
