"""The sensor service's ``aggregate`` and ``detect`` tasks, the same code at the edge and in the cloud.

``WindowBook`` cuts one gateway log's telemetry into windows and says when each closes; both sides
feed it the same records in LSN order, so they agree on every window without talking:

- a window is one device's telemetry records whose receive time (the gateway's ``received_ts``) falls
  in ``[k * window_s, (k + 1) * window_s)``, for one integer k, between two placement markers;
- it closes at the first of: a record of the same device in a later window; any record received at
  or after ``(k + 2) * window_s`` (one window of grace: a silent device's window closes too); a
  placement marker (which closes every open window and sets the sides and parameters of the windows
  opened after it).

The sides a window's tasks run on are those in force when its first record came (``Window.sides``).
``aggregate`` and ``detect`` are pure functions of a closed window and the parameters it was opened
under. Nothing here does I/O; a window keeps running sums, not its samples.

Invariant: every telemetry record fed belongs to exactly one window, and every window is returned
closed exactly once (by ``feed``, ``feed_marker`` or ``close_due``), in LSN order of its closing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from protocol.control import Side
from protocol.derived import (
    PlacementMarker,
    ReadingStats,
    SensorAggregate,
    SensorDetection,
    SensorParams,
    WindowRef,
)


@dataclass
class _Running:
    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def stats(self) -> ReadingStats:
        if self.count == 0:
            return ReadingStats(count=0)
        return ReadingStats(count=self.count, mean=self.total / self.count, min=self.low, max=self.high)


@dataclass
class Window:
    device: str
    index: int  # k: the window covers receive times [k * window_s, (k + 1) * window_s)
    first_lsn: int
    last_lsn: int
    sides: dict[str, Side]  # where aggregate and detect run for this window
    params: SensorParams
    samples: int = 0
    faults: int = 0
    readings: dict[str, _Running] = field(default_factory=dict)

    @property
    def ref(self) -> WindowRef:
        return WindowRef(
            device=self.device,
            start_ts=self.index * self.params.window_s,
            first_lsn=self.first_lsn,
            last_lsn=self.last_lsn,
        )

    def add(self, lsn: int, telemetry: dict[str, Any]) -> None:
        self.last_lsn = lsn
        self.samples += 1
        if telemetry.get("status") == "fault":
            self.faults += 1
        for name, value in (telemetry.get("readings") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self.readings.setdefault(name, _Running()).add(float(value))


class WindowBook:
    """The open windows of one gateway log, fed its records in LSN order (see the module docstring).

    ``sides`` and ``params`` are those of the marker in force; before the first marker, ``initial``.
    """

    def __init__(self, sides: dict[str, Side], params: SensorParams) -> None:
        self.sides = dict(sides)
        self.params = params
        self._open: dict[str, Window] = {}  # device -> its open window

    def __len__(self) -> int:
        return len(self._open)

    def feed(self, lsn: int, device: str, received_ts: float, telemetry: dict[str, Any]) -> list[Window]:
        """One telemetry record; returns the windows it closed (the device's earlier one, and any
        window its receive time passed the grace of), oldest first."""
        index = math.floor(received_ts / self.params.window_s)
        closed = self._close_expired(received_ts)
        current = self._open.get(device)
        if current is not None and current.index != index:
            closed.append(self._open.pop(device))
            current = None
        if current is None:
            current = self._open[device] = Window(device, index, lsn, lsn, dict(self.sides), self.params)
        current.add(lsn, telemetry)
        return closed

    def feed_marker(self, marker: PlacementMarker) -> list[Window]:
        """A placement marker of the sensor service: closes every open window; the sides and
        parameters it carries apply to the windows opened after it."""
        closed = self.close_all()
        self.sides = dict(marker.sides)
        if marker.sensor is not None:
            self.params = marker.sensor
        return closed

    def feed_other(self, received_ts: float) -> list[Window]:
        """Any other record (an event, another service's marker): it can only close by time."""
        return self._close_expired(received_ts)

    def close_due(self, now_ts: float) -> list[Window]:
        """The windows a record received now would close by time (the edge's timer for silence)."""
        return self._close_expired(now_ts)

    def close_all(self) -> list[Window]:
        closed = sorted(self._open.values(), key=lambda w: w.first_lsn)
        self._open.clear()
        return closed

    def _close_expired(self, received_ts: float) -> list[Window]:
        horizon = math.floor(received_ts / self.params.window_s) - 1  # windows before it are past grace
        expired = [w for w in self._open.values() if w.index < horizon]
        for window in expired:
            del self._open[window.device]
        return sorted(expired, key=lambda w: w.first_lsn)


def aggregate(window: Window, *, recovered: bool = False) -> SensorAggregate:
    """The ``aggregate`` task: count, mean, min and max of each reading over the window."""
    return SensorAggregate(
        window=window.ref,
        samples=window.samples,
        faults=window.faults,
        readings={name: running.stats() for name, running in sorted(window.readings.items())},
        ran_at={"aggregate": window.sides["aggregate"], "detect": window.sides["detect"]},
        recovered=recovered,
    )


def detect(agg: SensorAggregate, params: SensorParams) -> SensorDetection:
    """The ``detect`` task: a window is anomalous when a reading's mean leaves its bounds, or a
    sample reported a fault. The score is the largest excursion past a bound, in units of the
    bound's span (or of the bound itself when only one side is set)."""
    reasons: list[str] = []
    score = 0.0
    for name, bounds in sorted(params.bounds.items()):
        mean = agg.readings.get(name, ReadingStats(count=0)).mean
        if mean is None:
            continue
        span = _span(bounds.low, bounds.high)
        if bounds.high is not None and mean > bounds.high:
            reasons.append(f"{name} mean {mean:.3g} > high {bounds.high:.3g}")
            score = max(score, (mean - bounds.high) / span)
        if bounds.low is not None and mean < bounds.low:
            reasons.append(f"{name} mean {mean:.3g} < low {bounds.low:.3g}")
            score = max(score, (bounds.low - mean) / span)
    if agg.faults:
        reasons.append(f"{agg.faults} of {agg.samples} samples reported a fault")
        score = max(score, agg.faults / agg.samples)
    return SensorDetection(
        window=agg.window,
        anomalous=bool(reasons),
        score=score,
        reasons=reasons,
        severity="alert" if reasons else "info",
        ran_at=dict(agg.ran_at),
    )


def _span(low: float | None, high: float | None) -> float:
    if low is not None and high is not None and high > low:
        return high - low
    one = high if high is not None else low
    return abs(one) if one else 1.0
