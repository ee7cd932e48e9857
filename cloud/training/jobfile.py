"""The job TOML: what to train, how to pipeline it, where checkpoints and progress go, the
preemption lease (``[preemption]``), and the
optional features (``[compression]``, ``[sync]``, ``[balance]``, ``[toggle]``: the sections of
``cloud.training.options``, shared with the job spec).

Invariant: ``load_job`` returns a fully validated ``JobConfig`` (relative paths resolved against the
TOML file's folder) or raises ``JobError`` whose message names the offending field; a job that
loads can be built into a schedule without further checks of its own fields.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from torch import nn

from cloud.training.options import (
    BalanceOptions,
    CompressionOptions,
    DeviceChoice,
    Precision,
    SyncOptions,
    ToggleOptions,
)
from cloud.training.schedules import SCHEDULE_NAMES


class JobError(ValueError):
    """The job file is unreadable or invalid; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    name: str = "digits_cnn"  # a name in models/, or a dotted path to an nn.Sequential factory
    # a torch state-dict file (job-folder relative) the weights start from; "": the factory's own init
    init: str = ""


class DataSection(_Section):
    """``digits``: scikit-learn's bundled digits. ``tensor_file``: ``torch.save({"x": ..., "y": ...})``
    at ``path`` (cloudd exports gateways' uploads this way; docs/training.md). ``loss``:
    ``cross_entropy`` (y: class indices), ``mse`` (y: float targets shaped as the output) or
    ``reconstruction`` (MSE against the input itself: y = x, the file needs no y)."""

    dataset: Literal["digits", "tensor_file"] = "digits"
    path: str = ""  # tensor_file only
    loss: Literal["cross_entropy", "mse", "reconstruction"] = "cross_entropy"
    # tensor_file: rows held out for eval (seeded split)
    test_fraction: float = Field(default=0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _check(self) -> DataSection:
        if self.dataset == "tensor_file" and not self.path:
            raise ValueError('dataset "tensor_file" needs path = "<file written by torch.save>"')
        if self.dataset == "digits" and (self.path or self.loss != "cross_entropy" or self.test_fraction):
            raise ValueError(
                "dataset digits takes no path, loss or test_fraction (it is cross_entropy on "
                "its own 80/20 split)"
            )
        return self


class TrainSection(_Section):
    schedule: str = "1f1b-flush"
    vertical_sync: bool = False
    microbatches: int = Field(default=4, ge=1)
    batch_size: int = Field(default=64, ge=1)  # samples per step; a step has `microbatches` microbatches
    epochs: int = Field(default=1, ge=1)
    max_steps: int = Field(default=0, ge=0)  # 0: run all epochs
    lr: float = Field(default=0.05, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)  # sgd only
    optimizer: Literal["sgd", "adam"] = "sgd"
    seed: int = 0
    threads: int = Field(default=1, ge=1)  # intra-op threads per rank (profiling uses the same)
    wire_codec: str = "fp32"
    precision: Precision = "fp32"  # bf16: autocast on each stage's forward; loss and optimizer fp32
    comm_timeout_s: float = Field(default=120.0, gt=0)
    device: DeviceChoice = "auto"  # cloud.training.device: CUDA + NCCL where present, else CPU + gloo

    @model_validator(mode="after")
    def _check(self) -> TrainSection:
        if self.schedule not in SCHEDULE_NAMES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULE_NAMES)}")
        if self.batch_size % self.microbatches:
            raise ValueError("batch_size must be a multiple of microbatches")
        if self.vertical_sync and self.schedule != "1f1b-stash":
            raise ValueError("vertical_sync applies only to schedule 1f1b-stash")
        return self


class PartitionSection(_Section):
    mode: Literal["auto", "even", "explicit"] = "auto"
    stages: list[tuple[int, int]] = []  # explicit: inclusive layer ranges
    replicas: list[int] = []  # explicit: replicas per stage (default 1 each)
    straight: bool = False  # auto: no replication
    bandwidth: float = Field(default=0.0, ge=0)  # bytes/s between workers; 0: measure
    compression_ratio: float = Field(default=1.0, gt=0)
    profile_cache: str = ""  # JSON profile cache; "" = <checkpoint dir>/profile.json

    @model_validator(mode="after")
    def _check(self) -> PartitionSection:
        if self.mode == "explicit" and not self.stages:
            raise ValueError("explicit partition needs stages = [[first, last], ...]")
        if self.replicas and len(self.replicas) != len(self.stages):
            raise ValueError("replicas needs one count per stage")
        return self


class CheckpointSection(_Section):
    dir: str = "checkpoints"
    every: int = Field(default=0, ge=0)  # steps between checkpoints; 0: only at the end
    keep: int = Field(default=3, ge=2)


class ProgressSection(_Section):
    file: str = "progress.jsonl"
    log_every: int = Field(default=1, ge=1)
    eval_every: int = Field(default=0, ge=0)  # steps; 0: at the end of each epoch


class PreemptionSection(_Section):
    """``lease``: a file that must exist while the job may train (``cloud.training.lease``); ""
    means the job is never preempted. Checked every ``check_every`` steps."""

    lease: str = ""
    check_every: int = Field(default=1, ge=1)


class JobConfig(_Section):
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    train: TrainSection = TrainSection()
    partition: PartitionSection = PartitionSection()
    checkpoint: CheckpointSection = CheckpointSection()
    progress: ProgressSection = ProgressSection()
    preemption: PreemptionSection = PreemptionSection()
    compression: CompressionOptions = CompressionOptions()
    sync: SyncOptions = SyncOptions()
    balance: BalanceOptions = BalanceOptions()
    toggle: ToggleOptions = ToggleOptions()

    @model_validator(mode="after")
    def _check(self) -> JobConfig:
        from cloud.training.compression.wire_codec import WIRE_CODEC_NAMES

        if self.train.wire_codec not in WIRE_CODEC_NAMES:
            raise ValueError(f"train.wire_codec must be one of {', '.join(WIRE_CODEC_NAMES)}")
        _check_compression(self.compression, self.progress)
        if self.sync.enabled and self.train.optimizer != "sgd":
            raise ValueError("train.optimizer: the sync scheduler steps each layer with SGD; use sgd")
        for name, on in (("sync", self.sync.enabled), ("balance", self.balance.enabled)):
            if on:
                _check_replicated(name, self.train, self.partition)
        if self.balance.enabled and self.partition.mode == "explicit":
            replicated = [r for r in self.partition.replicas if r > 1]
            if len(replicated) > 1:
                raise ValueError(
                    "balance.enabled: balancing splits each minibatch between the replicas of one "
                    f"stage; partition.replicas replicates {len(replicated)} stages"
                )
            if self.balance.declared_speeds and len(self.balance.declared_speeds) != replicated[0]:
                raise ValueError(
                    f"balance.declared_speeds: one speed per replica ({replicated[0]}), "
                    f"got {len(self.balance.declared_speeds)}"
                )
        if self.toggle.enabled and self.data.loss != "cross_entropy":
            raise ValueError(
                "toggle.enabled: toggle-rate selection needs per-item right/wrong answers, i.e. a "
                f"classification loss (cross_entropy); data.loss is {self.data.loss}"
            )
        return self


def _check_compression(c: CompressionOptions, progress: ProgressSection) -> None:
    from cloud.training.compression.controller import DEFAULT_LADDER
    from models.numerics import BfpFormat

    try:
        BfpFormat.parse(c.format)
    except ValueError as exc:
        raise ValueError(f"compression.format: {exc}") from None
    if c.activations != "adaptive":
        return
    if c.window % progress.log_every:
        raise ValueError(
            "compression.window must be a multiple of progress.log_every: the adaptive "
            "controller decides when every rank knows the loss"
        )
    k = c.controller
    if not k.start_rung <= k.tightest_rung < len(DEFAULT_LADDER):
        raise ValueError(
            f"compression.controller: need start_rung ({k.start_rung}) <= tightest_rung "
            f"({k.tightest_rung}) < {len(DEFAULT_LADDER)} (the ladder's rungs)"
        )


def _check_replicated(name: str, train: TrainSection, partition: PartitionSection) -> None:
    """``sync`` and ``balance`` act on replicated stages only: refuse a job that can have none."""
    if train.schedule == "1f1b-stash":
        raise ValueError(
            f"{name}.enabled: {name} applies only to replicated stages, and schedule 1f1b-stash "
            "does not replicate (use gpipe or 1f1b-flush)"
        )
    if partition.mode == "even" or (partition.mode == "auto" and partition.straight):
        how = "even" if partition.mode == "even" else "auto with straight = true"
        raise ValueError(
            f"{name}.enabled: {name} applies only to replicated stages, and partition mode {how} "
            "replicates none (use mode auto, or explicit with replicas)"
        )
    if partition.mode == "explicit" and all(r < 2 for r in partition.replicas):
        raise ValueError(
            f"{name}.enabled: {name} applies only to replicated stages; partition.replicas has none above 1"
        )


def load_job(path: str | Path) -> JobConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
        job = JobConfig.model_validate(raw)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise JobError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        where = f"{field}: " if field else ""  # a check across sections names its field itself
        raise JobError(f"{path}: {where}{first['msg']}") from exc
    base = path.resolve().parent

    def resolve(text: str) -> str:
        return str(Path(text)) if Path(text).is_absolute() else str(base / text)

    checkpoint = job.checkpoint.model_copy(update={"dir": resolve(job.checkpoint.dir)})
    progress = job.progress.model_copy(update={"file": resolve(job.progress.file)})
    data = job.data.model_copy(update={"path": resolve(job.data.path)}) if job.data.path else job.data
    measured = job.sync.topology in ("", "probe")  # "probe": measured at start, not a file
    sync = job.sync if measured else job.sync.model_copy(update={"topology": resolve(job.sync.topology)})
    lease = job.preemption.lease
    preemption = job.preemption.model_copy(update={"lease": resolve(lease) if lease else ""})
    cache = job.partition.profile_cache
    partition = job.partition.model_copy(
        update={"profile_cache": resolve(cache) if cache else str(Path(checkpoint.dir) / "profile.json")}
    )
    return job.model_copy(
        update={
            "checkpoint": checkpoint,
            "progress": progress,
            "partition": partition,
            "data": data,
            "sync": sync,
            "preemption": preemption,
        }
    )


# What the pipeline needs of a model, said whenever a model is not that (docs/training.md, "Your own model").
MODEL_SHAPE = (
    "a model factory takes no arguments and returns a torch.nn.Sequential: the pipeline cuts it "
    "between its top-level layers, so each layer must take the previous layer's output (one tensor) "
    "and return one tensor; keep branches and skip connections inside one layer (a small nn.Module), "
    "reshape with nn.Flatten, and have at least as many layers as the job has stages"
)


def build_model(name: str) -> nn.Sequential:
    """``digits_cnn`` or a dotted path (``pkg.mod.factory`` or ``pkg.mod:factory``) to a factory."""
    if name == "digits_cnn":
        from models.digits import digits_cnn

        return digits_cnn()
    module_name, _, attr = name.replace(":", ".").rpartition(".")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise JobError(
            f"model.name: cannot import {name!r}: {exc} (a factory's folder goes on the job's pythonpath)"
        ) from exc
    try:
        model = factory()
    except Exception as exc:  # the user's code: any failure is a bad job, said as such
        raise JobError(f"model.name: {name!r}() raised {type(exc).__name__}: {exc}; {MODEL_SHAPE}") from exc
    if not isinstance(model, nn.Sequential):
        raise JobError(
            f"model.name: {name!r} returned {type(model).__name__}, not nn.Sequential; {MODEL_SHAPE}"
        )
    return model
