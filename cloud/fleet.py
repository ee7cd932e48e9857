"""FleetView: each gateway's latest heartbeat, its recent history, and the fleet documents built on them.

Kept in memory: a restarted cloudd knows its gateways (from their tokens and the store's upload
counts) and shows each offline, with no history, until its next heartbeat. The documents
(``fleet_rows``, ``fleet_page``, ``gateway_document``) are pure functions of what they are given.

Invariant: per gateway cloudd has a token for, at most one latest heartbeat, HISTORY_POINTS
history points and PLACEMENT_CHANGES placement changes are held (newest kept), so the view's
size is bounded by the configured fleet.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from protocol.fleet import OFFLINE_AFTER_INTERVALS, GatewayHeartbeat, is_online

HISTORY_POINTS = 720  # an hour of 5 s heartbeats
PLACEMENT_CHANGES = 50
BAD_SERVICE_STATES = frozenset(("degraded", "failed"))
SORT_KEYS = ("id", "state", "last_seen", "backlog_records", "rtt_ms", "cloud_tasks", "records", "alerts")


@dataclass(frozen=True)
class Seen:
    heartbeat: GatewayHeartbeat
    received_ts: float


@dataclass
class History:
    """One gateway's recent heartbeats as points, and the placement decisions that changed."""

    points: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    placement_changes: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=PLACEMENT_CHANGES))


class FleetView:
    def __init__(self) -> None:
        self._latest: dict[str, Seen] = {}
        self._history: dict[str, History] = {}
        self.heartbeats = 0

    def record(self, heartbeat: GatewayHeartbeat, received_ts: float) -> None:
        previous = self._latest.get(heartbeat.gateway)
        history = self._history.setdefault(heartbeat.gateway, History())
        link = heartbeat.link
        history.points.append(
            {
                "ts": received_ts,
                "backlog_records": heartbeat.backlog_records,
                "backlog_bytes": heartbeat.backlog_bytes,
                "up": link.up if link else None,
                "rtt_ms": link.rtt_ms if link else None,
                "bandwidth_bps": link.bandwidth_bps if link else None,
                "availability": link.availability if link else None,
                "log_bytes": heartbeat.counters.log_bytes if heartbeat.counters else None,
            }
        )
        before = {(p.service, p.task): p.where for p in previous.heartbeat.placement} if previous else {}
        for p in heartbeat.placement:
            if before.get((p.service, p.task)) != p.where:
                history.placement_changes.append({"ts": received_ts, **p.model_dump()})
        self._latest[heartbeat.gateway] = Seen(heartbeat, received_ts)
        self.heartbeats += 1

    def latest(self) -> dict[str, Seen]:
        return dict(self._latest)

    def history(self, gateway: str) -> History:
        return self._history.get(gateway, History())


def heartbeat_models(heartbeat: GatewayHeartbeat) -> dict[str, dict[str, Any]]:
    """The heartbeat's ``models`` figures (what each model name runs, and how it does) as plain dicts;
    {} from a gateway that reports none."""
    models = getattr(heartbeat, "models", None) or {}
    return {
        name: figures.model_dump() if isinstance(figures, BaseModel) else dict(figures)
        for name, figures in models.items()
    }


def gateway_state(seen: Seen | None, now: float) -> str:
    """online | degraded (online, some service degraded or failed) | offline."""
    if seen is None or not is_online(seen.received_ts, seen.heartbeat.interval_s, now):
        return "offline"
    return "degraded" if any(s.state in BAD_SERVICE_STATES for s in seen.heartbeat.services) else "online"


def fleet_rows(
    gateways: list[str],
    latest: dict[str, Seen],
    uploads: dict[str, dict[str, Any]],
    open_alerts: dict[str, int],
    now: float,
) -> list[dict[str, Any]]:
    """One row per configured gateway: state from heartbeats, upload counts from the store."""
    rows = []
    for gateway in sorted(set(gateways) | set(latest)):
        seen, upload = latest.get(gateway), uploads.get(gateway, {})
        beat = seen.heartbeat if seen else None
        last_seen = max(
            filter(None, [seen.received_ts if seen else None, upload.get("last_seen")]), default=None
        )
        placement = [p.model_dump() for p in beat.placement] if beat else []
        state = gateway_state(seen, now)
        rows.append(
            {
                "id": gateway,
                "state": state,
                "online": state != "offline",
                "last_heartbeat": seen.received_ts if seen else None,
                "last_seen": last_seen,
                "interval_s": beat.interval_s if beat else None,
                "backlog_records": beat.backlog_records if beat else None,
                "backlog_bytes": beat.backlog_bytes if beat else None,
                "link": beat.link.model_dump() if beat and beat.link else None,
                "placement": placement,
                "cloud_tasks": sum(p["where"] == "cloud" for p in placement),
                "tasks": len(placement),
                "services": [s.model_dump() for s in beat.services] if beat else [],
                "software": beat.software if beat else None,
                "models": heartbeat_models(beat) if beat else {},
                "records": upload.get("records", 0),
                "batches": upload.get("batches", 0),
                "alerts": open_alerts.get(gateway, 0),
            }
        )
    return rows


def _sort_value(row: dict[str, Any], key: str) -> Any:
    if key == "state":
        return ("offline", "degraded", "online").index(row["state"])
    if key == "rtt_ms":
        return row["link"]["rtt_ms"] if row["link"] else None
    return row[key]


def fleet_page(
    rows: list[dict[str, Any]],
    now: float,
    *,
    sort: str = "id",
    desc: bool = False,
    query: str = "",
    state: str | None = None,
    offset: int = 0,
    limit: int = 100,
) -> dict[str, Any]:
    """The summary of all rows, and one page of them filtered (``query`` in the id, ``state``) and
    sorted (gateways with no value for the key last, either way; ties by id)."""
    shown = [
        r
        for r in rows
        if (not query or query.lower() in r["id"].lower()) and (state is None or r["state"] == state)
    ]
    known = [r for r in shown if _sort_value(r, sort) is not None]
    known.sort(key=lambda r: r["id"])
    known.sort(key=lambda r: _sort_value(r, sort), reverse=desc)
    ordered = known + [r for r in shown if _sort_value(r, sort) is None]
    return {
        "v": 1,
        "now": now,
        "offline_after_intervals": OFFLINE_AFTER_INTERVALS,
        "totals": {
            "gateways": len(rows),
            "online": sum(r["state"] == "online" for r in rows),
            "degraded": sum(r["state"] == "degraded" for r in rows),
            "offline": sum(r["state"] == "offline" for r in rows),
            "backlog_records": sum(r["backlog_records"] or 0 for r in rows),
            "open_alerts": sum(r["alerts"] for r in rows),
        },
        "page": {
            "sort": sort,
            "desc": desc,
            "q": query,
            "state": state,
            "offset": offset,
            "limit": limit,
            "matched": len(ordered),
        },
        "gateways": ordered[offset : offset + limit],
    }


def gateway_document(
    row: dict[str, Any], seen: Seen | None, history: History, upload: dict[str, Any]
) -> dict[str, Any]:
    """One gateway in full: its fleet row, the latest heartbeat as sent, history and placement."""
    beat = seen.heartbeat if seen else None
    return {
        **row,
        "heartbeat": beat.model_dump() if beat else None,
        "models": [{"name": name, **figures} for name, figures in heartbeat_models(beat).items()]
        if beat
        else None,
        "counters": beat.counters.model_dump() if beat and beat.counters else None,
        "history": list(history.points),
        "placement_changes": list(reversed(history.placement_changes)),
        "uplink": {
            "records": upload.get("records", 0),
            "batches": upload.get("batches", 0),
            "duplicates": upload.get("duplicates", 0),
            "last_upload": upload.get("last_seen"),
        },
    }
