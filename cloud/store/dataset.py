"""DatasetStore: the records gateways uploaded, stored once each, and what they add up to.

Records live in append-only segment files (``segments.py``), one series per gateway under
``<data_dir>/datasets/``; metadata lives in the metadata database (``database.py``: SQLite at
``<data_dir>/meta.sqlite`` by default, or PostgreSQL shared by several cloudd replicas; ``meta.py``).

Crash-consistency invariant: ``store_batch`` returns (so cloudd acknowledges a batch) only after
(1) the new records' bytes are fsynced in a segment, and then (2) one metadata transaction that
records the segment's committed length, the merged LSN intervals, the per-device counts and the
gateway's counts and last_seen has committed. A crash before (2) leaves segment bytes past the
committed length; ``open`` cuts them (the batch was never acknowledged, the gateway sends it
again). So after any crash the store holds exactly the acknowledged batches, each record once.

Idempotency: a record is named by (gateway, log_id, lsn). Per (gateway, log_id) the store keeps
the merged intervals of LSNs it holds; a batch stores only the LSNs outside them (batches may
arrive in any LSN order; nothing assumes contiguity). A replayed batch stores nothing and is
still acknowledged.

Concurrency: every batch runs in one metadata transaction holding its gateway's lock
(``meta.gateway_lock``) from before it reads the stored intervals until its commit, and writes
its segment bytes inside it; so batches of one gateway are serialised, and that holds across
cloudd replicas sharing one PostgreSQL database and one data directory: two replicas never store
a record twice nor write one segment at once. On SQLite there is one writer per data directory
(an exclusive ``flock``), which recovers at ``open``; on PostgreSQL no process owns the directory,
so ``open`` only reports missing bytes, and an uncommitted tail (a replica killed between its
fsync and its commit) is cut by the next write to that segment, under the gateway's lock.
Readers (``iter_records``, ``counts``) read one committed snapshot per call and segment bytes
only up to committed lengths, so they are safe from any thread, and from another process with
``DatasetStore.open(dir, readonly=True)`` (which never recovers).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cloud.store import alerts, meta, segments, series
from cloud.store.database import Conn, Database, open_database
from cloud.store.intervals import merge, runs, split_new
from cloud.store.migrations import migrate
from protocol.batch import BatchAck, UploadBatch

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreLocked(Exception):
    """Another writer (another cloudd) holds this data directory."""


@dataclass(frozen=True)
class StoredRecord:
    gateway: str
    log_id: str
    lsn: int
    record: dict[str, Any]  # the protocol.records.Record as uploaded, decoded to a dict


@dataclass(frozen=True)
class StoreCounts:
    gateways: list[meta.GatewayCounts]
    devices: list[meta.DeviceCounts]

    @property
    def records(self) -> int:
        return sum(g.records for g in self.gateways)

    @property
    def batches(self) -> int:
        return sum(g.batches for g in self.gateways)


@dataclass
class RecoveryReport:
    """What ``open`` found. ``cut_bytes`` is normal crash damage; the rest is corruption."""

    cut_bytes: int = 0
    removed_segments: list[Path] = field(default_factory=list)
    missing_bytes: dict[Path, int] = field(default_factory=dict)

    @property
    def corrupt(self) -> bool:
        return bool(self.missing_bytes)


class DatasetStore:
    def __init__(
        self, data_dir: Path, db: Database, *, segment_max_bytes: int, clock: Callable[[], float]
    ) -> None:
        self.data_dir = Path(data_dir)
        self.db = db
        self.datasets_dir = self.data_dir / "datasets"
        self.readonly = db.readonly
        self.segment_max_bytes = segment_max_bytes
        self.clock = clock
        self.corrupt_lines = 0  # committed lines that did not parse, seen by readers
        self.recovery = RecoveryReport()
        self._lock_fd: int | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        data_dir: Path | str,
        *,
        readonly: bool = False,
        database: str | None = None,
        segment_max_bytes: int = segments.DEFAULT_SEGMENT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> DatasetStore:
        """Open (creating if needed) the store whose metadata is in ``database`` (a PostgreSQL URL;
        None: the data directory's SQLite file, or, for a reader, the database the directory's
        marker names). A SQLite writer takes the directory's lock and recovers first; any writer
        brings the schema up to date."""
        data_dir = Path(data_dir)
        if not readonly:
            data_dir.mkdir(parents=True, exist_ok=True)
        db = open_database(database, data_dir, readonly=readonly)
        store = cls(data_dir, db, segment_max_bytes=segment_max_bytes, clock=clock)
        if readonly:
            return store
        try:
            if not db.shared:
                store._lock_fd = _lock_directory(data_dir)
            migrate(db, meta.COMPONENT, meta.MIGRATIONS)
            store._recover()
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- recovery -------------------------------------------------------------------------------

    def _recover(self) -> None:
        committed = {(gw, seq): n for gw, seq, n in self.db.read(meta.segments)}
        report = self.recovery
        # Shared (PostgreSQL): another replica may be writing past a committed length right now.
        check = segments.check if self.db.shared else segments.recover
        for (gw, seq), n in committed.items():
            result = check(segments.segment_path(self.datasets_dir, gw, seq), n)
            report.cut_bytes += result.cut_bytes
            if result.missing_bytes:
                report.missing_bytes[result.path] = result.missing_bytes
        if self.datasets_dir.exists() and not self.db.shared:
            for path in sorted(self.datasets_dir.glob(f"*/*{segments.SEGMENT_SUFFIX}")):
                key = (path.parent.name, int(path.stem))
                if key not in committed:
                    # Created for a batch whose commit never happened: it holds only uncommitted bytes.
                    report.cut_bytes += path.stat().st_size
                    report.removed_segments.append(path)
                    path.unlink()
        if report.cut_bytes:
            log.info(
                "recovery: cut %d uncommitted bytes (%d new segments removed)",
                report.cut_bytes,
                len(report.removed_segments),
            )
        for path, missing in report.missing_bytes.items():
            log.error("corruption: %s lacks %d committed bytes", path, missing)

    # -- writing --------------------------------------------------------------------------------

    def store_batch(self, batch: UploadBatch) -> BatchAck:
        """Store the records of ``batch`` not stored before; return once durable (see invariant)."""
        if self.readonly or self._closed:
            raise RuntimeError("store is closed or read-only")
        return self.db.write(lambda conn: self._store(conn, batch), lock=meta.gateway_lock(batch.gateway))

    def _store(self, conn: Conn, batch: UploadBatch) -> BatchAck:
        """The batch's transaction: holds the gateway's lock, so what it reads stays true until commit."""
        gw, log_id = batch.gateway, batch.log_id
        old = meta.ranges_near(conn, gw, log_id, batch.first_lsn, batch.last_lsn)
        new_lsns, duplicates = split_new(old, (e.lsn for e in batch.records))
        wanted = set(new_lsns)
        fresh = [e for e in batch.records if e.lsn in wanted]
        segment = None
        devices: dict[str, tuple[int, float]] = {}
        if fresh:
            data = b"".join(
                segments.encode_line(log_id, e.lsn, e.data.model_dump_json().encode()) for e in fresh
            )
            seq, committed_len = self._segment_for(conn, gw, len(data))
            path = segments.segment_path(self.datasets_dir, gw, seq)
            segment = (seq, segments.append_at(path, committed_len, data))
            for e in fresh:
                n, ts = devices.get(e.data.device, (0, e.data.received_ts))
                devices[e.data.device] = (n + 1, max(ts, e.data.received_ts))
        change = meta.BatchCommit(
            gateway=gw,
            log_id=log_id,
            now=self.clock(),
            stored=len(fresh),
            duplicates=duplicates,
            segment=segment,
            old_ranges=old,
            new_ranges=merge(old, runs(new_lsns)),
            devices=devices,
            series=series.collect(gw, (e.data for e in fresh)),
            alerts=alerts.collect(gw, log_id, ((e.lsn, e.data) for e in fresh)),
        )
        meta.commit_batch(conn, change)
        return BatchAck(
            stored=len(fresh), duplicates=duplicates, first_lsn=batch.first_lsn, last_lsn=batch.last_lsn
        )

    def _segment_for(self, conn: Conn, gateway: str, nbytes: int) -> tuple[int, int]:
        """(seq, committed_len) of the segment the next write goes to; rolls over when full."""
        rows = meta.segments(conn, gateway)
        if not rows:
            return 1, 0
        _, seq, committed_len = rows[-1]
        if committed_len > 0 and committed_len + nbytes > self.segment_max_bytes:
            return seq + 1, 0
        return seq, committed_len

    # -- reading --------------------------------------------------------------------------------

    def iter_records(self, gateway: str | None = None) -> Iterator[StoredRecord]:
        """Every committed record (of one gateway, or all), in storage order per gateway."""
        snapshot = self.db.read(lambda conn: meta.segments(conn, gateway))
        for gw, seq, committed_len in snapshot:
            path = segments.segment_path(self.datasets_dir, gw, seq)
            for offset, line in segments.read_lines(path, committed_len):
                try:
                    row = segments.decode_line(line)
                    yield StoredRecord(gw, row["log_id"], row["lsn"], row["data"])
                except (ValueError, KeyError, TypeError):
                    self.corrupt_lines += 1
                    log.error("corruption: %s offset %d: committed line is not a record", path, offset)

    def read_from(
        self, gateway: str, position: tuple[int, int], limit: int
    ) -> tuple[list[StoredRecord], tuple[int, int]]:
        """Up to ``limit`` committed records of ``gateway`` stored at or after ``position`` (segment
        seq, byte offset; ``(0, 0)`` is the start), and the position after the last one returned:
        a reader that follows the store as it grows (cloud/tasks). Committed bytes never change, so a
        position stays valid for ever."""
        snapshot = self.db.read(lambda conn: meta.segments(conn, gateway))
        out: list[StoredRecord] = []
        for _, seq, committed_len in snapshot:
            if seq < position[0]:
                continue
            path = segments.segment_path(self.datasets_dir, gateway, seq)
            start = position[1] if seq == position[0] else 0
            for offset, line in segments.read_lines(path, committed_len, start):
                if len(out) >= limit:
                    return out, position
                position = (seq, offset + len(line))
                try:
                    row = segments.decode_line(line)
                    out.append(StoredRecord(gateway, row["log_id"], row["lsn"], row["data"]))
                except (ValueError, KeyError, TypeError):
                    self.corrupt_lines += 1
                    log.error("corruption: %s offset %d: committed line is not a record", path, offset)
        return out, position

    def read(self, query: Callable[[Conn], T]) -> T:
        """Run ``query`` (a function of ``series`` or ``alerts``) on one snapshot: safe from any thread."""
        return self.db.read(query)

    def write(self, change: Callable[[Conn], T]) -> T:
        """Run ``change`` (an operator's write, e.g. acknowledging alerts) in one transaction."""
        if self.readonly or self._closed:
            raise RuntimeError("store is closed or read-only")
        return self.db.write(change)

    def counts(self) -> StoreCounts:
        return self.db.read(lambda conn: StoreCounts(meta.gateway_counts(conn), meta.device_counts(conn)))

    def stored_ranges(self, gateway: str, log_id: str) -> list[tuple[int, int]]:
        """The merged LSN intervals held for (gateway, log_id)."""
        return self.db.read(lambda conn: meta.all_ranges(conn, gateway, log_id))


def _lock_directory(data_dir: Path) -> int:
    """The SQLite store's one writer: an exclusive flock on ``cloudd.lock`` (released with its fd)."""
    lock_fd = os.open(data_dir / "cloudd.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise StoreLocked(f"{data_dir} is in use by another cloudd") from None
    return lock_fd
