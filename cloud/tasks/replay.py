"""One gateway log, replayed in LSN order over the contiguous run of LSNs the cloud holds.

Records reach the store in any LSN order (the uplink drains alerts and summaries first), so
``offer`` buffers what is ahead of ``next_lsn`` and ``advance`` processes from ``next_lsn`` on while
the next LSN is there, or is covered by a ``LogGap`` (LSNs the gateway's log dropped: they will never
come). A hole holds everything after it: markers and edge results are always seen before a window
is decided. The buffer keeps at most ``max_buffered`` records, the lowest LSNs. What it has to leave
out (a record refused, or the highest one pushed out by a lower one) is remembered as ``left_out``:
the lowest such LSN, and the earliest position in the gateway's segments it was read at. When
``advance`` stops at or past that LSN (``needs_rescan``), only reading the segments again from that
position can bring the next record: the runner does that (``rescanned``). Records above the stop
may be buffered meanwhile (the uplink sends alerts and live records ahead of an old backlog), so
the buffer need not be empty for it.

Each record is processed once per replay: telemetry and markers drive ``SensorReplay``; an
``InferenceResult`` is summarised here; a ``FrameForCloud`` joins ``waiting`` until the runner has
inferred it (its blob may not be there yet). A result made while processing a record below
``made_before`` (a replay after a restart) is not returned: it was stored before the restart.

Invariant: ``next_lsn`` only grows, and every LSN below it was processed or covered by a LogGap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
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

Position = tuple[int, int]  # where a record lies in its gateway's segments (DatasetStore.read_from)


@dataclass(frozen=True)
class LeftOut:
    """What a full buffer left out since the last rescan: the lowest LSN, and the earliest position
    any of it was read at (reading again from there offers every record left out)."""

    lowest_lsn: int
    read_at: Position


class LogReplay:
    def __init__(
        self, cursor: LogCursor, *, max_buffered: int, clock: Callable[[], float] = time.time
    ) -> None:
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be at least 1, got {max_buffered}")
        self.gateway, self.log_id = cursor.gateway, cursor.log_id
        self.max_buffered = max_buffered
        self.clock = clock
        self.made_before = cursor.next_lsn
        self.next_lsn = cursor.replay_from
        marker = PlacementMarker.model_validate(cursor.marker) if cursor.marker else None
        self.sensor = SensorReplay(marker)
        self.waiting: dict[int, WaitingFrame] = {w.lsn: w for w in cursor.waiting}
        self.left_out: LeftOut | None = None
        self._buffer: dict[int, tuple[dict[str, Any], Position]] = {}  # lsn -> (record, read at)
        self._gaps: dict[int, int] = {}  # first -> last of each LogGap not yet passed
        self.counters = dict.fromkeys(
            ("records", "gap_lsns", "invalid", "summarised", "frames", "left_out"), 0
        )

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

    @property
    def needs_rescan(self) -> bool:
        """``advance`` stopped where a record may have been left out: only reading the segments
        again (from ``left_out.read_at``) can bring it."""
        return self.left_out is not None and self.left_out.lowest_lsn <= self.next_lsn

    def rescanned(self) -> None:
        """The runner reads the segments again from ``left_out.read_at``: every record left out so
        far is offered again (what is left out from now on is remembered anew)."""
        self.left_out = None

    def offer(self, lsn: int, record: dict[str, Any], read_at: Position) -> None:
        """A stored record of this log, read at ``read_at`` (or later) in its gateway's segments, in
        storage order (any LSN order, possibly seen before)."""
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
            highest = max(self._buffer)
            if highest < lsn:
                self._leave_out(lsn, read_at)
                return
            _, highest_read_at = self._buffer.pop(highest)  # keep the lowest LSNs: they are next
            self._leave_out(highest, highest_read_at)
        self._buffer[lsn] = (record, read_at)

    def _leave_out(self, lsn: int, read_at: Position) -> None:
        self.counters["left_out"] += 1
        if self.left_out is not None:
            lsn, read_at = min(lsn, self.left_out.lowest_lsn), min(read_at, self.left_out.read_at)
        self.left_out = LeftOut(lsn, read_at)

    def advance(self) -> list[Result]:
        """Process from ``next_lsn`` while the next LSN is held or covered; the results made."""
        results: list[Result] = []
        while True:
            held = self._buffer.pop(self.next_lsn, None)
            if held is not None:
                made = self._process(self.next_lsn, held[0])
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
            self.waiting[lsn] = WaitingFrame(lsn, str(record.get("device")), body, self.clock())
        return results
