"""Device telemetry as series: the rows a device chart reads, kept at batch commit.

Tables (every query a device page makes lives in this module, written once for SQLite and
PostgreSQL: cloud/store/database.py):

    samples           one row per stored telemetry message: (gateway, device, ts, seq, status,
                      readings JSON); the raw tier, read for short windows
    rollups           per (gateway, device, width, name, bucket): count, sum, min, max of one
                      reading in the bucket ``[bucket*width, (bucket+1)*width)``; widths 1 s to 1 h
    message_rollups   per (gateway, device, width, bucket): messages, faults, lowest and highest seq

``ts`` is the gateway's receive time of the message (``Record.received_ts``), the clock every
stored record shares; the device's own ``ts`` may run on simulated time.

Invariant: the three tables describe exactly the telemetry records stored, each once: ``collect``
sees only the records a batch stores for the first time (duplicates never reach it) and ``apply``
runs inside the batch's metadata transaction (``meta.commit_batch``). A window query therefore
reads about ``points`` to ten times ``points`` rows per reading, never the raw rows of a long
window: a week at 10 Hz in 600 points is 1,008 ten-minute rows per reading.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cloud.store.database import Conn
from protocol.records import Record

# Seconds; the raw tier has width 0. Neighbours are at most 10x apart, so a window read from the
# widest tier not wider than its step scans at most about 10 rows per chart point and reading.
ROLLUP_WIDTHS = (1, 10, 60, 600, 3600)
MAX_RAW_ROWS = 20_000  # a raw window longer than this is cut (its answer says so)

SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    gateway TEXT NOT NULL, device TEXT NOT NULL, ts {real} NOT NULL, seq {int8} NOT NULL,
    status TEXT NOT NULL, readings TEXT NOT NULL,
    PRIMARY KEY (gateway, device, ts, seq)) {norowid};
CREATE TABLE IF NOT EXISTS rollups (
    gateway TEXT NOT NULL, device TEXT NOT NULL, width INTEGER NOT NULL, name TEXT NOT NULL,
    bucket {int8} NOT NULL, n INTEGER NOT NULL, total {real} NOT NULL, lo {real} NOT NULL, hi {real} NOT NULL,
    PRIMARY KEY (gateway, device, width, name, bucket)) {norowid};
CREATE TABLE IF NOT EXISTS message_rollups (
    gateway TEXT NOT NULL, device TEXT NOT NULL, width INTEGER NOT NULL, bucket {int8} NOT NULL,
    n INTEGER NOT NULL, faults INTEGER NOT NULL, seq_lo {int8} NOT NULL, seq_hi {int8} NOT NULL,
    PRIMARY KEY (gateway, device, width, bucket)) {norowid};
"""


@dataclass
class SeriesBatch:
    """What one batch adds to the series tables (built by ``collect``, written by ``apply``)."""

    samples: list[tuple[str, str, float, int, str, str]] = field(default_factory=list)
    rollups: dict[tuple[str, int, str, int], list[float]] = field(default_factory=dict)
    messages: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.samples)


def collect(gateway: str, records: Iterable[Record]) -> SeriesBatch:
    """The series rows of the telemetry among ``records`` (other kinds are skipped).

    Each message is added to its 1 s bucket only; the wider buckets are merged from those (a batch
    of 10 Hz data touches a few hundred seconds, so this is what keeps ingest cheap)."""
    out = SeriesBatch()
    finest = ROLLUP_WIDTHS[0]
    for record in records:
        body = record.body
        seq = body.get("seq")
        if record.kind != "telemetry" or not isinstance(seq, int):
            continue
        device, ts = record.device, float(record.received_ts)
        readings = body.get("readings") or {}
        fault = body.get("status") == "fault"
        out.samples.append((gateway, device, ts, seq, "fault" if fault else "ok", json.dumps(readings)))
        bucket = math.floor(ts / finest)
        m = out.messages.get((device, finest, bucket))
        if m is None:
            out.messages[(device, finest, bucket)] = [1, int(fault), seq, seq]
        else:
            m[0] += 1
            m[1] += fault
            if seq < m[2]:
                m[2] = seq
            elif seq > m[3]:
                m[3] = seq
        for name, value in readings.items():
            if value is None:
                continue
            key = (device, finest, name, bucket)
            r = out.rollups.get(key)
            if r is None:
                out.rollups[key] = [1, value, value, value]
            else:
                r[0] += 1
                r[1] += value
                if value < r[2]:
                    r[2] = value
                elif value > r[3]:
                    r[3] = value
    _widen(out)
    return out


def _widen(out: SeriesBatch) -> None:
    """Add the buckets of every wider width to ``out``, merged from its 1 s buckets."""
    finest = ROLLUP_WIDTHS[0]
    for width in ROLLUP_WIDTHS[1:]:
        for (device, w, bucket), (n, faults, lo, hi) in list(out.messages.items()):
            if w == finest:
                m = out.messages.setdefault((device, width, bucket * finest // width), [0, 0, lo, hi])
                m[0], m[1], m[2], m[3] = m[0] + n, m[1] + faults, min(m[2], lo), max(m[3], hi)
        for (device, w, name, bucket), (count, total, low, high) in list(out.rollups.items()):
            if w == finest:
                r = out.rollups.setdefault(
                    (device, width, name, bucket * finest // width), [0, 0.0, low, high]
                )
                r[0], r[1], r[2], r[3] = r[0] + count, r[1] + total, min(r[2], low), max(r[3], high)


def apply(conn: Conn, gateway: str, batch: SeriesBatch) -> None:
    """Add ``batch`` to the tables; the caller holds the transaction."""
    conn.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", batch.samples)
    conn.executemany(
        "INSERT INTO rollups VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (gateway, device, width, name, bucket) DO UPDATE SET n=rollups.n+excluded.n, "
        "total=rollups.total+excluded.total, lo=least(rollups.lo, excluded.lo), "
        "hi=greatest(rollups.hi, excluded.hi)",
        [(gateway, d, w, name, b, *v) for (d, w, name, b), v in batch.rollups.items()],
    )
    conn.executemany(
        "INSERT INTO message_rollups VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (gateway, device, width, bucket) DO UPDATE SET n=message_rollups.n+excluded.n, "
        "faults=message_rollups.faults+excluded.faults, "
        "seq_lo=least(message_rollups.seq_lo, excluded.seq_lo), "
        "seq_hi=greatest(message_rollups.seq_hi, excluded.seq_hi)",
        [(gateway, d, w, b, *v) for (d, w, b), v in batch.messages.items()],
    )


def tier_for(step_s: float) -> int:
    """The coarsest stored width no wider than one chart point (0: raw rows)."""
    fitting = [w for w in ROLLUP_WIDTHS if w <= step_s]
    return max(fitting) if fitting else 0


def window(conn: Conn, gateway: str, device: str, start: float, end: float, points: int) -> dict[str, Any]:
    """The readings of one device in [start, end) as at most about ``points`` buckets per reading.

    Answer: ``{"width", "step", "series": {name: [[t, mean, min, max, n], ...]}, "seq"}``; ``t``
    is the bucket's start. For the raw tier (``width`` 0) each point is one message, ``min`` and
    ``max`` equal its value and ``seq`` lists each message's seq in point order; ``cut`` is true
    when the window held more than MAX_RAW_ROWS messages and only the first were returned."""
    step = (end - start) / points
    width = tier_for(step)
    if width == 0:
        return _raw(conn, gateway, device, start, end, step)
    rows = conn.execute(
        "SELECT name, CAST(trunc((bucket * ? - ?) / ?) AS INTEGER) AS b, "
        "sum(n), sum(total), min(lo), max(hi) "
        "FROM rollups WHERE gateway=? AND device=? AND width=? AND bucket>=? AND bucket<? "
        "GROUP BY name, b ORDER BY name, b",
        (width, start, step, gateway, device, width, math.floor(start / width), math.ceil(end / width)),
    )
    series: dict[str, list[list[float]]] = {}
    for name, b, n, total, lo, hi in rows:
        series.setdefault(name, []).append([start + b * step, total / n, lo, hi, n])
    return {"width": width, "step": step, "series": series, "seq": None, "cut": False}


def _raw(conn: Conn, gateway: str, device: str, start: float, end: float, step: float) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT ts, seq, readings FROM samples WHERE gateway=? AND device=? AND ts>=? AND ts<? "
        "ORDER BY ts, seq LIMIT ?",
        (gateway, device, start, end, MAX_RAW_ROWS + 1),
    ).fetchall()
    cut = len(rows) > MAX_RAW_ROWS
    series: dict[str, list[list[float]]] = {}
    seqs: dict[str, list[int]] = {}
    for ts, seq, readings in rows[:MAX_RAW_ROWS]:
        for name, value in json.loads(readings).items():
            if value is not None:
                series.setdefault(name, []).append([ts, value, value, value, 1])
                seqs.setdefault(name, []).append(seq)
    return {"width": 0, "step": step, "series": series, "seq": seqs, "cut": cut}


def messages(conn: Conn, gateway: str, device: str, start: float, end: float) -> dict[str, Any]:
    """Messages, faults and gaps (seq numbers never stored) of one device in [start, end), counted
    on minute buckets (whole minutes around the window); ``gap_buckets`` lists the worst ones.

    A gap is a seq missing between the lowest and highest seq of a bucket, or between one bucket's
    highest and the next one's lowest; a seq that goes down (the device restarted) is no gap."""
    rows = conn.execute(
        "SELECT bucket, n, faults, seq_lo, seq_hi FROM message_rollups "
        "WHERE gateway=? AND device=? AND width=60 AND bucket>=? AND bucket<? ORDER BY bucket",
        (gateway, device, math.floor(start / 60), math.ceil(end / 60)),
    ).fetchall()
    total = faults = gaps = 0
    worst: list[tuple[int, float]] = []
    previous_hi: int | None = None
    for bucket, n, f, lo, hi in rows:
        missing = max(0, hi - lo + 1 - n) + (max(0, lo - previous_hi - 1) if previous_hi is not None else 0)
        total, faults, gaps, previous_hi = total + n, faults + f, gaps + missing, hi
        if missing:
            worst.append((missing, bucket * 60.0))
    worst.sort(reverse=True)
    return {
        "messages": total,
        "faults": faults,
        "gaps": gaps,
        "gap_buckets": [{"ts": ts, "missing": m} for m, ts in worst[:20]],
    }


def rate(conn: Conn, gateway: str, device: str, now: float, over_s: int = 60) -> float:
    """Messages per second over the last ``over_s`` seconds (whole seconds up to ``now``)."""
    (n,) = conn.execute(
        "SELECT coalesce(sum(n), 0) FROM message_rollups WHERE gateway=? AND device=? AND width=1 "
        "AND bucket>=? AND bucket<?",
        (gateway, device, math.floor(now) - over_s, math.floor(now)),
    ).fetchone()
    return float(n) / over_s


def last_message(conn: Conn, gateway: str, device: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT ts, seq, status, readings FROM samples WHERE gateway=? AND device=? "
        "ORDER BY ts DESC, seq DESC LIMIT 1",
        (gateway, device),
    ).fetchone()
    if row is None:
        return None
    return {"ts": row[0], "seq": row[1], "status": row[2], "readings": json.loads(row[3])}
