"""The uplink's books on the log: what to send next, what is in flight, what the cloud acknowledged,
and how far the log may be trimmed.

Invariant: a record leaves the log only when the cloud acknowledged it: the log is trimmed only up
to the end of the contiguous run of acknowledged LSNs (``drain.AckedRanges``), whatever order the
acknowledgements came in, and a batch is booked acknowledged only when the cloud's ``BatchAck``
names its own first and last LSN ("bad_ack" otherwise), with no await between the answer and the
booking, so the log never sees a batch half booked. A failed batch's records go back to the
backlog (chooser.py).

Full log (policy "drop_oldest"): the books follow the log's trim point past a drop (the backlog
forgets what is gone); what the drop lost, and the LogGap records that tell the cloud, are gaps.py's.
A drop leaves a batch in flight to its fate; the books, following the drop, call its records trimmed,
so they first note which of them the drop took (``_dropped_in_flight``): lost if the batch fails.
Damage in the log (``LogCorrupted``): nothing is read, sent or trimmed past it (damage_stop.py).
"""

from __future__ import annotations

import logging
import time

from gateway.ratelimit import RateLimitedLog
from gateway.storage.interface import LogCorrupted, RecordLog, TrimFailed
from gateway.uplink.chooser import Batch, BatchChooser
from gateway.uplink.damage_stop import DamageStop
from gateway.uplink.drain import runs_of
from gateway.uplink.gaps import GapRecords, lost_in_flight, unacked_runs
from gateway.uplink.outcome import Outcome

log = logging.getLogger(__name__)


class UplinkLedger:
    def __init__(self, record_log: RecordLog, gateway_id: str, chooser: BatchChooser) -> None:
        self._log = record_log
        self.chooser = chooser
        self.damage_stop = DamageStop()
        self._gap_records = GapRecords(record_log, gateway_id)
        self._in_flight: dict[int, list[tuple[int, int]]] = {}  # id(batch) -> its LSN runs, while sent
        # id(batch) -> its runs a drop removed while it was in flight, taken when the books followed
        # that drop (which books them as trimmed): lost if the batch then fails (``failed``)
        self._dropped_in_flight: dict[int, list[tuple[int, int]]] = {}
        self._synced = False
        self._warn = RateLimitedLog(log)
        self.last_success_ts = 0.0
        self.counters: dict[str, float] = {
            "batches_sent": 0,
            "records_uploaded": 0,
            "drops_followed": 0,
            "gap_records": 0,
            "trim_failures": 0,
        }

    @property
    def backlog(self) -> int:
        """Records in the log the cloud has not acknowledged."""
        return max(0, self._log.durable_lsn - self._log.trimmed_lsn - self.chooser.acked.count)

    def acknowledged(self, lsn: int) -> bool:
        """Whether the cloud has acknowledged ``lsn`` (trimmed, or in an acknowledged range)."""
        return lsn <= self._log.trimmed_lsn or self.chooser.acked.contains(lsn)

    def sync_with_log(self) -> None:
        """Start from the log's trim point; everything untrimmed is sent again (idempotent)."""
        if self._synced:
            return
        self.chooser.start_at(self._log.trimmed_lsn)
        self._log.set_unacked_view(self._unacked)
        self._synced = True

    def _unacked(self, first: int, last: int) -> list[tuple[int, int]]:
        in_flight = sorted(run for runs in self._in_flight.values() for run in runs)
        return unacked_runs(self.chooser.acked, in_flight, first, last)

    async def next_batch(self, *, in_flight: bool = False) -> Batch | None:
        """The chooser's next batch, once the log's drops are followed and their gaps recorded; an
        empty "scan" batch (go round again) when a read has just reached damage. ``in_flight``:
        other batches are being sent (chooser.py: only a backlog batch may join them)."""
        self.sync_with_log()
        self._follow_drops()
        self.counters["gap_records"] += await self._gap_records.write()
        self.damage_stop.consider(self._log.damage, self._log.trimmed_lsn, self.chooser)
        try:
            durable = self.damage_stop.readable_upto(self._log.durable_lsn)
            return await self.chooser.next_batch(durable, in_flight=in_flight)
        except LogCorrupted as exc:
            self.damage_stop.consider([exc.damage], self._log.trimmed_lsn, self.chooser)
            return Batch("scan", [])

    def _follow_drops(self) -> None:
        """The log dropped segments (policy "drop_oldest"): what is gone is neither backlog nor live."""
        trimmed = self._log.trimmed_lsn
        if trimmed <= self.chooser.acked.trimmed:
            return
        self.counters["drops_followed"] += 1
        self._gap_records.forget_dropped(trimmed, self.chooser.acked)
        for key, runs in self._in_flight.items():
            gone = lost_in_flight(self.chooser.acked, runs, trimmed)  # before the books call them trimmed
            if gone:
                self._dropped_in_flight[key] = self._dropped_in_flight.get(key, []) + gone
        self.chooser.follow_drops(trimmed)

    def sending(self, batch: Batch) -> None:
        """``batch`` is on its way: a drop of its records is lost only if it fails (gaps.py)."""
        self._in_flight[id(batch)] = runs_of(lsn for lsn, _ in batch.entries)

    def not_sending(self, batch: Batch) -> None:
        """``batch`` is no longer on its way, whatever became of it."""
        del self._in_flight[id(batch)]

    def answered(self, batch: Batch, outcome: Outcome) -> Outcome:
        """Book the cloud's answer to ``batch`` (no await: the log never sees it half booked);
        "bad_ack" if a 200 is for other LSNs."""
        if outcome.kind != "ok":
            return outcome
        entries = batch.entries
        first, last = entries[0][0], entries[-1][0]
        assert outcome.ack is not None
        if outcome.ack.first_lsn != first or outcome.ack.last_lsn != last:
            return Outcome(
                "bad_ack", f"sent {first}-{last}, cloud acked {outcome.ack.first_lsn}-{outcome.ack.last_lsn}"
            )
        self._dropped_in_flight.pop(id(batch), None)  # stored after all: nothing of it was lost
        self.chooser.acknowledged(batch)
        # Counted when the cloud acknowledged it, before the trim's await: a reader that sees the
        # log trimmed also sees the batch counted.
        self.counters["batches_sent"] += 1
        self.counters["records_uploaded"] += len(entries)
        self.last_success_ts = time.time()
        return outcome

    async def failed(self, batch: Batch) -> None:
        """``batch`` failed (after ``not_sending``): its records go back to the backlog, and those the
        log dropped meanwhile are lost (gaps.py)."""
        self.chooser.failed(batch)
        runs = runs_of(lsn for lsn, _ in batch.entries)
        lost = lost_in_flight(self.chooser.acked, runs, self._log.trimmed_lsn)  # before the await
        lost += self._dropped_in_flight.pop(id(batch), [])  # those the books already called trimmed
        if lost:
            await self._log.add_lost(lost)

    async def settle_and_trim(self) -> None:
        """Settle the gaps the cloud now knows of, and trim the log to the acknowledged run (one
        caller at a time, whatever is in flight)."""
        await self._gap_records.settle(self.chooser.acked)
        acked = self.chooser.acked
        point = acked.trim_point()
        if point > self._log.trimmed_lsn:
            acked.trimmed_to(point)  # before the await: ``backlog`` never counts a run twice
            try:
                await self._log.trim(point)
            except TrimFailed as exc:  # the batch is stored all the same; the next trim tries again
                self.counters["trim_failures"] += 1
                self._warn.warning("trim", "uplink: %s", exc)
