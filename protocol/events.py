"""What the camera path and over-the-air models put across process boundaries.

    ModelMetadata  metadata.json beside an ONNX file: the artifact's name, version, input spec,
                   labels and the sha256 of the ONNX bytes (registry upload, download, gateway load)
    ModelNotice    retained MQTT payload on ``edgefed/<gw>/models/<name>``: "version V is current"
    InferenceEvent the ``body`` of a Record of kind "event" that gateway inference produces
    ModelSwap      the ``body`` of a Record of kind "event" that a gateway writes at each model swap
                   or rollback (the uplink carries it to cloudd like any event)

Example notice::

    {"v": 1, "name": "scene", "version": "3", "sha256": "9f2c...", "size": 181234}

Example event body::

    {"v": 1, "type": "classification", "source": "cam1", "seq": 812, "capture_ts": 1764489600.25,
     "model": "scene", "model_version": "3", "label": "circle", "score": 0.97}

Invariant: every payload carries ``v``; a reader refuses an unknown version (ProtocolError).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol.errors import ProtocolError
from protocol.telemetry import describe_validation_error
from protocol.topics import ID_PATTERN

SHA256_PATTERN = r"^[0-9a-f]{64}$"
VERSION_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
Preprocess = Literal["image_rgb01", "none"]
Postprocess = Literal["softmax_labels", "reconstruction_error"]
InferenceKind = Literal["classification", "anomaly"]  # what postprocess made of the output


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Payload):
    name: str = "input"
    shape: list[int | None] = Field(min_length=1, max_length=6, description="None = dynamic (batch)")
    dtype: Literal["float32"] = "float32"
    preprocess: Preprocess
    mean: list[float] | None = None  # per-channel, applied after preprocess
    std: list[float] | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One input's shape: ``shape`` without the batch dimension, which alone may be dynamic
        (ValueError otherwise)."""
        dims = tuple(d for d in self.shape[1:] if d is not None)
        if len(dims) != len(self.shape) - 1:
            raise ValueError(f"input {self.name!r} has a dynamic dimension besides the batch: {self.shape}")
        return dims


class ModelMetadata(_Payload):
    v: Literal[1] = 1
    name: str = Field(pattern=f"^{ID_PATTERN}$")
    version: str = Field(pattern=VERSION_PATTERN)
    input: InputSpec
    output_name: str = "output"
    postprocess: Postprocess
    labels: list[str] = Field(default_factory=list, max_length=10_000)
    threshold: float | None = None  # reconstruction_error: a window above it is an anomaly
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=1)
    created_ts: float = 0.0
    notes: dict[str, Any] = Field(default_factory=dict)


class ModelNotice(_Payload):
    v: Literal[1] = 1
    name: str = Field(pattern=f"^{ID_PATTERN}$")
    version: str = Field(pattern=VERSION_PATTERN)
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=1)


class InferenceEvent(_Payload):
    v: Literal[1] = 1
    type: InferenceKind
    source: str = Field(pattern=f"^{ID_PATTERN}$")
    seq: int = Field(ge=0)
    capture_ts: float
    model: str
    model_version: str
    label: str
    score: float


class ModelSwap(_Payload):
    """The model a camera runs changed: ``from_version`` (None: nothing ran) -> ``to``, and why
    (``pin``, ``unpin``, ``assignment: <cloudd's reason>``, ``factory fallback: ...``, ``restart``);
    ``stage`` is the new version's (the assignment's, ``pinned`` or ``factory``). Serialised by alias:
    ``{"v": 1, "type": "model_swap", "name", "from", "to", "reason", "stage", "ts"}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    v: Literal[1] = 1
    type: Literal["model_swap"] = "model_swap"
    name: str = Field(pattern=f"^{ID_PATTERN}$")
    from_version: str | None = Field(None, alias="from", pattern=VERSION_PATTERN)
    to: str = Field(pattern=VERSION_PATTERN)
    reason: str = Field(max_length=300)
    stage: str | None = Field(None, max_length=32)
    ts: float


def _parse(kind: type[BaseModel], what: str, data: bytes | str) -> Any:
    try:
        return kind.model_validate_json(data)
    except ValidationError as exc:
        raise ProtocolError(f"invalid_{what}", describe_validation_error(exc)) from None


def parse_model_metadata(data: bytes | str) -> ModelMetadata:
    return _parse(ModelMetadata, "model_metadata", data)


def parse_model_notice(data: bytes | str) -> ModelNotice:
    return _parse(ModelNotice, "model_notice", data)


def parse_inference_event(data: bytes | str) -> InferenceEvent:
    return _parse(InferenceEvent, "event", data)
