"""Alerts: the stored event records whose body has ``"severity": "alert"``, and their acknowledgement.

Table ``alerts`` (id, gateway, log_id, lsn, device, ts, type, body JSON, acked_ts, acked_by);
``id`` grows in arrival order, so "newest first" is ``ORDER BY id DESC``.

Invariant: one row per stored alert record, named by (gateway, log_id, lsn): ``collect`` sees only
records a batch stores for the first time and ``insert`` runs inside the batch's metadata
transaction (``meta.commit_batch``), so the list holds exactly the alerts stored. An
acknowledgement is kept in the same database, so it survives a restart; acknowledging twice keeps
the first time and who.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from cloud.store.database import Conn
from protocol.records import Record

SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    id {serial_pk}, gateway TEXT NOT NULL, log_id TEXT NOT NULL, lsn {int8} NOT NULL,
    device TEXT NOT NULL, ts {real} NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    acked_ts {real}, acked_by TEXT, UNIQUE (gateway, log_id, lsn));
CREATE INDEX IF NOT EXISTS alerts_by_gateway ON alerts (gateway, id);
CREATE INDEX IF NOT EXISTS alerts_open ON alerts (acked_ts, gateway);
"""

AlertRow = tuple[str, str, int, str, float, str, str]


def collect(gateway: str, log_id: str, records: Iterable[tuple[int, Record]]) -> list[AlertRow]:
    """The alert rows among (lsn, record) pairs: event records with severity "alert"."""
    return [
        (
            gateway,
            log_id,
            lsn,
            r.device,
            float(r.received_ts),
            str(r.body.get("type", "event")),
            json.dumps(r.body),
        )
        for lsn, r in records
        if r.kind == "event" and r.body.get("severity") == "alert"
    ]


def insert(conn: Conn, rows: list[AlertRow]) -> None:
    """Add the rows; the caller holds the transaction."""
    conn.executemany(
        "INSERT INTO alerts (gateway, log_id, lsn, device, ts, type, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        rows,
    )


def listing(
    conn: Conn, gateway: str | None, open_only: bool, limit: int, before: int | None
) -> list[dict[str, Any]]:
    """Newest first, at most ``limit``; ``before`` (an id) pages further back."""
    where, args = ["1=1"], list[Any]()
    if gateway is not None:
        where.append("gateway=?")
        args.append(gateway)
    if open_only:
        where.append("acked_ts IS NULL")
    if before is not None:
        where.append("id<?")
        args.append(before)
    rows = conn.execute(
        "SELECT id, gateway, log_id, lsn, device, ts, type, body, acked_ts, acked_by FROM alerts "
        f"WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
        (*args, limit),
    )
    keys = ("id", "gateway", "log_id", "lsn", "device", "ts", "type", "body", "acked_ts", "acked_by")
    out = [dict(zip(keys, row, strict=True)) for row in rows]
    for alert in out:
        alert["body"] = json.loads(alert["body"])
    return out


def open_counts(conn: Conn) -> dict[str, int]:
    """Unacknowledged alerts per gateway (gateways without any are absent)."""
    rows = conn.execute("SELECT gateway, count(*) FROM alerts WHERE acked_ts IS NULL GROUP BY gateway")
    return dict(rows.fetchall())


def acknowledge(conn: Conn, ids: list[int], now: float, by: str) -> int:
    """Mark the alerts acknowledged (those already are keep their first acknowledgement); return
    how many of ``ids`` exist. The caller holds the transaction."""
    conn.executemany(
        "UPDATE alerts SET acked_ts=?, acked_by=? WHERE id=? AND acked_ts IS NULL",
        [(now, by, i) for i in ids],
    )
    marks = ",".join("?" * len(ids))
    (found,) = conn.execute(f"SELECT count(*) FROM alerts WHERE id IN ({marks})", ids).fetchone()
    return int(found)
