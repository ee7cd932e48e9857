"""Which records the uplink sends next: the live tail, the backlog, or both in one batch
(docs/gateway.md, "Uplink drain"); and the bookkeeping of what the cloud acknowledged.

The log's unacknowledged records are split at ``live_next``: below it (up to ``index.upto``) the
*backlog*, classified into alerts, summaries and raw data by a scan in slices (``SCAN_SLICE_RECORDS``
a step, so live data keeps moving while a million records are scanned) and drained in that order;
from it on, the *live tail*, sent in order. A failed batch, or a live tail grown past
``backlog_threshold``, moves the whole live tail into the backlog (``absorb``); a backlog is formed
only when none is being drained, so a record appended later is live for good.

A backlog no larger than ``backlog_threshold`` (what an outage or a slow spell leaves) drains as one
*generation*: while it drains, the live tail waits (what is written meanwhile is the next generation,
sent once the backlog is gone), so the backlog has the link to itself and drains at the link's rate;
it is at most a few batches, so live data waits for at most those. A larger backlog alternates with
the live tail instead, as follows, so that live data is not held up while it drains.

A batch carries both when both wait: backlog records of one class, then live records (every backlog
LSN is below every live one, so the batch is in LSN order). Whose records go in first alternates:
on the live turn the live tail takes the batch limits and the backlog the room left, on the backlog
turn the other way round. So a live record waits for at most one batch, the backlog gains every
other batch at least, and on a link with a long round trip one request carries what two did.

Batches in flight together (sender.py's pipeline): a backlog batch leaves the backlog index when it
is chosen (``reserved``), so the next choice, made while it is in flight, picks other records; its
acknowledgement books it, its failure (``failed``) puts its records back. A batch chosen while others
are in flight carries backlog records only (``next_batch(..., in_flight=True)``), and only when no
live record waits for its turn: the live tail is only ever in one batch at a time.

Owner: one ``Uplink``; called from its task only. Invariants: a record is in at most one of the
live tail, the backlog index, the batches in flight and the acknowledged ranges; ``acknowledged`` is
the only way a record leaves them (or ``follow_drops``, for what the log dropped), so nothing is
forgotten unsent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.storage.interface import RecordLog
from gateway.uplink.batches import RECORD_OVERHEAD_BYTES, read_entries
from gateway.uplink.drain import (
    CLASSES,
    AckedRanges,
    BacklogIndex,
    DrainClass,
    DrainOrder,
    classify,
    runs_of,
)

SCAN_SLICE_RECORDS = 10_000  # backlog records read and classified per step (~0.2 s; then a live batch)
SPAN_PER_RECORD = 20  # a backlog batch spans at most this many log LSNs per record it carries
BatchSource = Literal["live", "scan"] | DrainClass  # "scan": an empty batch, after a backlog scan slice


@dataclass(frozen=True)
class Batch:
    """``entries`` in LSN order: the backlog's (of class ``source``) first, then ``live`` records of
    the live tail (all of them when ``source`` is "live")."""

    source: BatchSource
    entries: list[tuple[int, bytes]]
    live: int = 0

    @property
    def backlog_lsns(self) -> list[int]:
        return [lsn for lsn, _ in self.entries[: len(self.entries) - self.live]]


@dataclass(frozen=True)
class Limits:
    """What one batch may carry: records, and bytes by ``read_entries``' estimate."""

    records: int
    size: int

    def left_after(self, entries: list[tuple[int, bytes]]) -> Limits:
        used = sum(len(data) + RECORD_OVERHEAD_BYTES for _, data in entries)
        return Limits(self.records - len(entries), self.size - used)

    @property
    def empty(self) -> bool:
        return self.records <= 0 or self.size <= RECORD_OVERHEAD_BYTES


class BatchChooser:
    def __init__(
        self,
        record_log: RecordLog,
        limits: Limits,
        order: Mapping[DrainClass, DrainOrder],
        backlog_threshold: int,
    ) -> None:
        self._log = record_log
        self._limits = limits
        self._order = dict(order)
        self._backlog_threshold = backlog_threshold
        self.acked = AckedRanges()
        self._index = BacklogIndex()
        self._live_next = 1  # first LSN of the live tail not yet acknowledged
        self._scan_next = 1  # next backlog LSN to classify (the scan is done when > index.upto)
        self._turn: Literal["live", "backlog"] = "backlog"  # whose records go in first, when both wait
        self._absorb = False  # a batch failed: what waits joins the backlog before the next choice
        self._hold_live = False  # a small backlog drains as one generation: the live tail waits
        self.reserved = 0  # backlog records in batches in flight (out of the index until their answer)
        self.uploaded_by_class: dict[DrainClass, int] = dict.fromkeys(CLASSES, 0)
        self.counters = {
            "live_batches": 0,  # batches that carried live records (a batch may carry both kinds)
            "backlog_batches": 0,  # batches that carried backlog records
            "backlog_scanned": 0,
            "absorbed_into_backlog": 0,
            "live_held_batches": 0,  # batches chosen while a backlog generation held the live tail
        }

    def start_at(self, trimmed: int) -> None:
        """Everything after the log's trim point is unacknowledged (a restart sends it again)."""
        self.acked = AckedRanges(trimmed)
        self._live_next = self._scan_next = trimmed + 1

    def follow_drops(self, trimmed: int) -> None:
        """The log dropped everything up to ``trimmed``: it is neither backlog nor live any more."""
        self.acked.trimmed_to(trimmed)
        self._index.forget(0, trimmed)
        self._live_next = max(self._live_next, trimmed + 1)
        self._scan_next = max(self._scan_next, trimmed + 1)

    def stop_at(self, lsn: int) -> None:
        """The log cannot be read at ``lsn`` (damage): nothing from it on may be chosen (the uplink
        also caps ``durable`` below it). What the backlog held from there goes back to the live tail,
        unread; in the rare case it had been acknowledged (damage that came after its upload) it is
        sent again later, a duplicate the cloud acknowledges."""
        self._index.forget(lsn, max(lsn, self._index.scanned))
        self._index.upto = min(self._index.upto, lsn - 1)
        self._scan_next = min(self._scan_next, lsn)
        self._live_next = min(self._live_next, lsn)

    def failed(self, batch: Batch) -> None:
        """``batch`` failed: its backlog records go back to the index (those the log still holds and
        the backlog still covers), and the live tail joins the backlog at the next choice."""
        self._absorb = True
        backlog, cls = batch.backlog_lsns, batch.source
        if not backlog or cls == "live" or cls == "scan":
            return
        self.reserved -= len(backlog)
        back = [lsn for lsn in backlog if self.acked.trimmed < lsn <= self._index.upto]
        self._index.restore(cls, back)

    # -- choosing ----------------------------------------------------------------------------
    @property
    def live_held(self) -> bool:
        """Whether a record appended now waits for a backlog first: a generation drains, or a failed
        batch's records are about to join the backlog."""
        return self._hold_live or self._absorb

    async def next_batch(self, durable: int, *, in_flight: bool = False) -> Batch | None:
        """The next batch among the records up to ``durable``, an empty "scan" batch after a scan
        slice, or None when nothing waits. ``in_flight``: other batches are being sent; only a
        backlog batch may join them, and only when no live record waits for its turn (else None)."""
        batch = await self._choose(durable, in_flight)
        cls = batch.source if batch is not None else "scan"
        if batch is not None and cls != "live" and cls != "scan":
            held = batch.backlog_lsns
            self._index.take(cls, held)  # reserved: the next choice picks other records
            self.reserved += len(held)
        return batch

    async def _choose(self, durable: int, in_flight: bool) -> Batch | None:
        waiting = durable - self._live_next + 1
        if waiting > 0 and (self._absorb or waiting > self._backlog_threshold):
            self._absorb_live_tail(durable)
        self._absorb = False
        scanning = self._scan_next <= self._index.upto
        backlog = scanning or self._index.pending() > 0
        if not backlog and not self.reserved:
            self._hold_live = False  # the generation drained: the live tail goes
        live = self._live_next <= durable and not self._hold_live
        if self._hold_live and backlog:
            self.counters["live_held_batches"] += 1
        if in_flight:
            if live or not backlog:
                return None
            if scanning:
                await self._scan_slice()
                return Batch("scan", [])
            return await self._backlog(self._limits)
        live_first = live and (self._turn == "live" or not backlog)
        self._turn = "backlog" if live_first else "live"
        if scanning:
            if live_first:
                return await self._live(self._limits, durable)
            await self._scan_slice()
            return Batch("scan", [])
        if not backlog:
            return await self._live(self._limits, durable) if live else None
        if live_first:
            live_part = await self._live(self._limits, durable)
            cls = self._index.next_class()
            older = await self._filler(self._backlog, self._limits.left_after(live_part.entries))
            return Batch(cls if cls and older else "live", older + live_part.entries, live_part.live)
        backlog_part = await self._backlog(self._limits)
        if not live:
            return backlog_part
        live_entries = await self._filler(
            lambda room: self._live(room, durable), self._limits.left_after(backlog_part.entries)
        )
        return Batch(backlog_part.source, backlog_part.entries + live_entries, len(live_entries))

    def _absorb_live_tail(self, durable: int) -> None:
        """The live tail [live_next, durable] joins the backlog (the link is down or not keeping up)."""
        if self._scan_next > self._index.upto:
            # the scan is done: everything before live_next is acknowledged or in the index
            self._scan_next = self._live_next
        self.counters["absorbed_into_backlog"] += durable - self._live_next + 1
        self._index.upto = durable
        self._live_next = durable + 1
        unscanned = self._index.upto - self._scan_next + 1
        self._hold_live = self._index.pending() + self.reserved + unscanned <= self._backlog_threshold
        self._turn = "backlog"  # what waited longest goes by priority before anything newer

    async def _scan_slice(self) -> None:
        upto = min(self._index.upto, self._scan_next + SCAN_SLICE_RECORDS - 1)
        scanned = 0
        async for lsn, data in self._log.read(self._scan_next):
            if lsn > self._index.scanned and not self.acked.contains(lsn):
                self._index.add(lsn, classify(data))
            scanned += 1
            if lsn >= upto:  # before the read goes on: it may not be readable past upto
                break
        self.counters["backlog_scanned"] += scanned
        self._scan_next = upto + 1

    async def _live(self, room: Limits, durable: int) -> Batch:
        entries = await read_entries(
            self._log, self._live_next, max_records=room.records, max_bytes=room.size, last=durable
        )
        return Batch("live", entries, len(entries))

    async def _backlog(self, room: Limits) -> Batch:
        cls = self._index.next_class()
        assert cls is not None
        wanted = self._index.pick(cls, self._order[cls], room.records, room.records * SPAN_PER_RECORD)
        entries = await read_entries(
            self._log, wanted[0], max_records=room.records, max_bytes=room.size, wanted=wanted
        )
        return Batch(cls, entries)

    @staticmethod
    async def _filler(read: Callable[[Limits], Awaitable[Batch]], room: Limits) -> list[tuple[int, bytes]]:
        """What ``read`` finds within ``room``; nothing when even its first record does not fit
        (``read_entries`` always takes a first record: that is for a batch's first part only)."""
        if room.empty:
            return []
        entries = (await read(room)).entries
        return entries if room.left_after(entries).size >= 0 else []

    # -- bookkeeping -------------------------------------------------------------------------
    def acknowledged(self, batch: Batch) -> None:
        """The cloud acknowledged ``batch``: its records leave the live tail and the backlog."""
        backlog, cls = batch.backlog_lsns, batch.source
        if backlog:
            assert cls != "live" and cls != "scan", "backlog records are of a drain class"
            self.reserved -= len(backlog)  # out of the index since it was chosen
            self.uploaded_by_class[cls] += len(backlog)
            self.counters["backlog_batches"] += 1
        if batch.live:
            self._live_next = batch.entries[-1][0] + 1
            for _, data in batch.entries[len(backlog) :]:
                self.uploaded_by_class[classify(data)] += 1
            self.counters["live_batches"] += 1
        self.acked.add_runs(runs_of(lsn for lsn, _ in batch.entries))

    def status(self) -> dict[str, object]:
        return {
            "backlog_upto": self._index.upto,
            "backlog_pending": self._index.pending(),
            "backlog_in_flight": self.reserved,
            "live_held": self._hold_live,
            "backlog_by_class": {c: self._index.pending(c) for c in CLASSES},
            "scan_done": self._scan_next > self._index.upto,
            "live_next": self._live_next,
            "acked_untrimmed": self.acked.count,
            "uploaded_by_class": dict(self.uploaded_by_class),
        }
