"""The store's metadata (cloud/store/database.py: SQLite or PostgreSQL): what the segments mean.

Tables: ``segments`` (committed length of each segment file), ``lsn_ranges`` (per gateway and
log_id, the merged intervals of LSNs already stored), ``gateways`` and ``devices`` (counts), and
the tables of ``series.py`` (device charts) and ``alerts.py``, written in the same transaction.
Invariant: every row here describes bytes that are already fsynced in a segment; a batch changes
them only inside one transaction (``commit_batch``, run by ``DatasetStore.store_batch`` under the
gateway's lock), so a reader sees a batch entirely or not at all. Functions take a ``Conn`` inside
a transaction; they never begin or commit one themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cloud.store import alerts, series
from cloud.store.database import Conn
from cloud.store.intervals import Interval
from cloud.store.migrations import Migration

COMPONENT = "store"
# 2 added the series and alerts tables (cloud/store/series.py, alerts.py); a version-1 database
# is upgraded in place by creating them: records stored before have no series rows and no alerts.
MIGRATIONS = (
    Migration(
        1,
        "segments, LSN ranges, gateway and device counts",
        """
CREATE TABLE IF NOT EXISTS segments (
    gateway TEXT NOT NULL, seq {int8} NOT NULL, committed_len {int8} NOT NULL,
    PRIMARY KEY (gateway, seq));
CREATE TABLE IF NOT EXISTS lsn_ranges (
    gateway TEXT NOT NULL, log_id TEXT NOT NULL, lo {int8} NOT NULL, hi {int8} NOT NULL,
    PRIMARY KEY (gateway, log_id, lo));
CREATE TABLE IF NOT EXISTS gateways (
    id TEXT PRIMARY KEY, last_seen {real}, records {int8} NOT NULL DEFAULT 0,
    batches {int8} NOT NULL DEFAULT 0, duplicates {int8} NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS devices (
    gateway TEXT NOT NULL, device TEXT NOT NULL, records {int8} NOT NULL DEFAULT 0, last_ts {real},
    PRIMARY KEY (gateway, device));
""",
    ),
    Migration(2, "device series and alerts", series.SCHEMA + alerts.SCHEMA),
)


def gateway_lock(gateway: str) -> str:
    """The lock key a batch of ``gateway`` holds: its segment files and LSN ranges change under it."""
    return f"gateway:{gateway}"


def segments(conn: Conn, gateway: str | None = None) -> list[tuple[str, int, int]]:
    """(gateway, seq, committed_len), ordered by gateway then seq."""
    if gateway is None:
        rows = conn.execute("SELECT gateway, seq, committed_len FROM segments ORDER BY gateway, seq")
    else:
        rows = conn.execute(
            "SELECT gateway, seq, committed_len FROM segments WHERE gateway=? ORDER BY seq", (gateway,)
        )
    return [(g, s, n) for g, s, n in rows]


def ranges_near(conn: Conn, gateway: str, log_id: str, first: int, last: int) -> list[Interval]:
    """Stored intervals that overlap or touch [first, last] (those a merge may join), sorted.

    Two seeks on the primary key (gateway, log_id, lo), never a scan: the stored intervals are
    disjoint, so of those starting before ``first - 1`` only the last can reach into the span, and
    every other candidate starts inside [first - 1, last + 1]. (``lo<=last+1 AND hi>=first-1`` as
    one condition walks every interval below the span: 100k rows per batch while a backlog that
    was drained by class leaves one interval per alert and summary record.)"""
    before = conn.execute(
        "SELECT lo, hi FROM lsn_ranges WHERE gateway=? AND log_id=? AND lo<? ORDER BY lo DESC LIMIT 1",
        (gateway, log_id, first - 1),
    ).fetchall()
    inside = conn.execute(
        "SELECT lo, hi FROM lsn_ranges WHERE gateway=? AND log_id=? AND lo>=? AND lo<=? ORDER BY lo",
        (gateway, log_id, first - 1, last + 1),
    ).fetchall()
    return [(lo, hi) for lo, hi in before if hi >= first - 1] + [(lo, hi) for lo, hi in inside]


def all_ranges(conn: Conn, gateway: str, log_id: str) -> list[Interval]:
    rows = conn.execute(
        "SELECT lo, hi FROM lsn_ranges WHERE gateway=? AND log_id=? ORDER BY lo", (gateway, log_id)
    )
    return [(lo, hi) for lo, hi in rows]


@dataclass(frozen=True)
class BatchCommit:
    """Everything one acknowledged batch changes in the metadata, applied atomically."""

    gateway: str
    log_id: str
    now: float
    stored: int
    duplicates: int
    segment: tuple[int, int] | None  # (seq, new committed_len), None when nothing was written
    old_ranges: list[Interval]  # replaced by new_ranges
    new_ranges: list[Interval]
    devices: dict[str, tuple[int, float]]  # device -> (records added, max received_ts)
    series: series.SeriesBatch = field(default_factory=series.SeriesBatch)  # the telemetry's chart rows
    alerts: list[alerts.AlertRow] = field(default_factory=list)


def commit_batch(conn: Conn, change: BatchCommit) -> None:
    """Apply ``change``; the caller holds the transaction (and the gateway's lock)."""
    if change.segment is not None:
        seq, committed_len = change.segment
        conn.execute(
            "INSERT INTO segments (gateway, seq, committed_len) VALUES (?, ?, ?) "
            "ON CONFLICT (gateway, seq) DO UPDATE SET committed_len=excluded.committed_len",
            (change.gateway, seq, committed_len),
        )
    conn.executemany(
        "DELETE FROM lsn_ranges WHERE gateway=? AND log_id=? AND lo=?",
        [(change.gateway, change.log_id, lo) for lo, _ in change.old_ranges],
    )
    conn.executemany(
        "INSERT INTO lsn_ranges (gateway, log_id, lo, hi) VALUES (?, ?, ?, ?)",
        [(change.gateway, change.log_id, lo, hi) for lo, hi in change.new_ranges],
    )
    conn.executemany(
        "INSERT INTO devices (gateway, device, records, last_ts) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (gateway, device) DO UPDATE SET records=devices.records+excluded.records, "
        "last_ts=greatest(devices.last_ts, excluded.last_ts)",
        [(change.gateway, dev, n, ts) for dev, (n, ts) in change.devices.items()],
    )
    conn.execute(
        "INSERT INTO gateways (id, last_seen, records, batches, duplicates) VALUES (?, ?, ?, 1, ?) "
        "ON CONFLICT (id) DO UPDATE SET last_seen=excluded.last_seen, "
        "records=gateways.records+excluded.records, batches=gateways.batches+1, "
        "duplicates=gateways.duplicates+excluded.duplicates",
        (change.gateway, change.now, change.stored, change.duplicates),
    )
    series.apply(conn, change.gateway, change.series)
    alerts.insert(conn, change.alerts)


@dataclass(frozen=True)
class GatewayCounts:
    id: str
    last_seen: float | None
    records: int
    batches: int
    duplicates: int


@dataclass(frozen=True)
class DeviceCounts:
    gateway: str
    device: str
    records: int
    last_ts: float | None


def gateway_counts(conn: Conn) -> list[GatewayCounts]:
    rows = conn.execute("SELECT id, last_seen, records, batches, duplicates FROM gateways ORDER BY id")
    return [GatewayCounts(*row) for row in rows]


def device_counts(conn: Conn) -> list[DeviceCounts]:
    rows = conn.execute("SELECT gateway, device, records, last_ts FROM devices ORDER BY gateway, device")
    return [DeviceCounts(*row) for row in rows]
