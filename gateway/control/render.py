"""What gatewayctl prints for a person (``--json`` prints the answers as they are): a table or a few
lines per command, with times as a person reads them: "12s ago" within the hour, the local date and
time beyond, and log lines stamped with the local time to the millisecond.

Invariant: pure functions of an answer and the time now (``now``, injected): the same answer
always prints the same text; no number is left out of the JSON for the table's sake.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gateway.control import log_verify
from protocol.control import ControlResponse

RECENT_S = 3600.0  # within this, a time reads as "12s ago" / "7m 5s ago"; beyond, as a local time


def ago(ts: float, now: float) -> str:
    """``ts`` (epoch seconds) for a person: "12s ago", "7m 5s ago", else the local time (ISO, seconds).
    A time ahead of ``now`` (another box's clock) is shown as a local time too."""
    seconds = now - ts
    if -1 < seconds < 60:
        return f"{max(0, round(seconds))}s ago"
    if 0 < seconds < RECENT_S:
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m {rest}s ago"
    return datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def log_line(line: dict[str, Any]) -> str:
    stamp = datetime.fromtimestamp(line["ts"]).isoformat(sep=" ", timespec="milliseconds")
    return f"{stamp} {line['level']:<7} {line['logger']}: {line['message']}"


def log_lines(data: dict[str, Any]) -> list[str]:
    """A ``log.errors`` answer: a note for a restarted gateway or lines lost to the ring, then the lines."""
    out = []
    if data.get("restarted"):
        out.append("-- the gateway restarted: its lines from the start of this run --")
    if data.get("missed"):
        out.append(
            f"-- {data['missed']} lines were pushed out of the gateway's ring before they were read --"
        )
    return out + [log_line(line) for line in data["lines"]]


def _services(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    rows = [{**view, "changed_at": view["revision"]} for view in (response.data or {})["services"]]
    columns = ["service", "state", "applied", "changed_at", "handler", "detail"]
    return table(rows, columns) + f"\nconfig revision {response.revision} (what --revision takes)"


def _logs(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    data = response.data or {}
    if not data["lines"]:
        return "no recent warnings or errors" if args.level == "WARNING" else f"no recent {args.level} lines"
    return "\n".join(log_lines(data))


def _devices(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    data = response.data or {}
    if args.action is not None:
        return _change(args, response, now)
    rows = [
        {
            **seen,
            "allowed": "yes" if seen["allowed"] else "no",
            "last_seen": ago(seen["last_ts"], now),
            "rejected": ", ".join(f"{reason} {n}" for reason, n in sorted(seen["rejected"].items())),
        }
        for seen in data["devices"]
    ]
    columns = ["device", "allowed", "last_seen", "messages", "accepted", "redelivered", "rejected"]
    out = [table(rows, columns) if rows else "no device heard from since the gateway started"]
    out.append(f"allow: {', '.join(data['allow'])} (devices add|remove changes it)")
    if data["forgotten"]:
        out.append(
            f"{data['forgotten']} devices forgotten (only the {data['capacity']} most recent are kept)"
        )
    if data["unattributed"]:
        out.append(f"{data['unattributed']} messages on topics that name no device")
    return "\n".join(out)


def _placement(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    data = response.data or {}
    if args.action is not None:
        return _change(args, response, now)
    rows = [{"task": k, "pinned": v} for k, v in sorted(data["config"]["pins"].items())]
    pins = table(rows, ["task", "pinned"]) if rows else "no pins (the planner decides)"
    return pins + f"\n(state {data['state']}: {data['detail']})"


def _config(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    data = response.data or {}
    if args.action != "get":
        return _change(args, response, now)
    head = (
        f"{data['service']}: {data['state']}, applied: {data['applied']} (config revision "
        f"{response.revision}: what --revision takes; this service last changed at {data['revision']})"
    )
    return head + "\n" + json.dumps(data["config"], indent=2, sort_keys=True)


def _restart(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    view = response.data or {}
    return f"{view['service']} restarted: {_state(view)} (revision {response.revision}, unchanged)"


def _state(view: dict[str, Any]) -> str:
    return f"{view['state']}, applied: {view['applied']}" + (f" ({view['detail']})" if view["detail"] else "")


def _change(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    data = response.data or {}
    if not data.get("changed"):
        return f"no change (revision {response.revision})"
    lines = [f"revision {response.revision}"]
    lines += [f"  {view['service']}: {_state(view)}" for view in data["services"].values()]
    return "\n".join(lines)


_RENDERERS: dict[str, Callable[[argparse.Namespace, ControlResponse, float], str]] = {
    "services": _services,
    "logs": _logs,
    "devices": _devices,
    "placement": _placement,
    "config": _config,
    "restart": _restart,
    "log": lambda args, response, now: log_verify.describe(response.data or {}),
}


def human(args: argparse.Namespace, response: ControlResponse, now: float) -> str:
    """What a person reads for the answer to ``args.command`` (an ``ok`` one)."""
    return _RENDERERS.get(args.command, _change)(args, response, now)


def presence(gateway: str, status: dict[str, Any], now: float) -> str:
    """The retained status as a line: ``gateway gw1: online (since 12s ago)``."""
    ts = status.get("ts")
    since = ago(ts, now) if isinstance(ts, int | float) else "?"
    return f"gateway {status.get('gateway', gateway)}: {status.get('state', '?')} (since {since})"
