"""The gateway heartbeat: what a gateway tells cloudd about itself, every ``interval_s`` seconds.

Sent as JSON in ``POST /v1/gateways/{gateway}/heartbeat`` with the gateway's upload token. cloudd
keeps the latest one per gateway and calls a gateway offline when none came for
``OFFLINE_AFTER_INTERVALS`` of its own declared intervals.

Invariant: a heartbeat that ``parse_heartbeat`` returns is complete and finite (every count >= 0,
every time finite); anything else is a ``ProtocolError`` naming the field.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from protocol.control import ServiceState
from protocol.errors import ProtocolError
from protocol.events import VERSION_PATTERN
from protocol.telemetry import describe_validation_error
from protocol.topics import ID_PATTERN

OFFLINE_AFTER_INTERVALS = 3
MAX_HEARTBEAT_BYTES = 64 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkEstimate(_Strict):
    """The gateway's link monitor's current view of its uplink."""

    up: bool
    rtt_ms: float | None = Field(None, ge=0)
    bandwidth_bps: float | None = Field(None, ge=0)
    availability: float | None = Field(None, ge=0, le=1)  # fraction of recent probes that got through


class PlacementDecision(_Strict):
    """Where the planner put one task of one service, and why (a short phrase)."""

    service: str = Field(max_length=64)
    task: str = Field(max_length=64)
    where: Literal["gateway", "cloud"]
    reason: str = Field("", max_length=200)


class ServiceHealth(_Strict):
    """One service of the gateway as its control plane shows it: state, and why (the error when it is
    ``degraded`` or ``failed``)."""

    service: str = Field(max_length=64)
    state: ServiceState
    detail: str = Field("", max_length=300)


class ModelFigures(_Strict):
    """One model as the gateway runs it, and how it does: figures over the window since ``version``
    started running here (``since_ts``; a swap starts a new window). ``pinned``: the operator's pin
    (None: the gateway follows cloudd's assignment); ``stage``: the assignment's stage, ``pinned``,
    ``factory``, or None (not known yet). ``shadow_agreement``: share of the ``shadow_frames`` sampled
    frames on which the previously running version gave the same label (None: no shadow ran)."""

    version: str = Field(pattern=VERSION_PATTERN)
    pinned: str | None = Field(None, pattern=VERSION_PATTERN)
    stage: str | None = Field(None, max_length=32)
    frames: int = Field(0, ge=0)
    confidence_mean: float | None = None
    shadow_agreement: float | None = Field(None, ge=0, le=1)
    shadow_frames: int = Field(0, ge=0)
    error_rate: float | None = Field(None, ge=0, le=1)
    latency_ms_p50: float | None = Field(None, ge=0)
    since_ts: float

    @field_validator("confidence_mean", "latency_ms_p50", "since_ts")
    @classmethod
    def _finite_figure(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be finite")
        return value


class GatewayCounters(_Strict):
    """The gateway's own figures for the fleet pages: its log's disk use against its budget, the
    device messages it refused by reason, and its uplink's counters (all since it started)."""

    log_bytes: int = Field(ge=0)
    log_budget_bytes: int | None = Field(None, ge=0)
    rejected: dict[str, int] = Field(default_factory=dict, max_length=64)
    uplink: dict[str, float] = Field(default_factory=dict, max_length=64)

    @field_validator("rejected", "uplink")
    @classmethod
    def _counts(cls, value: dict[str, float]) -> dict[str, float]:
        for name, count in value.items():
            if len(name) > 64 or not math.isfinite(count) or count < 0:
                raise ValueError(f"{name[:64]!r}: a name of at most 64 characters and a finite count >= 0")
        return value


class GatewayHeartbeat(_Strict):
    v: Literal[1] = 1
    gateway: str = Field(pattern=f"^{ID_PATTERN}$")
    sent_ts: float
    interval_s: float = Field(gt=0, le=3600)
    backlog_records: int = Field(0, ge=0)  # records in the log not yet acknowledged by cloudd
    backlog_bytes: int = Field(0, ge=0)
    link: LinkEstimate | None = None
    placement: list[PlacementDecision] = Field(default_factory=list, max_length=256)
    services: list[ServiceHealth] = Field(default_factory=list, max_length=32)
    software: str | None = Field(None, max_length=64)
    # optional, so cloudd of any version parses a heartbeat without it (the sender leaves it out when empty)
    models: dict[Annotated[str, StringConstraints(pattern=f"^{ID_PATTERN}$")], ModelFigures] | None = Field(
        None, max_length=16
    )
    counters: GatewayCounters | None = None  # absent from gateways older than issue 27

    @field_validator("sent_ts")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value) or value < 0:
            raise ValueError("must be a finite, non-negative unix time")
        return value


def parse_heartbeat(body: bytes) -> GatewayHeartbeat:
    if len(body) > MAX_HEARTBEAT_BYTES:
        raise ProtocolError("too_large", f"heartbeat is {len(body)} bytes > {MAX_HEARTBEAT_BYTES}")
    try:
        return GatewayHeartbeat.model_validate_json(body)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ProtocolError("not_json", "heartbeat body is not JSON") from None
        raise ProtocolError("invalid", describe_validation_error(exc)) from None


def is_online(last_heartbeat_ts: float | None, interval_s: float | None, now: float) -> bool:
    """Online while the last heartbeat is younger than OFFLINE_AFTER_INTERVALS of its interval."""
    if last_heartbeat_ts is None or interval_s is None:
        return False
    return now - last_heartbeat_ts <= OFFLINE_AFTER_INTERVALS * interval_s
