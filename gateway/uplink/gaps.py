"""The uplink's side of a full log (policy "drop_oldest"): what a drop loses, and telling the cloud.

The log asks which LSNs of a dropped segment the cloud lacks (``unacked_runs``: not acknowledged and
not in the batch in flight); a batch that was in flight when its records were dropped, and then
failed, adds its records to the loss afterwards (``lost_in_flight``). For every lost run the log
keeps as a pending gap, ``GapRecords`` appends one ``protocol.derived.LogGap`` record, so the cloud
learns those LSNs never come.

Invariant: every dropped LSN the cloud lacks is counted lost exactly once (by the drop, or after the
failed batch that carried it), and a gap stays pending in the log until the cloud acknowledged the
LogGap record naming it: a LogGap record that is dropped in turn is written again.
"""

from __future__ import annotations

import logging
import time

from gateway.ratelimit import RateLimitedLog
from gateway.storage.interface import LogFailed, LogFull, RecordLog
from gateway.uplink.drain import AckedRanges
from protocol.derived import LogGap
from protocol.records import event_record

log = logging.getLogger(__name__)

Run = tuple[int, int]


def unacked_runs(acked: AckedRanges, in_flight: list[Run], first: int, last: int) -> list[Run]:
    """What a drop of [first, last] loses: the cloud lacks it and no batch carrying it is in flight
    (if that batch fails, ``lost_in_flight`` adds its records to the loss)."""
    out: list[Run] = []
    for lo, hi in acked.missing(first, last):
        at = lo
        for f_lo, f_hi in in_flight:
            if f_hi < at or f_lo > hi:
                continue
            if f_lo > at:
                out.append((at, f_lo - 1))
            at = max(at, f_hi + 1)
        if at <= hi:
            out.append((at, hi))
    return out


def lost_in_flight(acked: AckedRanges, failed: list[Run], trimmed_lsn: int) -> list[Run]:
    """The runs of a failed batch that a drop removed while it was in flight: they are lost now.
    Call it before the next await: a drop from then on counts them itself (they are not in flight)."""
    gone = [(lo, min(hi, trimmed_lsn)) for lo, hi in failed if lo <= trimmed_lsn]
    return [run for lo, hi in gone for run in acked.missing(lo, hi)]


class GapRecords:
    """The LogGap records written and not yet acknowledged, by the LSN of the record."""

    def __init__(self, record_log: RecordLog, gateway_id: str) -> None:
        self._log = record_log
        self._gateway_id = gateway_id
        self._written: dict[int, Run] = {}  # LSN of a LogGap record -> the gap it names
        self._warn = RateLimitedLog(log)

    def forget_dropped(self, trimmed_lsn: int, acked: AckedRanges) -> None:
        """The log dropped up to ``trimmed_lsn``: a LogGap record dropped unacknowledged is written again."""
        for lsn in [lsn for lsn in self._written if lsn <= trimmed_lsn and not acked.contains(lsn)]:
            del self._written[lsn]

    async def write(self) -> int:
        """One LogGap record per pending gap not written yet; returns how many were appended (a gap
        whose record could not be written stays pending and is tried again on the next call)."""
        written = set(self._written.values())
        gaps = [gap for gap in self._log.gaps if gap not in written]
        if not gaps:
            return 0
        appended = 0
        try:
            for first, last in gaps:
                body = LogGap(first=first, last=last).model_dump()
                lsn = await self._log.append(event_record(self._gateway_id, time.time(), body))
                self._written[lsn] = (first, last)
                appended += 1
            await self._log.flush(wait=True)  # sent from the next round on
        except (LogFull, LogFailed) as exc:
            self._warn.warning("gap", "uplink: LogGap records for %s not written yet: %s", gaps, exc)
            return appended
        log.warning("uplink: the full log dropped un-uploaded records %s; LogGap records written", gaps)
        return appended

    async def settle(self, acked: AckedRanges) -> None:
        """The gaps whose LogGap records the cloud acknowledged are no longer pending in the log."""
        done = [lsn for lsn in self._written if acked.contains(lsn)]
        if done:
            await self._log.gaps_recorded([self._written.pop(lsn) for lsn in done])
