"""Device telemetry: the JSON a sensor publishes on its telemetry topic.

Example (schema version 1)::

    {"v": 1, "device": "sensor-000", "seq": 41, "ts": 1764489600.25,
     "readings": {"temperature_c": 21.4, "humidity_pct": 55.2, "soil_moisture_pct": 31.0},
     "status": "ok"}

``seq`` counts a device's messages from 0 and is what end-to-end checks match on. A faulty
sensor reports ``"status": "fault"`` with the failed readings set to ``null``.

Invariant: every field is strict (``strict=True``, ``v`` a ``SchemaVersion``): a value of another
JSON type is refused, never converted (``"v": true``, ``"seq": 1.0``, ``"readings": {"t": true}``).
An integer is taken where a number is meant (``ts``, readings).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from protocol.errors import ProtocolError
from protocol.strict import SchemaVersion
from protocol.topics import ID_PATTERN

MAX_TELEMETRY_BYTES = 16 * 1024
READING_NAMES = ("temperature_c", "humidity_pct", "soil_moisture_pct")


class Telemetry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    v: SchemaVersion  # strict: ``true`` or ``1.0`` is refused (a bare Literal[1] would take both)
    device: str = Field(pattern=f"^{ID_PATTERN}$")
    seq: int = Field(ge=0)
    ts: float
    readings: dict[str, float | None] = Field(max_length=32)
    status: Literal["ok", "fault"] = "ok"

    @field_validator("ts")
    @classmethod
    def _finite_ts(cls, value: float) -> float:
        if not math.isfinite(value) or value < 0:
            raise ValueError("must be a finite, non-negative unix time")
        return value

    @field_validator("readings")
    @classmethod
    def _finite_readings(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        for name, reading in value.items():
            if reading is not None and not math.isfinite(reading):
                raise ValueError(f"reading {name!r} must be finite or null")
        return value


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming each offending field and why, e.g. ``seq: Input should be a valid integer``."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "<payload>"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def parse_telemetry(payload: bytes) -> Telemetry:
    """Validate a raw MQTT payload; raise ProtocolError with reason too_large|not_json|invalid."""
    if len(payload) > MAX_TELEMETRY_BYTES:
        raise ProtocolError("too_large", f"{len(payload)} bytes > limit {MAX_TELEMETRY_BYTES}")
    try:
        return Telemetry.model_validate_json(payload)
    except ValidationError as exc:
        if any(err["type"] == "json_invalid" for err in exc.errors()):
            raise ProtocolError("not_json", "payload is not valid JSON") from None
        raise ProtocolError("invalid", describe_validation_error(exc)) from None
