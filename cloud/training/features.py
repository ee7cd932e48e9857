"""A job's optional features on one rank: built from the job file, named for the ``start`` event,
and reported live on each ``step`` event (docs/training.md, "Job file").

``StageFeatures`` holds what a rank runs: its stage's activation compression, bf16 autocast,
the sync scheduler and balancer of a replicated stage, and the toggle-rate data stream.

Invariant: a feature whose section is off leaves the trainer exactly as without it (no object, no
collective); ``flags`` names what really runs (``sync``/``balance`` say "off" when the plan has no
replicated stage); every rank takes part in the same collectives at the same steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from torch import nn

from cloud.training import comm
from cloud.training.compression.stage import StageCompression
from cloud.training.data.stream import MinibatchStream
from cloud.training.data.toggle_stream import ToggleStream
from cloud.training.jobfile import JobConfig, JobError
from cloud.training.options import CompressionOptions, Precision, SyncOptions
from cloud.training.schedules import Topology
from cloud.training.sync.link import Reducer
from cloud.training.sync.stage import StageBalance, StageSync, replicated_stages

GroupReducer = Callable[[dist.ProcessGroup | None], Reducer]


def compression_name(c: CompressionOptions) -> str:
    parts = ([c.activations] if c.activations != "none" else []) + (["gist"] if c.gist else [])
    return "+".join(parts) or "off"


def _refuse_cpu_only_features_on_nccl(job: JobConfig) -> None:
    """The sync scheduler, the balancer and the toggle tracker run their collectives on CPU tensors,
    which NCCL cannot carry; until they move to the wire device, such a job runs on CPU (gloo)."""
    if comm.wire_device().type != "cuda":
        return
    enabled = {"sync": job.sync.enabled, "balance": job.balance.enabled, "toggle": job.toggle.enabled}
    for name, on in enabled.items():
        if on:
            raise JobError(
                f"{name}.enabled: not yet on CUDA/NCCL (its collectives use CPU tensors); "
                'set train.device = "cpu" for this job'
            )


def autocast_for(precision: Precision, device_type: str) -> Callable[[], AbstractContextManager] | None:
    """The stage forward's autocast context, or None for fp32; refuses bf16 where unsupported."""
    if precision == "fp32":
        return None
    if not torch.amp.is_autocast_available(device_type):
        raise JobError(f"train.precision: bf16 autocast is not available on device {device_type}")
    if device_type == "cuda" and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        raise JobError("train.precision: this CUDA device does not support bf16")
    return functools.partial(torch.autocast, device_type, dtype=torch.bfloat16)


def gradient_reducers(options: SyncOptions, timeout_s: float) -> GroupReducer | None:
    """``sync.collective``: group -> the all-reduce of a program collective on the job's fabric
    (``sync.topology``: a file, or ``"probe"`` to measure it now); None for torch.distributed's
    own all-reduce. Every rank calls it (the probe is a collective)."""
    if options.collective == "torch":
        return None
    from cloud.training.collectives import topology as fabric_file  # scipy, loaded only when used
    from cloud.training.collectives.probe import PROBE, probe
    from cloud.training.collectives.reducer import reducer_factory

    fabric = None
    if options.topology == PROBE:
        fabric = probe()  # every rank: a collective of the default group
    elif options.topology:
        try:
            fabric = fabric_file.load(options.topology)
        except (OSError, ValueError) as error:
            raise JobError(f"sync.topology: {error}") from error
        if fabric.world != dist.get_world_size():
            raise JobError(f"sync.topology: {fabric.world} ranks, the job has {dist.get_world_size()}")
    return reducer_factory(options.collective, fabric, timeout_s=timeout_s)


def toggle_stream(job: JobConfig, stream: MinibatchStream) -> MinibatchStream:
    return ToggleStream(stream, job.toggle) if job.toggle.enabled else stream


class StageFeatures:
    def __init__(
        self,
        job: JobConfig,
        module: nn.Module,
        topology: Topology,
        rank: int,
        replica_groups: Sequence[dist.ProcessGroup],
        stream: MinibatchStream,
    ) -> None:
        t = job.train
        self.job, self.stream = job, stream
        _refuse_cpu_only_features_on_nccl(job)
        # Gist may replace the module by a GraphModule sharing its parameters: checkpoints keep `module`.
        self.compression = StageCompression(module, job.compression)
        self.device_type = next(module.parameters(), torch.empty(0)).device.type
        self.autocast = autocast_for(t.precision, self.device_type)
        replicated = bool(replicated_stages(topology))
        reducers = gradient_reducers(job.sync, t.comm_timeout_s) if replicated else None
        stage, _ = topology.stage_replica_of(rank)
        # the executor's plain all-reduce of the stage's gradients (when the scheduler does not own them)
        self.all_reduce = (
            reducers(replica_groups[stage]) if reducers and stage in replicated_stages(topology) else None
        )
        self.sync: StageSync | None = None
        if job.sync.enabled and replicated:
            self.sync = StageSync(
                job.sync,
                self.compression.module,  # its layers' forward hooks step them: the module that runs
                topology,
                rank,
                lr=t.lr,
                momentum=t.momentum,
                timeout_s=t.comm_timeout_s,
                reducer_for=reducers,
            )
        self.balance: StageBalance | None = None
        if job.balance.enabled and replicated:
            self.balance = StageBalance(
                job.balance,
                topology,
                rank,
                replica_groups,
                microbatches=t.microbatches,
                batch_size=t.batch_size,
            )
        self.toggle = stream if isinstance(stream, ToggleStream) else None
        self.reports_compression = compression_name(job.compression) != "off" or t.wire_codec != "fp32"

    @property
    def owns_optimizer(self) -> bool:
        """The sync scheduler steps this rank's weights (per layer), not the executor."""
        return self.sync is not None and self.sync.scheduler is not None

    @property
    def hand_off(self) -> Callable[[], None] | None:
        """The executor's ``flush_gradients``: the sync scheduler's, when it owns the step."""
        return self.sync.scheduler.hand_off if self.sync is not None and self.sync.scheduler else None

    def identity(self) -> dict:
        """What a checkpoint must agree on beyond the plan: the optimizer state's layout (per layer
        with sync) and the data selection (toggle); balance changes neither."""
        identity: dict = {"sync": True} if self.sync is not None else {}
        if self.toggle is not None:
            identity["toggle"] = self.job.toggle.model_dump()
        return identity

    def optimizer_state(self, optimizer: torch.optim.Optimizer | None) -> dict | None:
        if self.sync is not None and self.sync.scheduler is not None:
            return self.sync.optimizer_state()
        return optimizer.state_dict() if optimizer is not None else None

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer | None, state: dict | None) -> None:
        if self.sync is not None and self.sync.scheduler is not None:
            self.sync.load_optimizer_state(state or {})
        elif optimizer is not None and state is not None:
            optimizer.load_state_dict(state)

    def record_answers(self, rows: Sequence[torch.Tensor], answers: dict[int, torch.Tensor]) -> None:
        """Toggle (last stage): microbatch b's answers, for its training-set ``rows[b]``."""
        if self.toggle is not None:
            for b, correct in answers.items():
                self.toggle.record(rows[b], correct)

    def end_epoch(self) -> None:
        """Every rank, at each epoch's end (toggle: merge the answers, select the next epoch)."""
        if self.toggle is not None:
            self.toggle.end_epoch()

    def flags(self) -> dict[str, str]:
        """The ``start`` event's ``features``."""
        on = {True: "on", False: "off"}
        return {
            "compression": compression_name(self.job.compression),
            "wire_codec": self.job.train.wire_codec,
            "sync": on[self.sync is not None],
            "collective": self.job.sync.collective,
            "balance": on[self.balance is not None],
            "toggle": on[self.toggle is not None],
            "precision": self.job.train.precision,
            "device": self.device_type,
        }

    def notes(self) -> list[str]:
        """Why a feature the job asked for does not run."""
        notes = []
        for name, asked, runs in (
            ("sync", self.job.sync.enabled, self.sync is not None),
            ("balance", self.job.balance.enabled, self.balance is not None),
        ):
            if asked and not runs:
                notes.append(f"{name}: the plan has no replicated stage, and {name} applies only to those")
        return notes

    def microbatch_sizes(self) -> list[int]:
        t = self.job.train
        return (
            self.balance.microbatch_sizes()
            if self.balance
            else [t.batch_size // t.microbatches] * t.microbatches
        )

    def end_step(self, busy_s: float) -> None:
        """Every rank after each step (the balancer's timing leaves out waits for syncs)."""
        blocked = self.sync.step_blocked_s() if self.sync else 0.0
        if self.balance is not None:
            self.balance.end_step(max(0.0, busy_s - blocked))

    def finish(self) -> None:
        """Before the weights are read (checkpoint, end): every sync in flight applied."""
        if self.sync is not None:
            self.sync.finish()

    def close(self) -> None:
        if self.sync is not None:
            self.sync.close()

    def live(self) -> dict[str, dict]:
        """Every rank at a progress line: the ``sync``/``balance``/``toggle`` sub-objects of the
        ``step`` event (complete on rank 0, which may hold no replicated stage: one gather)."""
        live: dict[str, dict] = {}
        if self.sync is not None or self.balance is not None:
            mine = {
                "sync": self.sync.report() if self.sync else None,
                "balance": self.balance.report() if self.balance else None,
            }
            everyone: list = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
            syncs = [r["sync"] for r in everyone if r["sync"] is not None]
            if syncs:  # the replicas of a stage agree on the policy; blocked time adds up
                live["sync"] = {
                    "policy": " | ".join(sorted({s["policy"] for s in syncs})),
                    "iteration": max(s["iteration"] for s in syncs),
                    "windows": max(s["windows"] for s in syncs),
                    "decisions": max(s["decisions"] for s in syncs),
                    "blocked_s": round(sum(s["blocked_s"] for s in syncs), 4),
                    "reducer_runs": sum(s["reducer_runs"] for s in syncs),
                }
            balance = next((r["balance"] for r in everyone if r["balance"] is not None), None)
            if balance is not None:
                live["balance"] = balance
        if self.toggle is not None:
            live["toggle"] = self.toggle.report()
        return live
