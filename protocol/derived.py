"""What the built-in services derive from their inputs, and where each task ran: the records that
make a placement plan executable (docs/placement.md, "Executing the plan").

Every body here travels as the ``body`` of a log ``Record`` of kind ``"event"`` (``type`` tells them
apart) and reaches cloudd in ordinary upload batches. The gateway writes them; cloudd's task runner
(cloud/tasks) reads them back from its store and writes the results of the tasks it ran itself.

    PlacementMarker  the gateway's sides for one service's tasks from this record on, with the
                     parameters those tasks run with; written at every start of gatewayd and at every
                     change of sides. A marker closes every sensor window open before it.
    LogGap           the LSNs [first, last] the gateway's log dropped before they were uploaded
                     (``full_policy = "drop_oldest"``): they will never arrive
    FrameForCloud    a changed camera frame whose ``infer`` runs in the cloud (the JPEG is a blob)
    InferenceResult  an inference made at the edge whose ``summarise`` runs in the cloud
    SensorAggregate  one window of one device's telemetry: count, mean, min, max per reading
    SensorDetection  the verdict on one window: normal or anomalous, with its score and severity

    CameraEvent      the result of one frame: the ``protocol.events.InferenceEvent`` it always was,
                     with its ``severity`` (``alert`` at or above the alert score) and ``ran_at``

Exactly once: a camera frame becomes exactly one of {CameraEvent made at the edge, InferenceResult,
FrameForCloud}, and cloudd turns each of the last two into exactly one CameraEvent. A sensor window
belongs to the side its marker gave ``aggregate``; its SensorAggregate and SensorDetection are made
once, where their task runs (``models.sensing`` decides windows the same way on both sides). Every
result says where each of its tasks ran (``ran_at``) and what it was made from (``input``), and a
result cloudd makes is stored under ``derived_log_id(log_id, task)`` at the LSN of its input, so
making it twice stores it once.

Invariant: every body carries ``v`` and ``type``; a reader refuses what it does not know
(ProtocolError), as for every payload in ``protocol``.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from protocol.control import Side
from protocol.errors import ProtocolError
from protocol.events import VERSION_PATTERN, InferenceEvent
from protocol.telemetry import describe_validation_error
from protocol.topics import ID_PATTERN

Severity = Literal["info", "alert"]
PlacedService = Literal["sensor", "camera"]  # the services whose tasks a plan moves
SensorTask = Literal["aggregate", "detect"]
CameraTask = Literal["infer", "summarise"]
SENSOR_TASKS: tuple[SensorTask, ...] = ("aggregate", "detect")
CAMERA_TASKS: tuple[CameraTask, ...] = ("infer", "summarise")
PLACED_TASKS: dict[PlacedService, tuple[str, ...]] = {"sensor": SENSOR_TASKS, "camera": CAMERA_TASKS}


def all_on(service: PlacedService, side: Side) -> dict[str, Side]:
    """Every placed task of ``service`` on one side: ``all_on(service, "edge")`` is how a gateway
    runs before any plan (and the cloud assumes before a log's first marker)."""
    return dict.fromkeys(PLACED_TASKS[service], side)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1


class Bounds(_Body):
    """A reading is anomalous below ``low`` or above ``high`` (either may be absent)."""

    low: float | None = None
    high: float | None = None


class SensorParams(_Body):
    """What the sensor tasks run with; the marker carries them so both sides use the same."""

    window_s: float = Field(default=1.0, gt=0)
    bounds: dict[str, Bounds] = Field(default_factory=dict)  # per reading name


class CameraParams(_Body):
    alert_score: float = Field(default=0.9, ge=0, le=1)  # a CameraEvent at or above it is an alert...
    alert_labels: list[str] = Field(default_factory=list)  # ...for these labels (empty: any label)


class PlacementMarker(_Body):
    type: Literal["placement"] = "placement"
    service: PlacedService
    sides: dict[str, Side]  # task -> where it runs from this record on
    plan: int = Field(ge=0)  # the plan version that decided it (0: before the first plan)
    reason: Literal["start", "plan"]
    sensor: SensorParams | None = None
    camera: CameraParams | None = None


class LogGap(_Body):
    type: Literal["log_gap"] = "log_gap"
    first: int = Field(ge=1)
    last: int = Field(ge=1)


class FrameForCloud(_Body):
    type: Literal["frame"] = "frame"
    source: str = Field(pattern=f"^{ID_PATTERN}$")  # the camera
    seq: int = Field(ge=0)  # the frame's capture sequence number
    capture_ts: float
    model: str = Field(pattern=f"^{ID_PATTERN}$")  # the model and version the gateway runs:
    model_version: str = Field(pattern=VERSION_PATTERN)  # the cloud infers with them
    camera: CameraParams
    blob: dict[str, Any]  # gateway.uplink.blobs.BlobRef.to_body(): id, size, sha256, content_type


class CameraEvent(InferenceEvent):
    """An inference, summarised: stored as the event of its frame (``type`` is the inference's kind).
    The gateway adds ``frame`` (``{"seq", "jpeg_bytes"}``) and ``blob`` when it spooled the JPEG."""

    severity: Severity
    ran_at: dict[CameraTask, Side]
    input: int | None = None  # made in the cloud: the LSN of the FrameForCloud / InferenceResult
    frame: dict[str, Any] | None = None
    blob: dict[str, Any] | None = None


class InferenceResult(_Body):
    type: Literal["inference"] = "inference"
    inference: InferenceEvent  # made at the edge, not summarised (severity and ran_at unset)
    camera: CameraParams
    blob: dict[str, Any] | None = None  # the frame, when the gateway spools frames


class WindowRef(_Body):
    """One sensor window: a device's telemetry records between ``first_lsn`` and ``last_lsn`` (in
    its gateway log) whose receive times fall in [start_ts, start_ts + window_s)."""

    device: str = Field(pattern=f"^{ID_PATTERN}$")
    start_ts: float
    first_lsn: int = Field(ge=1)
    last_lsn: int = Field(ge=1)


class ReadingStats(_Body):
    count: int = Field(ge=0)  # samples that had this reading (a faulty sensor reports null)
    mean: float | None = None
    min: float | None = None
    max: float | None = None


class SensorAggregate(_Body):
    type: Literal["sensor_aggregate"] = "sensor_aggregate"
    window: WindowRef
    samples: int = Field(ge=1)
    faults: int = Field(ge=0)  # samples with status "fault"
    readings: dict[str, ReadingStats]
    ran_at: dict[SensorTask, Side]  # aggregate's side, and where detect runs on this aggregate
    recovered: bool = False  # the cloud made it for an edge window whose run ended before it closed


class SensorDetection(_Body):
    type: Literal["sensor_detection"] = "sensor_detection"
    window: WindowRef
    anomalous: bool
    score: float = Field(ge=0)  # the largest excursion past a bound, in units of the bound's span
    reasons: list[str]  # e.g. "temperature_c mean 41.2 > high 40.0"
    severity: Severity
    ran_at: dict[SensorTask, Side]


DerivedBody = Annotated[
    PlacementMarker | LogGap | FrameForCloud | InferenceResult | SensorAggregate | SensorDetection,
    Field(discriminator="type"),
]
_DERIVED: TypeAdapter[DerivedBody] = TypeAdapter(DerivedBody)
DERIVED_TYPES = frozenset(
    ("placement", "log_gap", "frame", "inference", "sensor_aggregate", "sensor_detection")
)


def parse_derived(body: dict[str, Any]) -> DerivedBody:
    """The body of an event record, validated; ProtocolError ``invalid_derived`` otherwise."""
    try:
        return _DERIVED.validate_python(body)
    except ValidationError as exc:
        raise ProtocolError("invalid_derived", describe_validation_error(exc)) from None


def is_derived(body: dict[str, Any]) -> bool:
    """Whether an event body is one of these (older event bodies have other or no ``type``)."""
    return body.get("type") in DERIVED_TYPES


def derived_log_id(log_id: str, task: str) -> str:
    """The log id under which cloudd stores the results its ``task`` (``"sensor/aggregate"``, ...)
    made from a gateway log's records: hex like every log id, one per (log, task), stable across
    restarts. A result's LSN there is its input's LSN (a window's ``first_lsn``), so one input has
    one result per task."""
    return hashlib.sha256(f"{log_id}:{task}".encode()).hexdigest()[:32]
