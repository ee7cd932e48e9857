"""cloudctl: the operator's command line for a running cloudd.

    cloudctl --url http://127.0.0.1:8700 [--token TOK] status [--json]

Invariant: exit 0 only when cloudd answered 200; an unreachable cloudd or an HTTP error prints
one line saying which and exits 1. Formatting (``format_table``, ``format_status``) is pure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8700"


class CtlError(Exception):
    """A request cloudctl could not complete; the message says why."""


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns, two spaces apart; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [bool(rows) and all(isinstance(row[i], int | float) for row in rows)
               for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _when(ts: float | None, now: float) -> str | None:
    if ts is None:
        return None
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"{stamp} ({max(0, int(now - ts))}s ago)"


def format_status(doc: dict[str, Any], now: float) -> str:
    gateways = format_table(
        ["GATEWAY", "LAST SEEN", "RECORDS", "BATCHES", "DUPLICATES"],
        [[g["id"], _when(g["last_seen"], now), g["records"], g["batches"], g["duplicates"]]
         for g in doc["gateways"]])
    devices = format_table(
        ["GATEWAY", "DEVICE", "RECORDS", "LAST TS"],
        [[d["gateway"], d["device"], d["records"], _when(d["last_ts"], now)] for d in doc["devices"]])
    totals = doc["totals"]
    return (f"{gateways}\n\n{devices}\n\n"
            f"total: {totals['records']} records in {totals['batches']} batches")


def get_json(url: str, token: str | None, timeout: float = 10.0) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
            why = f"{body.get('error')}: {body.get('detail')}"
        except ValueError:
            why = exc.reason
        raise CtlError(f"{url}: HTTP {exc.code} ({why})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CtlError(f"cannot reach cloudd at {url}: {reason}") from None
    except ValueError:
        raise CtlError(f"{url}: answer is not JSON") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cloudctl", description="talk to a running cloudd")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"cloudd base URL (default {DEFAULT_URL})")
    parser.add_argument("--token", help="operator token (when cloudd has --operator-token)")
    parser.add_argument("--timeout", type=float, default=10.0)
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="gateways and per-device record counts")
    status.add_argument("--json", action="store_true", help="print cloudd's raw JSON")
    args = parser.parse_args(argv)
    try:
        doc = get_json(args.url.rstrip("/") + "/v1/status", args.token, args.timeout)
    except CtlError as exc:
        print(f"cloudctl: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else format_status(doc, time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
