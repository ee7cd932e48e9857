"""The job TOML: what to train, how to pipeline it, where checkpoints and progress go.

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

from cloud.training.options import DeviceChoice
from cloud.training.schedules import SCHEDULE_NAMES


class JobError(ValueError):
    """The job file is unreadable or invalid; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    name: str = "digits_cnn"  # a name in models/, or a dotted path to an nn.Sequential factory


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
    momentum: float = Field(default=0.9, ge=0, lt=1)
    seed: int = 0
    threads: int = Field(default=1, ge=1)  # intra-op threads per rank (profiling uses the same)
    wire_codec: str = "fp32"
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


ActivationMode = Literal["none", "bfp", "adaptive"]  # see CompressionSection


class CompressionSection(_Section):
    """Activations saved for backward, stored compressed on every stage (docs/compression.md)."""

    activations: ActivationMode = "none"
    format: str = "bfp(b=32,m=4,e=8,r=nearest,l=uniform,o=0.0)"  # "bfp": every layer's format
    gist: bool = True  # Gist fx pass on each stage module (binarize ReLU->MaxPool, sparse ReLU->conv)
    window: int = Field(default=20, ge=1)  # "adaptive": steps per decision; a multiple of progress.log_every
    min_numel: int = Field(default=32768, ge=0)  # smaller saved tensors stay as they are (as the compressor)

    @model_validator(mode="after")
    def _check(self) -> CompressionSection:
        from models.numerics import BfpFormat

        BfpFormat.parse(self.format)  # ValueError names the expected form
        return self


class JobConfig(_Section):
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    train: TrainSection = TrainSection()
    partition: PartitionSection = PartitionSection()
    checkpoint: CheckpointSection = CheckpointSection()
    progress: ProgressSection = ProgressSection()
    compression: CompressionSection = CompressionSection()

    @model_validator(mode="after")
    def _check(self) -> JobConfig:
        if self.compression.activations == "adaptive" and self.compression.window % self.progress.log_every:
            raise ValueError(
                "compression.window must be a multiple of progress.log_every: the adaptive "
                "controller decides when every rank knows the loss"
            )
        from cloud.training.compression.wire_codec import WIRE_CODEC_NAMES

        if self.train.wire_codec not in WIRE_CODEC_NAMES:
            raise ValueError(f"train.wire_codec must be one of {', '.join(WIRE_CODEC_NAMES)}")
        return self


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
        raise JobError(f"{path}: {field}: {first['msg']}") from exc
    base = path.resolve().parent

    def resolve(text: str) -> str:
        return str(Path(text)) if Path(text).is_absolute() else str(base / text)

    checkpoint = job.checkpoint.model_copy(update={"dir": resolve(job.checkpoint.dir)})
    progress = job.progress.model_copy(update={"file": resolve(job.progress.file)})
    data = job.data.model_copy(update={"path": resolve(job.data.path)}) if job.data.path else job.data
    cache = job.partition.profile_cache
    partition = job.partition.model_copy(
        update={"profile_cache": resolve(cache) if cache else str(Path(checkpoint.dir) / "profile.json")}
    )
    return job.model_copy(
        update={"checkpoint": checkpoint, "progress": progress, "partition": partition, "data": data}
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
        raise JobError(f"model.name: cannot import {name!r}: {exc}") from exc
    model = factory()
    if not isinstance(model, nn.Sequential):
        raise JobError(f"model.name: {name!r} returned {type(model).__name__}, not nn.Sequential")
    return model
