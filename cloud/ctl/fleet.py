"""``cloudctl fleet`` (one page of the fleet, sorted and filtered by cloudd) and ``cloudctl gateway
<id>`` (one gateway in full): the same documents the dashboard's fleet and gateway pages show.

Invariant: the formatters are pure (a document and the time in, text out), as in ``text.py``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote, urlencode

from cloud.ctl.http import get_json
from cloud.ctl.text import _when, format_table

SORT_KEYS = ("id", "state", "last_seen", "backlog_records", "rtt_ms", "cloud_tasks", "records", "alerts")


def add_fleet_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    fleet = commands.add_parser("fleet", parents=[common], help="gateways: state, backlog, link, placement")
    fleet.add_argument("--sort", choices=SORT_KEYS, default="id")
    fleet.add_argument("--desc", action="store_true", help="largest first")
    fleet.add_argument("--state", choices=("online", "degraded", "offline"))
    fleet.add_argument("--filter", default="", help="only gateways whose id contains this")
    fleet.add_argument("--limit", type=int, default=100, help="rows per page (at most 1000)")
    fleet.add_argument("--offset", type=int, default=0)
    gateway = commands.add_parser("gateway", parents=[common], help="one gateway: services, placement, link")
    gateway.add_argument("gateway_id")


def run_fleet(args: argparse.Namespace, base: str, now: float) -> int:
    if args.command == "gateway":
        doc = get_json(f"{base}/v1/gateways/{quote(args.gateway_id, safe='')}", args.token, args.timeout)
        print(json.dumps(doc, indent=2) if args.json else format_gateway(doc, now))
        return 0
    query = {"sort": args.sort, "q": args.filter, "limit": args.limit, "offset": args.offset}
    if args.desc:
        query["desc"] = 1
    if args.state:
        query["state"] = args.state
    doc = get_json(f"{base}/v1/fleet?{urlencode(query)}", args.token, args.timeout)
    print(json.dumps(doc, indent=2) if args.json else format_fleet(doc, now))
    return 0


def _link(link: dict[str, Any] | None) -> str | None:
    if link is None:
        return None
    return "down" if not link["up"] else f"{link.get('rtt_ms') or 0:.0f}ms"


def format_fleet(doc: dict[str, Any], now: float) -> str:
    rows = [
        [
            g["id"],
            g["state"],
            _when(g["last_seen"], now),
            g["backlog_records"],
            _link(g.get("link")),
            f"{g['cloud_tasks']}/{g['tasks']} cloud" if g["tasks"] else None,
            g["records"],
            g["alerts"],
        ]
        for g in doc["gateways"]
    ]
    t, page = doc["totals"], doc["page"]
    shown = (
        f"rows {page['offset'] + 1}-{page['offset'] + len(rows)} of {page['matched']}" if rows else "no rows"
    )
    return (
        format_table(
            ["GATEWAY", "STATE", "LAST SEEN", "BACKLOG", "LINK", "PLACEMENT", "RECORDS", "ALERTS"], rows
        )
        + f"\n\n{shown}; {t['online']} online, {t['degraded']} degraded, {t['offline']} offline of"
        f" {t['gateways']}; {t['backlog_records']} records in backlogs; {t['open_alerts']} open alerts"
    )


def format_gateway(doc: dict[str, Any], now: float) -> str:
    link = doc.get("link") or {}
    lines = [
        f"gateway {doc['id']}: {doc['state']}, last heartbeat {_when(doc['last_heartbeat'], now) or 'never'}",
        f"backlog {doc['backlog_records'] if doc['backlog_records'] is not None else '-'} records;"
        f" link {_link(doc.get('link')) or '-'}"
        + (f", goodput {link['bandwidth_bps'] / 8e3:.1f} kB/s" if link.get("bandwidth_bps") else "")
        + (f", up {100 * link['availability']:.0f}%" if link.get("availability") is not None else ""),
        f"uplink: {doc['uplink']['records']} records in {doc['uplink']['batches']} batches,"
        f" {doc['uplink']['duplicates']} duplicates; {doc['alerts']} open alerts",
    ]
    if doc["services"]:
        services = [[s["service"], s["state"], s["detail"] or None] for s in doc["services"]]
        lines += ["", format_table(["SERVICE", "STATE", "LAST ERROR"], services)]
    if doc.get("models"):
        models = [[m.get("name"), m.get("version"), m.get("stage")] for m in doc["models"]]
        lines += ["", format_table(["MODEL", "VERSION", "STAGE"], models)]
    if doc["placement"]:
        placement = [[p["service"], p["task"], p["where"], p["reason"] or None] for p in doc["placement"]]
        lines += [
            "",
            f"placement: {doc['cloud_tasks']} of {doc['tasks']} tasks in the cloud",
            format_table(["SERVICE", "TASK", "WHERE", "WHY"], placement),
        ]
    if doc["devices"]:
        devices = [[d["device"], d["records"], _when(d["last_ts"], now)] for d in doc["devices"]]
        lines += ["", format_table(["DEVICE", "RECORDS", "LAST MESSAGE"], devices)]
    return "\n".join(lines)
