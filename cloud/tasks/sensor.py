"""The cloud's half of the sensor service: replays one gateway log's records, in LSN order, through
the same ``models.sensing.WindowBook`` the gateway ran, and makes the results the cloud owns.

For each window the book closes:
- ``aggregate`` in the cloud: its SensorAggregate, and its SensorDetection when ``detect`` is in the
  cloud too;
- ``aggregate`` at the edge: nothing yet. The edge's SensorAggregate comes in the log before the next
  marker (the gateway closes its windows before it writes one); when it comes and ``detect`` runs in
  the cloud, the detection is made from it. A window still without its edge aggregate when the next
  marker comes belongs to a gatewayd that stopped before closing it (a crash): the cloud makes its
  aggregate and detection itself (``recovered``, ``ran_at`` cloud).

No I/O here: ``feed`` takes records and returns results. Every result is keyed by its window's first
LSN, so the runner stores it once however often it is made.

Invariant: every window the book closes under a marker gets exactly one SensorAggregate (the edge's
or one made here) and, when its aggregate exists, exactly one SensorDetection; ``oldest_needed``
is the LSN a replay must start from to rebuild this state (no open or pending window starts before it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.sensing import Window, WindowBook, aggregate, detect
from protocol.derived import PlacementMarker, SensorAggregate, SensorDetection, SensorParams, all_on

AGGREGATE_TASK = "sensor/aggregate"
DETECT_TASK = "sensor/detect"


@dataclass(frozen=True)
class Result:
    """One result the cloud made: stored under ``derived_log_id(log_id, task)`` at ``lsn``."""

    task: str
    lsn: int  # its input's LSN in the gateway log (a window's first LSN, a frame record's LSN)
    device: str
    body: dict[str, Any]


class SensorReplay:
    """The sensor state of one gateway log. ``marker`` is the sensor marker in force, if any: before
    the first one the gateway's tasks ran as they always did (at the edge), and no window is
    recovered, since none is known to be owned."""

    def __init__(self, marker: PlacementMarker | None) -> None:
        self.marker = marker
        params = marker.sensor if marker is not None and marker.sensor is not None else SensorParams()
        self.book = WindowBook(dict(marker.sides) if marker else all_on("sensor", "edge"), params)
        self._pending: dict[int, Window] = {}  # edge windows closed here, awaiting the edge aggregate
        self._edge_done: set[int] = set()  # first LSNs of edge aggregates seen before we closed the window
        self._open: dict[str, int] = {}  # device -> first LSN of its open window (the book's, mirrored)
        self.counters = {"windows": 0, "recovered": 0, "edge_aggregates": 0}

    def oldest_needed(self, next_lsn: int) -> int:
        """The LSN to replay from to rebuild this state: the first LSN of the oldest open or
        pending window, else ``next_lsn``."""
        return min([*self._open.values(), *self._pending, next_lsn])

    def feed_telemetry(self, lsn: int, device: str, received_ts: float, body: dict[str, Any]) -> list[Result]:
        results = self._decide(self.book.feed(lsn, device, received_ts, body))
        self._open.setdefault(device, lsn)  # its window was just opened unless it was open already
        return results

    def feed_other(self, received_ts: float) -> list[Result]:
        return self._decide(self.book.feed_other(received_ts))

    def feed_marker(self, marker: PlacementMarker) -> list[Result]:
        """A sensor marker: the windows it closes are decided under the old marker, and every edge
        window still without its edge aggregate is recovered here."""
        results = self._decide(self.book.feed_marker(marker))
        if self.marker is not None:
            for window in sorted(self._pending.values(), key=lambda w: w.first_lsn):
                results += self._recover(window)
        self._pending.clear()
        self._edge_done.clear()
        self.marker = marker
        return results

    def feed_edge_aggregate(self, received_ts: float, agg: SensorAggregate) -> list[Result]:
        """An edge SensorAggregate: it settles its window; the detection is made here when its
        ``detect`` runs in the cloud."""
        results = self.feed_other(received_ts)
        self.counters["edge_aggregates"] += 1
        first = agg.window.first_lsn
        if self._pending.pop(first, None) is None:
            self._edge_done.add(first)  # the book has not closed that window yet
        if agg.ran_at.get("detect") == "cloud":
            results.append(_detection(agg, self.book.params))
        return results

    def _decide(self, closed: list[Window]) -> list[Result]:
        results: list[Result] = []
        for window in closed:
            self.counters["windows"] += 1
            del self._open[window.device]
            if window.sides["aggregate"] == "cloud":
                agg = aggregate(window)
                results.append(Result(AGGREGATE_TASK, window.first_lsn, window.device, _body(agg)))
                if window.sides["detect"] == "cloud":
                    results.append(_detection(agg, window.params))
            elif window.first_lsn in self._edge_done:
                self._edge_done.discard(window.first_lsn)
            elif self.marker is not None:
                self._pending[window.first_lsn] = window
        return results

    def _recover(self, window: Window) -> list[Result]:
        self.counters["recovered"] += 1
        agg = aggregate(window, recovered=True).model_copy(update={"ran_at": all_on("sensor", "cloud")})
        return [
            Result(AGGREGATE_TASK, window.first_lsn, window.device, _body(agg)),
            _detection(agg, window.params),
        ]


def _detection(agg: SensorAggregate, params: SensorParams) -> Result:
    found: SensorDetection = detect(agg, params)
    return Result(DETECT_TASK, agg.window.first_lsn, agg.window.device, _body(found))


def _body(value: SensorAggregate | SensorDetection) -> dict[str, Any]:
    return value.model_dump(mode="json")
