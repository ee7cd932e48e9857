"""The record: one entry of the gateway's log and one element of an upload batch.

A record is compact JSON (``encode_record``), so the gateway can put log bytes into an upload
body without parsing them again. ``kind`` says what ``body`` holds:

    telemetry   a validated `Telemetry` message, as the device sent it
    event       something the gateway derived (an anomaly, a detection), see later issues
    update      a federated model update (protocol.federated.UpdateEnvelope)
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol.errors import ProtocolError
from protocol.telemetry import describe_validation_error
from protocol.topics import ID_PATTERN, check_id

RecordKind = Literal["telemetry", "event", "update"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    kind: RecordKind
    device: str = Field(pattern=f"^{ID_PATTERN}$")
    received_ts: float
    body: dict[str, Any]


def encode_record(record: Record) -> bytes:
    return record.model_dump_json().encode()


def decode_record(data: bytes) -> Record:
    try:
        return Record.model_validate_json(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_record", describe_validation_error(exc)) from None


def telemetry_record(device: str, received_ts: float, body_json: bytes) -> bytes:
    """Encode a telemetry record around the device's (already validated) JSON payload: the bytes
    ``encode_record`` gives for that Record, made without building one (this runs per message)."""
    check_id("device", device)
    body = pydantic_core.from_json(body_json)
    if type(body) is not dict:
        raise ProtocolError("invalid_record", "body: a telemetry payload must be a JSON object")
    record = {"v": 1, "kind": "telemetry", "device": device, "received_ts": float(received_ts), "body": body}
    return pydantic_core.to_json(record, inf_nan_mode="null")  # as a model dumps them


def event_record(device: str, received_ts: float, body: dict[str, Any]) -> bytes:
    """Encode an event record: a result the gateway made (protocol.derived, protocol.events) or a
    notice of its own."""
    return encode_record(Record(kind="event", device=device, received_ts=received_ts, body=body))
