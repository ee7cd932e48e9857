"""JobSpec: what a user asks cloudd to train (validated once, at submission), and its job TOML.

A spec names a model (a built-in name or a factory ``package.module:function``), a dataset (a
built-in one, one built from gateways' uploads, or ``upload:<name>``, a file uploaded to cloudd)
and the trainer's options; the feature sections are ``cloud.training.options``' classes
themselves, so a spec cloudd accepts is a job file the trainer accepts, field for field
(docs/training.md, "The job spec").

Invariant: a ``JobSpec`` is consistent (the model fits the dataset, batch_size is a multiple of
microbatches, stages x replicas = nproc when both are given); ``parse_spec`` turns anything else
into ``SpecError`` whose message names the field (``compression.window: ...`` for nested ones).
A pure module (pydantic only): cloudd imports it and no torch.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cloud.jobs.spec_toml import partition_lines, section_lines
from cloud.training.options import (
    BalanceOptions,
    CompressionOptions,
    DeviceChoice,
    Precision,
    SyncOptions,
    ToggleOptions,
)
from cloud.training.schedules import ScheduleName  # a pure module: cloudd still imports no torch
from protocol.topics import ID_PATTERN

ModelName = Literal["digits_cnn", "anomaly_autoencoder", "scene_cnn"]
DatasetName = Literal["digits", "sensor_windows", "camera_frames"]
LossName = Literal["cross_entropy", "mse", "reconstruction"]  # the job file's [data] loss
# cloud.training.compression.wire_codec.WIRE_CODEC_NAMES (a torch module), written out; a test
# keeps the two equal.
WireCodec = Literal["fp32", "bfp8", "bfp6", "bfp4"]
UPLOAD_PREFIX = "upload:"
LEASE_FILE = "lease"  # the job's preemption lease, in its folder (cloud.training.lease)
INIT_FILE = "init.pt"  # the warm start's weights in the job's folder (cloud.jobs.prepare writes it)
FACTORY_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"
DEFAULT_FACTORY_LR = 0.05
DEFAULT_UPLOAD_TEST_FRACTION = 0.2


@dataclass(frozen=True)
class TrainableModel:
    dataset: DatasetName  # the dataset it learns from
    registry_name: str  # the name its versions get in the registry
    trainer_name: str  # the job file's [model] name: a name run.py knows, or a dotted path to the factory
    default_lr: float


TRAINABLE_MODELS: dict[str, TrainableModel] = {  # by ModelName
    "digits_cnn": TrainableModel("digits", "digits", "digits_cnn", 0.05),
    "anomaly_autoencoder": TrainableModel(
        "sensor_windows", "anomaly", "models.anomaly.anomaly_autoencoder", 0.01
    ),
    "scene_cnn": TrainableModel("camera_frames", "scene", "models.scene.scene_cnn", 0.05),
}
# Datasets built from gateways' uploads (cloud/jobs/datasets.py writes them as a tensor file), the
# loss each trains with, and the share of rows held out for the eval lines.
UPLOADED_DATASETS: dict[str, tuple[LossName, float]] = {  # by DatasetName
    "sensor_windows": ("reconstruction", 0.0),
    "camera_frames": ("cross_entropy", 0.2),
}


class SpecError(ValueError):
    """An invalid job spec; the message names the field."""


def is_factory(model: str) -> bool:
    return model not in TRAINABLE_MODELS


def upload_name(dataset: str | None) -> str | None:
    """``upload:<name>`` -> name; None for any other dataset."""
    if dataset is not None and dataset.startswith(UPLOAD_PREFIX):
        return dataset[len(UPLOAD_PREFIX) :]
    return None


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # what to train, on what
    model: str = "digits_cnn"  # a ModelName, or a factory "package.module:function"
    pythonpath: str | None = None  # factory only: a directory on cloudd's machine the trainer imports from
    dataset: str | None = None  # a DatasetName or "upload:<name>"; None: the built-in model's own
    loss: LossName | None = None  # uploads and factories: None = cross_entropy (the dataset's own otherwise)
    test_fraction: float | None = Field(None, ge=0, lt=1)  # uploads and factories: rows held out
    gateways: list[str] = Field(default_factory=list, max_length=1000)  # gateway datasets: [] = all
    registry_name: str | None = Field(None, pattern=f"^{ID_PATTERN}$")
    # how to pipeline it
    schedule: ScheduleName = "1f1b-flush"
    vertical_sync: bool = False
    nproc: int = Field(2, ge=1, le=64)
    stages: Literal["auto"] | int = "auto"
    replicas: Literal["auto"] | list[int] = "auto"
    wire_codec: WireCodec = "fp32"
    precision: Precision = "fp32"
    device: DeviceChoice = "auto"
    # how long, how fast
    epochs: int = Field(1, ge=1, le=10_000)
    max_steps: int = Field(0, ge=0)
    lr: float | None = Field(None, gt=0, le=10)
    optimizer: Literal["sgd", "adam"] = "sgd"
    # a version of the registry name this job registers under ("production": its production alias)
    # whose weights the training starts from; None: the model's own initialisation
    init_from: str | None = Field(None, pattern=f"^{ID_PATTERN}$")
    batch_size: int = Field(64, ge=1, le=65_536)
    microbatches: int = Field(4, ge=1, le=1024)
    seed: int = 0
    log_every: int = Field(1, ge=1)
    checkpoint_every: int = Field(0, ge=0)
    # the trainer's features (cloud.training.options)
    compression: CompressionOptions = CompressionOptions()
    sync: SyncOptions = SyncOptions()
    balance: BalanceOptions = BalanceOptions()
    toggle: ToggleOptions = ToggleOptions()

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if value not in TRAINABLE_MODELS and not re.match(FACTORY_PATTERN, value):
            raise ValueError(
                f"{value!r} is neither a built-in model ({', '.join(TRAINABLE_MODELS)}) nor a "
                "factory 'package.module:function'"
            )
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str | None) -> str | None:
        name = upload_name(value)
        if value is None or value in get_args(DatasetName):
            return value
        if name is None or not re.fullmatch(ID_PATTERN, name):
            raise ValueError(
                f"{value!r} is neither a built-in dataset ({', '.join(get_args(DatasetName))}) nor "
                f"'upload:<name>' with a name matching {ID_PATTERN}"
            )
        return value

    @field_validator("pythonpath")
    @classmethod
    def _pythonpath(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError(f"{value!r} must be an absolute directory on cloudd's machine")
        return value

    @field_validator("stages")
    @classmethod
    def _stages(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if value != "auto" and not 1 <= value <= 64:
            raise ValueError("must be 'auto' or a whole number of stages from 1 to 64")
        return value

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: Literal["auto"] | list[int]) -> Literal["auto"] | list[int]:
        if value != "auto" and (not value or any(r < 1 for r in value)):
            raise ValueError("must be 'auto' or a list with one count >= 1 per stage")
        return value

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        for check in (self._check_data, self._check_pipeline, self._check_features):
            check()
        return self

    def _check_data(self) -> None:
        if self.pythonpath is not None and not is_factory(self.model):
            raise ValueError("pythonpath: applies only to a model factory 'package.module:function'")
        if is_factory(self.model):
            if self.dataset is None:
                raise ValueError(
                    "dataset: a model factory needs a dataset (digits, sensor_windows, camera_frames "
                    "or upload:<name>)"
                )
            if self.registry_name is None and not re.fullmatch(ID_PATTERN, self.model.rpartition(":")[2]):
                raise ValueError("registry_name: the factory's name is too long for the registry; name it")
        else:
            # a built-in also trains on an upload of its own rows and labels (e.g. camera frames
            # labelled with the scene's truth): the prepare step checks the rows fit the model
            wanted = TRAINABLE_MODELS[self.model].dataset
            if self.dataset is not None and self.dataset != wanted and upload_name(self.dataset) is None:
                raise ValueError(
                    f"dataset: model {self.model} trains on dataset {wanted!r} or an upload:<name> of its "
                    f"own input rows, not {self.dataset!r} (another dataset needs a model factory)"
                )
        own_choice = upload_name(self.dataset) is not None or is_factory(self.model)
        if not own_choice and (self.loss is not None or self.test_fraction is not None):
            raise ValueError(
                f"loss: the built-in model {self.model} trains with its dataset's own loss and split; "
                "loss and test_fraction apply to uploads and model factories"
            )
        if self.dataset_name == "digits" and (self.loss or "cross_entropy") != "cross_entropy":
            raise ValueError("loss: dataset digits is classification: cross_entropy only")
        if self.dataset_name == "digits" and self.test_fraction is not None:
            raise ValueError("test_fraction: dataset digits has its own 80/20 split")
        if self.gateways and self.dataset_name not in UPLOADED_DATASETS:
            raise ValueError(
                f"gateways: applies only to datasets built from gateways' uploads "
                f"({', '.join(UPLOADED_DATASETS)}), not {self.dataset_name!r}"
            )

    def _check_pipeline(self) -> None:
        if self.batch_size % self.microbatches:
            raise ValueError("batch_size: must be a multiple of microbatches")
        if self.vertical_sync and self.schedule != "1f1b-stash":
            raise ValueError("vertical_sync: applies only to schedule 1f1b-stash")
        if self.replicas != "auto":
            if self.stages != "auto" and len(self.replicas) != self.stages:
                raise ValueError(f"replicas: {len(self.replicas)} counts for {self.stages} stages")
            if sum(self.replicas) != self.nproc:
                raise ValueError(
                    f"replicas: {self.replicas} add up to {sum(self.replicas)}, not nproc {self.nproc}"
                )
        elif self.stages != "auto" and self.nproc % self.stages:
            raise ValueError(
                f"stages: nproc {self.nproc} does not split into {self.stages} stages of equal replicas; "
                "give replicas per stage"
            )
        if self.schedule == "1f1b-stash" and max(self.replica_counts or [1]) > 1:
            raise ValueError("replicas: schedule 1f1b-stash runs straight pipelines (one replica per stage)")

    def _check_features(self) -> None:
        if self.compression.activations == "adaptive" and self.compression.window % self.log_every:
            raise ValueError(
                "compression.window: must be a multiple of log_every (the adaptive controller "
                "decides when every rank knows the loss)"
            )
        straight = self.replica_counts is not None and max(self.replica_counts) == 1
        if self.sync.enabled and self.optimizer != "sgd":
            raise ValueError("optimizer: the sync scheduler steps each layer with SGD; use sgd")
        for name in ("sync", "balance"):
            if getattr(self, name).enabled and (straight or self.nproc == 1 or self.schedule == "1f1b-stash"):
                raise ValueError(f"{name}.enabled: needs a replicated stage (replicas > 1 somewhere)")

    # -- derived ---------------------------------------------------------------------------------
    @property
    def replica_counts(self) -> list[int] | None:
        """Replicas per stage when the spec fixes them; None when the partitioner decides."""
        if self.replicas != "auto":
            return list(self.replicas)
        if self.stages != "auto":
            return [self.nproc // self.stages] * self.stages
        return None

    @property
    def dataset_name(self) -> str:
        return self.dataset or TRAINABLE_MODELS[self.model].dataset

    @property
    def upload(self) -> str | None:
        """The uploaded dataset's name, for ``upload:<name>``."""
        return upload_name(self.dataset)

    @property
    def data_loss(self) -> LossName:
        if self.dataset_name in UPLOADED_DATASETS and self.loss is None:
            return UPLOADED_DATASETS[self.dataset_name][0]
        return self.loss or "cross_entropy"

    @property
    def data_test_fraction(self) -> float:
        if self.test_fraction is not None:
            return self.test_fraction
        if self.dataset_name in UPLOADED_DATASETS:
            return UPLOADED_DATASETS[self.dataset_name][1]
        return DEFAULT_UPLOAD_TEST_FRACTION

    @property
    def model_name(self) -> str:
        """The registry name: ``registry_name``, the built-in's own, or the factory function's name."""
        if self.registry_name:
            return self.registry_name
        if is_factory(self.model):
            return self.model.rpartition(":")[2]
        return TRAINABLE_MODELS[self.model].registry_name

    @property
    def trainer_model(self) -> str:
        """The job file's ``[model] name``."""
        return self.model if is_factory(self.model) else TRAINABLE_MODELS[self.model].trainer_name

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return DEFAULT_FACTORY_LR if is_factory(self.model) else TRAINABLE_MODELS[self.model].default_lr

    @property
    def needs_layer_count(self) -> bool:
        """Stages given by hand: the job file's explicit layer ranges need the model's length."""
        return self.replica_counts is not None

    @property
    def min_rows(self) -> int:
        """Rows a dataset file needs so that one minibatch is left after the held-out share."""
        return math.ceil(self.batch_size / (1 - self.data_test_fraction))


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    if not field:  # a model-level check: its message starts with the field it names
        return message
    return f"{field}: {message}"


def parse_spec(
    raw: bytes | str | dict[str, Any],
    *,
    max_nproc: int,
    upload_exists: Callable[[str], bool] | None = None,
) -> JobSpec:
    """JSON text, TOML text (JSON first, then TOML) or a dict -> JobSpec, checked against this
    cloudd: its nproc limit, the datasets uploaded to it (``upload_exists``), its directories."""
    if isinstance(raw, bytes | str):
        text = raw.decode() if isinstance(raw, bytes) else raw
        try:
            raw = json.loads(text)
        except ValueError:
            try:
                raw = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise SpecError(f"spec is neither JSON nor TOML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError("spec must be a JSON object (or a TOML table)")
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_first_error(exc)) from None
    if spec.nproc > max_nproc:
        raise SpecError(f"nproc: {spec.nproc} > this cloudd's limit {max_nproc} (--max-job-nproc)")
    if spec.pythonpath is not None and not Path(spec.pythonpath).is_dir():
        raise SpecError(f"pythonpath: {spec.pythonpath} is not a directory on cloudd's machine")
    if spec.upload is not None and upload_exists is not None and not upload_exists(spec.upload):
        raise SpecError(
            f"dataset: no uploaded dataset {spec.upload!r} (cloudctl datasets upload {spec.upload} FILE)"
        )
    return spec


def job_toml(spec: JobSpec, layers: int | None = None) -> str:
    """The ``cloud.training.run`` job file for a spec (workdir-relative paths). ``layers``, the
    model's length, is needed when the spec fixes stages or replicas (explicit layer ranges)."""
    if spec.dataset_name == "digits":
        data: dict[str, Any] = {"dataset": "digits"}
    else:  # the job's dataset step wrote the data as dataset.pt in the job's folder
        data = {
            "dataset": "tensor_file",
            "path": "dataset.pt",
            "loss": spec.data_loss,
            "test_fraction": spec.data_test_fraction,
        }
    train = {
        "schedule": spec.schedule,
        "vertical_sync": spec.vertical_sync,
        "microbatches": spec.microbatches,
        "batch_size": spec.batch_size,
        "epochs": spec.epochs,
        "max_steps": spec.max_steps,
        "lr": spec.learning_rate,
        "seed": spec.seed,
        **({"optimizer": spec.optimizer} if spec.optimizer != "sgd" else {}),
        "threads": 1,
        "wire_codec": spec.wire_codec,
        # the job file's defaults are the spec's: written only when chosen
        **({"precision": spec.precision} if spec.precision != "fp32" else {}),
        **({"device": spec.device} if spec.device != "auto" else {}),
    }
    sections: list[tuple[str, dict[str, Any]]] = [
        ("model", {"name": spec.trainer_model, **({"init": INIT_FILE} if spec.init_from else {})}),
        ("data", data),
        ("train", train),
        ("checkpoint", {"dir": "checkpoints", "every": spec.checkpoint_every}),
        ("progress", {"file": "progress.jsonl", "log_every": spec.log_every}),
        ("preemption", {"lease": LEASE_FILE}),  # cloudd's scheduler may revoke it (cloud.jobs.runner)
    ]
    lines = [line for name, values in sections for line in section_lines(name, values)]
    lines += partition_lines(spec.replica_counts, layers, straight=spec.schedule == "1f1b-stash")
    # A feature section's defaults mean "off" (cloud.training.options): only what the spec changed
    # is written, and compression's two switches always, so the file reads as what the job does.
    compression = spec.compression.model_dump(exclude_defaults=True)
    lines += section_lines(
        "compression",
        {"activations": spec.compression.activations, "gist": spec.compression.gist, **compression},
    )
    for name in ("sync", "balance", "toggle"):
        if changed := getattr(spec, name).model_dump(exclude_defaults=True):
            lines += section_lines(name, changed)
    return "\n".join(lines)
