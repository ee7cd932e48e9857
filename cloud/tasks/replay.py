"""One gateway log, replayed in LSN order over the contiguous run of LSNs the cloud holds.

Records reach the store in any LSN order (the uplink drains alerts and summaries first), so
``offer`` buffers what is ahead of ``next_lsn`` and ``advance`` processes from ``next_lsn`` on while
the next LSN is there, or is covered by a ``LogGap`` (LSNs the gateway's log dropped: they will never
come). A hole holds everything after it: markers and edge results are always seen before a window
is decided. The buffer keeps at most ``max_buffered`` records, the lowest LSNs; what it had to leave
out sets ``overflowed``, and the runner reads the store again once the buffer has drained.

Each record is processed once per replay: telemetry and markers drive ``SensorReplay``; an
``InferenceResult`` is summarised here; a ``FrameForCloud`` joins ``waiting`` until the runner has
inferred it (its blob may not be there yet). A result made while processing a record below
``made_before`` (a replay after a restart) is not returned: it was stored before the restart.

Invariant: ``next_lsn`` only grows, and every LSN below it was processed or covered by a LogGap.
"""

from __future__ import annotations

import logging
from typing import Any

from cloud.tasks.camera import CAMERA_TASK
from cloud.tasks.cursor import LogCursor, WaitingFrame
from cloud.tasks.sensor import Result, SensorReplay
from models.summarise import summarise
from protocol.derived import (
    FrameForCloud,
    InferenceResult,
    LogGap,
    PlacementMarker,
    SensorAggregate,
    is_derived,
    parse_derived,
)
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)


class LogReplay:
    def __init__(self, cursor: LogCursor, *, max_buffered: int) -> None:
        self.gateway, self.log_id = cursor.gateway, cursor.log_id
        self.max_buffered = max_buffered
        self.made_before = cursor.next_lsn
        self.next_lsn = cursor.replay_from
        marker = PlacementMarker.model_validate(cursor.marker) if cursor.marker else None
        self.sensor = SensorReplay(marker)
        self.waiting: dict[int, WaitingFrame] = {w.lsn: w for w in cursor.waiting}
        self.overflowed = False
        self._buffer: dict[int, dict[str, Any]] = {}
        self._gaps: dict[int, int] = {}  # first -> last of each LogGap not yet passed
        self.counters = {"records": 0, "gap_lsns": 0, "invalid": 0, "summarised": 0, "frames": 0}

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def cursor(self) -> LogCursor:
        marker = self.sensor.marker
        return LogCursor(
            gateway=self.gateway,
            log_id=self.log_id,
            next_lsn=max(self.next_lsn, self.made_before),
            replay_from=self.sensor.oldest_needed(self.next_lsn),
            marker=marker.model_dump(mode="json") if marker is not None else None,
            waiting=sorted(self.waiting.values(), key=lambda w: w.lsn),
        )

    def offer(self, lsn: int, record: dict[str, Any]) -> None:
        """A stored record of this log, in storage order (any LSN order, possibly seen before)."""
        body = record.get("body") or {}
        if record.get("kind") == "event" and body.get("type") == "log_gap":
            try:
                gap = parse_derived(body)
                assert isinstance(gap, LogGap)
                self._gaps[gap.first] = max(gap.last, self._gaps.get(gap.first, gap.last))
            except ProtocolError:
                pass  # counted when the record itself is processed
        if lsn < self.next_lsn or lsn in self._buffer:
            return
        if len(self._buffer) >= self.max_buffered:
            self.overflowed = True
            highest = max(self._buffer)
            if highest < lsn:
                return
            del self._buffer[highest]  # keep the lowest LSNs: they are the next to process
        self._buffer[lsn] = record

    def advance(self) -> list[Result]:
        """Process from ``next_lsn`` while the next LSN is held or covered; the results made."""
        results: list[Result] = []
        while True:
            record = self._buffer.pop(self.next_lsn, None)
            if record is not None:
                made = self._process(self.next_lsn, record)
                if self.next_lsn >= self.made_before:
                    results += made
                self.next_lsn += 1
                continue
            last = self._covering_gap()
            if last is None:
                return results
            self.counters["gap_lsns"] += last + 1 - self.next_lsn
            self.next_lsn = last + 1

    def _covering_gap(self) -> int | None:
        for first in sorted(self._gaps):
            last = self._gaps[first]
            if last < self.next_lsn:
                del self._gaps[first]
            elif first <= self.next_lsn:
                return last
        return None

    def _process(self, lsn: int, record: dict[str, Any]) -> list[Result]:
        self.counters["records"] += 1
        received_ts = float(record.get("received_ts", 0.0))
        body = record.get("body") or {}
        if record.get("kind") == "telemetry":
            return self.sensor.feed_telemetry(lsn, str(record.get("device")), received_ts, body)
        if record.get("kind") != "event" or not is_derived(body):
            return self.sensor.feed_other(received_ts)
        try:
            derived = parse_derived(body)
        except ProtocolError as exc:
            self.counters["invalid"] += 1
            log.warning("%s/%s lsn %d: %s (skipped)", self.gateway, self.log_id, lsn, exc)
            return self.sensor.feed_other(received_ts)
        if isinstance(derived, PlacementMarker) and derived.service == "sensor":
            return self.sensor.feed_marker(derived)
        if isinstance(derived, SensorAggregate) and derived.ran_at.get("aggregate") == "edge":
            return self.sensor.feed_edge_aggregate(received_ts, derived)
        results = self.sensor.feed_other(received_ts)
        if isinstance(derived, InferenceResult):
            self.counters["summarised"] += 1
            event = summarise(
                derived.inference,
                derived.camera,
                infer_at="edge",
                summarise_at="cloud",
                input=lsn,
                blob=derived.blob,
            )
            results.append(Result(CAMERA_TASK, lsn, str(record.get("device")), event.model_dump(mode="json")))
        elif isinstance(derived, FrameForCloud) and lsn >= self.made_before:
            self.counters["frames"] += 1
            self.waiting[lsn] = WaitingFrame(lsn, str(record.get("device")), body)
        return results
