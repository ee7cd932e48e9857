"""DatasetStore: the records gateways uploaded, stored once each, and what they add up to.

Records live in append-only segment files (``segments.py``), one series per gateway under
``<data_dir>/datasets/``; metadata lives in SQLite at ``<data_dir>/meta.sqlite`` (``meta.py``).

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

Concurrency: one writer per data directory (an exclusive ``flock``), used from one thread at a
time (``AsyncStoreWriter`` gives it one). Readers (``iter_records``, ``counts``) use their own
SQLite connection per call and see only committed batches, so they are safe from any thread, and
from another process with ``DatasetStore.open(dir, readonly=True)`` (which never recovers).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cloud.store import alerts, meta, segments, series
from cloud.store.intervals import merge, runs, split_new
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
        self, data_dir: Path, *, readonly: bool, segment_max_bytes: int, clock: Callable[[], float]
    ) -> None:
        self.data_dir = Path(data_dir)
        self.datasets_dir = self.data_dir / "datasets"
        self.readonly = readonly
        self.segment_max_bytes = segment_max_bytes
        self.clock = clock
        self.corrupt_lines = 0  # committed lines that did not parse, seen by readers
        self.recovery = RecoveryReport()
        self._lock_fd: int | None = None
        self._conn = None if readonly else meta.connect(self.data_dir / "meta.sqlite")

    @classmethod
    def open(
        cls,
        data_dir: Path | str,
        *,
        readonly: bool = False,
        segment_max_bytes: int = segments.DEFAULT_SEGMENT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> DatasetStore:
        """Open (creating if needed) the store; a writer takes the lock and recovers first."""
        data_dir = Path(data_dir)
        if readonly:
            if not (data_dir / "meta.sqlite").exists():
                raise FileNotFoundError(f"{data_dir}: no meta.sqlite (has cloudd ever run here?)")
            return cls(data_dir, readonly=True, segment_max_bytes=segment_max_bytes, clock=clock)
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(data_dir / "cloudd.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise StoreLocked(f"{data_dir} is in use by another cloudd") from None
        try:
            store = cls(data_dir, readonly=False, segment_max_bytes=segment_max_bytes, clock=clock)
        except BaseException:
            os.close(lock_fd)
            raise
        store._lock_fd = lock_fd
        store._recover()
        return store

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- recovery -------------------------------------------------------------------------------

    def _recover(self) -> None:
        assert self._conn is not None
        committed = {(gw, seq): n for gw, seq, n in meta.segments(self._conn)}
        report = self.recovery
        for (gw, seq), n in committed.items():
            result = segments.recover(segments.segment_path(self.datasets_dir, gw, seq), n)
            report.cut_bytes += result.cut_bytes
            if result.missing_bytes:
                report.missing_bytes[result.path] = result.missing_bytes
        if self.datasets_dir.exists():
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
        if self._conn is None:
            raise RuntimeError("store is closed or read-only")
        conn = self._conn
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
            seq, committed_len = self._segment_for(gw, len(data))
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

    def _segment_for(self, gateway: str, nbytes: int) -> tuple[int, int]:
        """(seq, committed_len) of the segment the next write goes to; rolls over when full."""
        assert self._conn is not None
        rows = meta.segments(self._conn, gateway)
        if not rows:
            return 1, 0
        _, seq, committed_len = rows[-1]
        if committed_len > 0 and committed_len + nbytes > self.segment_max_bytes:
            return seq + 1, 0
        return seq, committed_len

    # -- reading --------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        return meta.connect(self.data_dir / "meta.sqlite", readonly=True)

    def iter_records(self, gateway: str | None = None) -> Iterator[StoredRecord]:
        """Every committed record (of one gateway, or all), in storage order per gateway."""
        conn = self._reader()
        try:
            snapshot = meta.segments(conn, gateway)
        finally:
            conn.close()
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
        conn = self._reader()
        try:
            snapshot = meta.segments(conn, gateway)
        finally:
            conn.close()
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

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``query`` (a function of ``series`` or ``alerts``) on a reader connection of its own,
        in one snapshot: safe from any thread."""
        conn = self._reader()
        try:
            conn.execute("BEGIN")
            return query(conn)
        finally:
            conn.close()

    def write(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``change`` in one transaction on the writer's connection (the writer's thread only)."""
        if self._conn is None:
            raise RuntimeError("store is closed or read-only")
        return meta.write(self._conn, change)

    def counts(self) -> StoreCounts:
        conn = self._reader()
        try:
            conn.execute("BEGIN")  # one snapshot for both tables
            result = StoreCounts(meta.gateway_counts(conn), meta.device_counts(conn))
            conn.execute("COMMIT")
            return result
        finally:
            conn.close()

    def stored_ranges(self, gateway: str, log_id: str) -> list[tuple[int, int]]:
        """The merged LSN intervals held for (gateway, log_id)."""
        conn = self._reader()
        try:
            return meta.all_ranges(conn, gateway, log_id)
        finally:
            conn.close()
