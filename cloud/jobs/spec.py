"""JobSpec: what a user asks cloudd to train (validated once, at submission), and its job TOML.

Invariant: a ``JobSpec`` is consistent (the model fits the dataset, batch_size is a multiple of
microbatches); ``parse_spec`` turns anything else into ``SpecError`` whose message names the field.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cloud.training.schedules import ScheduleName  # a pure module: cloudd still imports no torch
from protocol.topics import ID_PATTERN

ModelName = Literal["digits_cnn", "anomaly_autoencoder", "scene_cnn"]
DatasetName = Literal["digits", "sensor_windows", "camera_frames"]
LossName = Literal["cross_entropy", "reconstruction"]  # the job file's [data] loss for uploaded datasets


@dataclass(frozen=True)
class TrainableModel:
    dataset: DatasetName  # the dataset it learns from
    registry_name: str  # the name its versions get in the registry
    trainer_name: str  # the job file's [model] name: a name run.py knows, or a dotted path to the factory
    default_lr: float


TRAINABLE_MODELS: dict[ModelName, TrainableModel] = {
    "digits_cnn": TrainableModel("digits", "digits", "digits_cnn", 0.05),
    "anomaly_autoencoder": TrainableModel(
        "sensor_windows", "anomaly", "models.anomaly.anomaly_autoencoder", 0.01
    ),
    "scene_cnn": TrainableModel("camera_frames", "scene", "models.scene.scene_cnn", 0.05),
}
# Datasets built from gateways' uploads (cloud/jobs/datasets.py writes them as a tensor file), the
# loss each trains with, and the share of rows held out for the eval lines.
UPLOADED_DATASETS: dict[DatasetName, tuple[LossName, float]] = {
    "sensor_windows": ("reconstruction", 0.0),
    "camera_frames": ("cross_entropy", 0.2),
}


class SpecError(ValueError):
    """An invalid job spec; the message names the field."""


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelName = "digits_cnn"
    dataset: DatasetName | None = None  # None: the model's own
    gateways: list[str] = Field(default_factory=list, max_length=1000)  # uploaded datasets: [] = all
    registry_name: str | None = Field(None, pattern=f"^{ID_PATTERN}$")
    schedule: ScheduleName = "1f1b-flush"
    nproc: int = Field(2, ge=1, le=64)
    epochs: int = Field(1, ge=1, le=10_000)
    max_steps: int = Field(0, ge=0)
    lr: float | None = Field(None, gt=0, le=10)
    batch_size: int = Field(64, ge=1, le=65_536)
    microbatches: int = Field(4, ge=1, le=1024)
    seed: int = 0
    log_every: int = Field(1, ge=1)
    checkpoint_every: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        wanted = TRAINABLE_MODELS[self.model].dataset
        if self.dataset is not None and self.dataset != wanted:
            raise ValueError(f"model {self.model} trains on dataset {wanted!r}, not {self.dataset!r}")
        if self.batch_size % self.microbatches:
            raise ValueError("batch_size must be a multiple of microbatches")
        if self.gateways and wanted not in UPLOADED_DATASETS:
            raise ValueError(
                f"gateways applies only to datasets built from uploads "
                f"({', '.join(UPLOADED_DATASETS)}), not {wanted!r}"
            )
        return self

    @property
    def dataset_name(self) -> DatasetName:
        return self.dataset or TRAINABLE_MODELS[self.model].dataset

    @property
    def model_name(self) -> str:
        return self.registry_name or TRAINABLE_MODELS[self.model].registry_name

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else TRAINABLE_MODELS[self.model].default_lr

    @property
    def min_rows(self) -> int:
        """Rows an uploaded dataset needs so that one minibatch is left after the held-out share."""
        _, test_fraction = UPLOADED_DATASETS[self.dataset_name]
        return math.ceil(self.batch_size / (1 - test_fraction))


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "spec"
    return f"{field}: {first['msg']}"


def parse_spec(raw: bytes | str | dict[str, Any], *, max_nproc: int) -> JobSpec:
    """JSON text, TOML text (``toml:`` never guessed: JSON first, then TOML) or a dict -> JobSpec."""
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
    return spec


def job_toml(spec: JobSpec) -> str:
    """The ``cloud.training.run`` job file for a spec (workdir-relative paths)."""
    lines = [
        "[model]",
        f'name = "{TRAINABLE_MODELS[spec.model].trainer_name}"',
        "",
        "[train]",
        f'schedule = "{spec.schedule}"',
        f"microbatches = {spec.microbatches}",
        f"batch_size = {spec.batch_size}",
        f"epochs = {spec.epochs}",
        f"max_steps = {spec.max_steps}",
        f"lr = {spec.learning_rate!r}",
        f"seed = {spec.seed}",
        "threads = 1",
        "",
        # even: no profiling or bandwidth probe before the first step; jobs start at once
        "[partition]",
        'mode = "even"',
        "",
        "[checkpoint]",
        'dir = "checkpoints"',
        f"every = {spec.checkpoint_every}",
        "",
        "[progress]",
        'file = "progress.jsonl"',
        f"log_every = {spec.log_every}",
        "",
    ]
    if spec.dataset_name == "digits":
        lines[3:3] = ["[data]", 'dataset = "digits"', ""]
    else:  # cloud.jobs.datasets wrote the uploads as dataset.pt in the job's folder
        loss, test_fraction = UPLOADED_DATASETS[spec.dataset_name]
        lines[3:3] = [
            "[data]",
            'dataset = "tensor_file"',
            'path = "dataset.pt"',
            f'loss = "{loss}"',
            f"test_fraction = {test_fraction}",
            "",
        ]
    return "\n".join(lines)
