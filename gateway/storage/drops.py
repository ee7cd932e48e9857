"""The drop ledger of a log under ``full_policy = "drop_oldest"``: what a full log lost, exactly,
across restarts.

A drop removes the oldest segment; the records in it the cloud had not acknowledged are lost. The
ledger counts them (``dropped_records``, ``dropped_segments``) and keeps the lost LSN runs as
*pending gaps* until the uplink has written a ``protocol.derived.LogGap`` record for each (so cloudd
learns those LSNs will never arrive). It lives in the file ``DROPS`` beside the log, replaced whole
(tmp + fsync + rename) before the drop's trim is made durable.

Invariant: ``dropped_records`` is the number of LSNs in every gap ever added, and a gap is pending
until ``recorded``. ``settle(trimmed_lsn)`` at recovery makes it true of the log on disk: a crash
after the ledger was written but before the drop's segment was removed undoes that last drop (its
records are still in the log, so they were not lost).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

DROPS_FILE = "DROPS"

Run = tuple[int, int]


@dataclass
class DropLedger:
    dropped_records: int = 0
    dropped_segments: int = 0
    gaps: list[Run] = field(default_factory=list)  # lost runs not yet written as LogGap records, ascending
    last_drop: tuple[int, int] | None = None  # (the trim point the latest drop made, records it lost)

    def add_drop(self, through_lsn: int, lost: list[Run]) -> None:
        """One segment dropped, trimming the log to ``through_lsn``; ``lost`` are its unacknowledged runs."""
        count = sum(hi - lo + 1 for lo, hi in lost)
        self.dropped_records += count
        self.dropped_segments += 1
        self.last_drop = (through_lsn, count)
        self._add_gaps(lost)

    def add_lost(self, lost: list[Run]) -> None:
        """Records found lost after their drop (a batch in flight then failed): counted, pending."""
        self.dropped_records += sum(hi - lo + 1 for lo, hi in lost)
        self._add_gaps(lost)

    def _add_gaps(self, runs: list[Run]) -> None:
        merged: list[Run] = []
        for lo, hi in sorted(self.gaps + runs):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        self.gaps = merged

    def recorded(self, runs: list[Run]) -> None:
        """These gaps are now LogGap records in the log: no longer pending."""
        done = set(runs)
        self.gaps = [gap for gap in self.gaps if gap not in done]

    def settle(self, trimmed_lsn: int) -> None:
        """Recovery: undo the last drop if the log on disk was never trimmed by it."""
        if self.last_drop is None or trimmed_lsn >= self.last_drop[0]:
            return
        self.dropped_records -= self.last_drop[1]
        self.dropped_segments -= 1
        self.gaps = [(lo, min(hi, trimmed_lsn)) for lo, hi in self.gaps if lo <= trimmed_lsn]
        self.last_drop = None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "dropped_records": self.dropped_records,
                "dropped_segments": self.dropped_segments,
                "gaps": self.gaps,
                "last_drop": self.last_drop,
            }
        ).encode()

    @staticmethod
    def decode(data: bytes) -> DropLedger | None:
        """The ledger in ``data``, or None if it is not one (a damaged file, never a crash artefact:
        the file is replaced whole)."""
        try:
            doc = json.loads(data)
            last = doc["last_drop"]
            return DropLedger(
                int(doc["dropped_records"]),
                int(doc["dropped_segments"]),
                [(int(lo), int(hi)) for lo, hi in doc["gaps"]],
                (int(last[0]), int(last[1])) if last is not None else None,
            )
        except (ValueError, KeyError, TypeError):
            return None
