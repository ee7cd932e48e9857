"""The control plane's payloads: per-service desired config, requests, responses (docs/mqtt-api.md).

    DesiredConfig    the whole desired configuration, one section per service (the unit of a revision)
    <Op>Request      one pydantic model per operation, named by the request topic's ``<op>``
    ControlResponse  what the gateway answers: status ok (+ data) or error (reason, field, detail)
    StoredControl    what the gateway keeps on disk: the revision and the fields set over MQTT

Example request on ``edgefed/gw1/control/request/config.patch``::

    {"service": "sensor", "patch": {"allow": ["sensor-*"]}, "revision": 7,
     "correlation_id": "c1", "response_topic": "edgefed/gw1/control/response/ops-laptop"}

Invariant: a request or a config object exists only if it is valid; every refusal is a
``ControlError`` whose ``field`` names the offending field (dotted path) and ``detail`` says why.
Unknown fields are refused everywhere, so a misspelt key can never be silently ignored, and every
type is strict, so a value of another JSON type is refused, never converted: ``"enabled": "yes"``
or ``1`` is not a boolean, ``"revision": "7"`` or ``7.0`` not an integer, ``"v": true`` not 1.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from protocol.errors import ProtocolError
from protocol.events import VERSION_PATTERN
from protocol.strict import SchemaVersion
from protocol.topics import ID_PATTERN

MAX_REQUEST_BYTES = 64 * 1024
MAX_LOG_LINES = 500  # the most lines one log.errors answer holds
ServiceName = Literal["sensor", "camera", "training", "models", "placement", "gateway"]
SERVICE_NAMES: tuple[ServiceName, ...] = get_args(ServiceName)
# what a service's handler reports; degraded: applied and running, but a worker is backing off after errors
ServiceState = Literal["running", "degraded", "stopped", "pending", "failed"]
ResponseStatus = Literal["ok", "error"]
StartableService = Literal["sensor", "camera", "training"]
Side = Literal["edge", "cloud"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
DevicePattern = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.*?\[\]!-]{1,64}$")]
Id = Annotated[str, StringConstraints(pattern=f"^{ID_PATTERN}$")]
Version = Annotated[str, StringConstraints(pattern=VERSION_PATTERN)]
TaskKey = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}/[A-Za-z0-9_-]{1,64}$")]
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
CAMERA_SCHEMES = ("http", "https", "rtsp", "rtsps", "file")


class ControlError(ProtocolError):
    """A refused request: ``reason`` (stable token), ``field`` (dotted path or None), ``detail``."""

    def __init__(self, reason: str, detail: str, field: str | None = None) -> None:
        super().__init__(reason, f"{field}: {detail}" if field else detail)
        self.field = field
        self.why = detail


def control_error_from(exc: ValidationError, prefix: str = "") -> ControlError:
    """The first offending field names the error; the detail lists every one (``a.b: why; c: why``)."""
    errors = exc.errors()
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in (prefix.split(".") if prefix else []) + list(err["loc"]))
        parts.append(f"{where or '<payload>'}: {err['msg']}")
    first = ".".join(str(p) for p in (prefix.split(".") if prefix else []) + list(errors[0]["loc"]))
    return ControlError("invalid", "; ".join(parts), field=first or "<payload>")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- desired configuration ---------------------------------------------------------------------------


class SensorSettings(_Model):
    enabled: bool = True
    allow: list[DevicePattern] = Field(default_factory=lambda: ["*"], max_length=1024)


class CameraSettings(_Model):
    enabled: bool = False
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="a file path, an http(s)/rtsp(s) URL or a device index",
    )
    sample_fps: float | None = Field(default=None, gt=0, le=120)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if _CONTROL_CHARS.search(value):
            raise ValueError("must not contain control characters")
        if "://" in value and value.split("://", 1)[0].lower() not in CAMERA_SCHEMES:
            raise ValueError(f"URL scheme must be one of {', '.join(CAMERA_SCHEMES)}")
        return value


class TrainingSettings(_Model):
    enabled: bool = False
    private: bool = Field(
        default=True,
        description="raw data may not leave the gateway: always train "
        "locally; false lets the link decide (docs/federated.md)",
    )


class ModelsSettings(_Model):
    pins: dict[Id, Version] = Field(
        default_factory=dict,
        max_length=256,
        description="model name -> pinned version (absent: follow cloudd's assignment)",
    )


class PlacementSettings(_Model):
    pins: dict[TaskKey, Side] = Field(
        default_factory=dict,
        max_length=256,
        description='"<service>/<task>" -> edge | cloud (absent: planner)',
    )


class GatewaySettings(_Model):
    log_level: LogLevel = "INFO"


SETTINGS_MODELS: dict[str, type[_Model]] = {
    "sensor": SensorSettings,
    "camera": CameraSettings,
    "training": TrainingSettings,
    "models": ModelsSettings,
    "placement": PlacementSettings,
    "gateway": GatewaySettings,
}


class DesiredConfig(_Model):
    sensor: SensorSettings = Field(default_factory=SensorSettings)
    camera: CameraSettings = Field(default_factory=CameraSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)


class StoredControl(_Model):
    """``<data_dir>/control/desired.json``: the fields operators set over MQTT, over the file's values."""

    v: SchemaVersion = 1
    revision: int = Field(default=0, ge=0)
    overrides: dict[ServiceName, dict[str, Any]] = Field(default_factory=dict)
    updated_ts: float = 0.0


# --- requests ----------------------------------------------------------------------------------------


class _Request(_Model):
    v: SchemaVersion = 1
    correlation_id: str | None = Field(
        default=None, max_length=128, description="MQTT 3.1.1 fallback for v5 Correlation Data (echoed)"
    )
    response_topic: str | None = Field(
        default=None, max_length=256, description="MQTT 3.1.1 fallback for the v5 Response Topic"
    )


class _Change(_Request):
    revision: int | None = Field(
        default=None, ge=0, description="the revision this change is based on; refused if stale"
    )


class ServicesListRequest(_Request):
    pass


class StatusRequest(_Request):
    pass


class ConfigGetRequest(_Request):
    service: ServiceName


class ConfigSetRequest(_Change):
    service: ServiceName
    config: dict[str, Any]


class ConfigPatchRequest(_Change):
    service: ServiceName
    patch: dict[str, Any] = Field(description="JSON merge patch (RFC 7386): null removes a key")


class ServiceStartRequest(_Change):
    service: StartableService


class ServiceStopRequest(_Change):
    service: StartableService


class ServiceRestartRequest(_Request):
    """Stop and start a running service with its desired config, which stays as it is (no revision)."""

    service: StartableService


class DeviceAddRequest(_Change):
    device: DevicePattern


class DeviceRemoveRequest(_Change):
    device: DevicePattern


class CameraSourceRequest(_Change):
    source: str
    sample_fps: float | None = None


class ModelPinRequest(_Change):
    model: Id
    version: Version | None = Field(description="null unpins")


class PlacementPinRequest(_Change):
    service: Id
    task: Id
    where: Side | None = Field(description="null unpins")


class LogLevelRequest(_Change):
    level: LogLevel


class LogErrorsRequest(_Request):
    limit: int = Field(default=50, ge=1, le=MAX_LOG_LINES)
    level: Literal["INFO", "WARNING", "ERROR"] = Field(default="WARNING", description="this level and up")
    after: str | None = Field(
        default=None,
        max_length=64,
        description="a cursor (an answer's next): the lines after it, oldest first",
    )


class DevicesListRequest(_Request):
    pass


class LogVerifyRequest(_Request):
    wait_s: float = Field(default=0.0, ge=0, le=60, description="how long to wait for the pass to end")


OPS: dict[str, type[_Request]] = {
    "services.list": ServicesListRequest,
    "status.get": StatusRequest,
    "config.get": ConfigGetRequest,
    "config.set": ConfigSetRequest,
    "config.patch": ConfigPatchRequest,
    "service.start": ServiceStartRequest,
    "service.stop": ServiceStopRequest,
    "service.restart": ServiceRestartRequest,
    "device.add": DeviceAddRequest,
    "device.remove": DeviceRemoveRequest,
    "camera.source": CameraSourceRequest,
    "model.pin": ModelPinRequest,
    "placement.pin": PlacementPinRequest,
    "log.level": LogLevelRequest,
    "log.errors": LogErrorsRequest,
    "devices.list": DevicesListRequest,
    "log.verify": LogVerifyRequest,
}
READ_ONLY_OPS = frozenset(
    {"services.list", "status.get", "config.get", "log.errors", "devices.list", "log.verify"}
)


def peek_reply_fields(payload: bytes) -> tuple[str | None, str | None]:
    """(response_topic, correlation_id) from a payload, leniently: so even a refused request is answered."""
    if len(payload) > MAX_REQUEST_BYTES:
        return None, None
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    topic, correlation = data.get("response_topic"), data.get("correlation_id")
    return (
        topic if isinstance(topic, str) and len(topic) <= 256 else None,
        correlation if isinstance(correlation, str) and len(correlation) <= 128 else None,
    )


def parse_request(op: str, payload: bytes) -> _Request:
    """Validate one request; raise ControlError (unknown_op | too_large | not_json | invalid)."""
    kind = OPS.get(op)
    if kind is None:
        raise ControlError(
            "unknown_op", f"unknown operation {op[:64]!r}; known: {', '.join(sorted(OPS))}", field="op"
        )
    if len(payload) > MAX_REQUEST_BYTES:
        raise ControlError(
            "too_large", f"{len(payload)} bytes > limit {MAX_REQUEST_BYTES}", field="<payload>"
        )
    try:
        return kind.model_validate_json(payload or b"{}")
    except ValidationError as exc:
        if any(err["type"] == "json_invalid" for err in exc.errors()):
            raise ControlError("not_json", "payload is not valid JSON", field="<payload>") from None
        raise control_error_from(exc) from None


# --- responses ---------------------------------------------------------------------------------------


class ErrorBody(_Model):
    reason: str
    field: str | None = None
    detail: str


class ControlResponse(_Model):
    v: SchemaVersion = 1
    op: str
    status: ResponseStatus
    correlation_id: str | None = None
    revision: int = Field(ge=0, description="the config revision after this request")
    digest: str = Field(description="sha256 of the effective config after this request")
    data: dict[str, Any] | None = None
    error: ErrorBody | None = None


def parse_response(payload: bytes | str) -> ControlResponse:
    try:
        return ControlResponse.model_validate_json(payload)
    except ValidationError as exc:
        raise control_error_from(exc) from None
