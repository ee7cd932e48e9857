"""The sensor service's ``aggregate`` and ``detect`` tasks at the edge: the windows of the telemetry the
ingest task logs, and the results of those the plan runs here (docs/gateway.md, "Sensor windows").

Owner: the ingest task (gateway/ingest/sensors.py) calls every method, in its own task, in the order
it appends: ``follow`` before each batch of input (the first call writes the start marker),
``observe`` after each telemetry record it appended (with that record's LSN and receive time),
``tick`` now and then (a silent device's window closes by time), ``close`` at a clean stop. Each
returns how many records it appended (the ingest's flusher makes them durable with its next epoch);
LogFailed propagates.

Sides: ``follow`` reads the sides the plan gives the sensor service now (gateway/placement/
execution.py); when they differ from those in force, the open windows are closed (their edge results
appended), then a ``PlacementMarker`` with the new sides is appended: the marker closes those windows
on the cloud's side too, and the windows opened after it run where it says. A marker the log refuses
changes nothing (the old sides stay; the next input tries again).

Invariant: every telemetry record observed belongs to exactly one window of the ``WindowBook``; a
closed window whose ``aggregate`` runs at the edge gets exactly one ``SensorAggregate`` appended after
its last record (and a ``SensorDetection`` when ``detect`` runs here too), or the loss is counted
(``results_log_full``); a window that runs in the cloud gets nothing here (cloudd makes its results).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from gateway.placement.execution import ServiceSides, sides_text
from gateway.storage.interface import LogFull, RecordLog
from models.sensing import Window, WindowBook, aggregate, detect
from protocol.control import Side
from protocol.derived import PlacementMarker, SensorParams
from protocol.records import event_record

log = logging.getLogger(__name__)


class SensorWindows:
    def __init__(
        self,
        record_log: RecordLog,
        gateway_id: str,
        params: SensorParams,
        sides: Callable[[], ServiceSides],
        clock: Callable[[], float],
    ) -> None:
        self._log = record_log
        self.gateway_id = gateway_id
        self.params = params
        self._sides = sides
        self._clock = clock
        self._applied: ServiceSides | None = None  # the sides of the last marker appended
        self.book = WindowBook(sides().sides, params)
        self.counters = {
            "markers": 0,
            "marker_failures": 0,
            "windows_closed": 0,
            "windows_in_cloud": 0,
            "aggregates": 0,
            "detections": 0,
            "alerts": 0,
            "results_log_full": 0,
        }

    @property
    def sides(self) -> dict[str, Side]:
        return dict(self.book.sides)

    async def follow(self) -> int:
        """Switch to the sides the plan gives now, if they changed; the records appended. The first
        call writes the ``start`` marker: this run's windows begin there (a window of an earlier run
        that a crash cut short ends at it, and cloudd makes its results)."""
        want = self._sides()
        if self._applied is not None and want.sides == self._applied.sides:
            return 0
        appended = await self._append_results(self.book.close_all(), self._clock())
        return appended + await self._mark(want, "plan" if self._applied is not None else "start")

    async def observe(self, lsn: int, device: str, received_ts: float, telemetry: dict[str, Any]) -> int:
        """One telemetry record just appended at ``lsn``; returns the result records appended."""
        closed = self.book.feed(lsn, device, received_ts, telemetry)
        return await self._append_results(closed, received_ts)

    async def tick(self) -> int:
        """Close the windows whose grace has passed (devices that went silent)."""
        now = self._clock()
        return await self._append_results(self.book.close_due(now), now)

    async def close(self) -> int:
        """A clean stop: every open window ends here, with its edge results."""
        return await self._append_results(self.book.close_all(), self._clock())

    async def _mark(self, want: ServiceSides, reason: Literal["start", "plan"]) -> int:
        marker = PlacementMarker(
            service="sensor", sides=dict(want.sides), plan=want.plan, reason=reason, sensor=self.params
        )
        try:
            await self._log.append(
                event_record(self.gateway_id, self._clock(), marker.model_dump(mode="json"))
            )
        except LogFull as exc:
            self.counters["marker_failures"] += 1
            log.warning("sensor: placement marker not written (log full: %s); sides stay %s", exc, self.sides)
            return 0
        self.book.feed_marker(marker)  # no window is open: closed above, or none yet
        self._applied = want
        self.counters["markers"] += 1
        log.info("sensor: tasks run %s from here (plan v%d, %s)", sides_text(want.sides), want.plan, reason)
        return 1

    async def _append_results(self, windows: list[Window], received_ts: float) -> int:
        appended = 0
        for window in windows:
            self.counters["windows_closed"] += 1
            if window.sides["aggregate"] != "edge":
                self.counters["windows_in_cloud"] += 1
                continue
            result = aggregate(window)
            bodies = [result.model_dump(mode="json")]
            if window.sides["detect"] == "edge":
                bodies.append(detect(result, window.params).model_dump(mode="json"))
            for body in bodies:
                try:
                    await self._log.append(event_record(window.device, received_ts, body))
                except LogFull:
                    self.counters["results_log_full"] += 1
                    continue
                appended += 1
                self.counters["aggregates" if body["type"] == "sensor_aggregate" else "detections"] += 1
                self.counters["alerts"] += body.get("severity") == "alert"
        return appended
