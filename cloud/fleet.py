"""FleetView: the latest heartbeat of each gateway, and the fleet document built from it.

Kept in memory: a restarted cloudd knows its gateways (from their tokens and the store's upload
counts) and shows each offline until its next heartbeat. ``fleet_document`` is pure.

Invariant: at most one heartbeat per gateway is held (the newest received), and only for gateways
cloudd has a token for, so the view's size is bounded by the configured fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from protocol.fleet import OFFLINE_AFTER_INTERVALS, GatewayHeartbeat, is_online


@dataclass(frozen=True)
class Seen:
    heartbeat: GatewayHeartbeat
    received_ts: float


class FleetView:
    def __init__(self) -> None:
        self._latest: dict[str, Seen] = {}
        self.heartbeats = 0

    def record(self, heartbeat: GatewayHeartbeat, received_ts: float) -> None:
        self._latest[heartbeat.gateway] = Seen(heartbeat, received_ts)
        self.heartbeats += 1

    def latest(self) -> dict[str, Seen]:
        return dict(self._latest)


def heartbeat_models(heartbeat: GatewayHeartbeat) -> dict[str, dict[str, Any]]:
    """The heartbeat's ``models`` figures (what each model name runs, and how it does) as plain dicts;
    {} from a gateway that reports none."""
    models = getattr(heartbeat, "models", None) or {}
    return {
        name: figures.model_dump() if isinstance(figures, BaseModel) else dict(figures)
        for name, figures in models.items()
    }


def fleet_document(
    gateways: list[str], latest: dict[str, Seen], uploads: dict[str, dict[str, Any]], now: float
) -> dict[str, Any]:
    """One row per configured gateway: online/offline from heartbeats, upload counts from the store."""
    rows = []
    for gateway in sorted(set(gateways) | set(latest)):
        seen, upload = latest.get(gateway), uploads.get(gateway, {})
        beat = seen.heartbeat if seen else None
        last_seen = max(
            filter(None, [seen.received_ts if seen else None, upload.get("last_seen")]), default=None
        )
        rows.append(
            {
                "id": gateway,
                "online": is_online(
                    seen.received_ts if seen else None, beat.interval_s if beat else None, now
                ),
                "last_heartbeat": seen.received_ts if seen else None,
                "last_seen": last_seen,
                "interval_s": beat.interval_s if beat else None,
                "backlog_records": beat.backlog_records if beat else None,
                "backlog_bytes": beat.backlog_bytes if beat else None,
                "link": beat.link.model_dump() if beat and beat.link else None,
                "placement": [p.model_dump() for p in beat.placement] if beat else [],
                "services": [s.model_dump() for s in beat.services] if beat else [],
                "software": beat.software if beat else None,
                "models": heartbeat_models(beat) if beat else {},
                "records": upload.get("records", 0),
                "batches": upload.get("batches", 0),
            }
        )
    online = sum(r["online"] for r in rows)
    return {
        "v": 1,
        "now": now,
        "offline_after_intervals": OFFLINE_AFTER_INTERVALS,
        "totals": {"gateways": len(rows), "online": online, "offline": len(rows) - online},
        "gateways": rows,
    }
