"""One device's data: its last message, rate, gaps, faults and readings over a window, and CSV.

    GET /v1/devices/{gateway_id}/{device}             operator; ?start=&end= (unix s, default the
                                                      last hour), ?points= (default 600)
    GET /v1/devices/{gateway_id}/{device}/series.csv  operator; the same window's points as CSV

Invariant: every figure comes from one read snapshot of the store's series tables
(cloud/store/series.py), so the chart, the counts and the CSV of one call agree; the window is
downsampled on the server to about ``points`` buckets per reading, never sent raw when long.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from cloud.api import params
from cloud.api.auth import operator_refusal
from cloud.api.context import STORE
from cloud.api.errors import error_response
from cloud.store import series
from cloud.store.database import Conn

DEVICE_PATH = "/v1/devices/{gateway_id}/{device}"
WEEK_S = 7 * 86400.0


def setup(app: web.Application) -> None:
    app.router.add_get(DEVICE_PATH, get_device)
    app.router.add_get(DEVICE_PATH + "/series.csv", get_device_csv)


def _window(request: web.Request) -> tuple[float, float, int]:
    now = time.time()
    end = params.number(request, "end", now, 0, 1e10)
    start = params.number(request, "start", end - 3600, 0, 1e10)
    if start >= end:
        raise params.BadParam(f"start: {start:g} must be before end {end:g}")
    if end - start > 5 * WEEK_S:
        raise params.BadParam(f"start: the window may span at most {5 * WEEK_S:g} s")
    return start, end, params.integer(request, "points", 600, 10, 100_000)


def _device(
    gateway: str, device: str, start: float, end: float, points: int
) -> Callable[[Conn], dict[str, Any] | None]:
    def query(conn: Conn) -> dict[str, Any] | None:
        known = conn.execute(
            "SELECT records, last_ts FROM devices WHERE gateway=? AND device=?", (gateway, device)
        ).fetchone()
        if known is None:
            return None
        return {
            "gateway": gateway,
            "device": device,
            "records": known[0],
            "last_ts": known[1],
            "start": start,
            "end": end,
            "last_message": series.last_message(conn, gateway, device),
            "rate_per_s": series.rate(conn, gateway, device, time.time()),
            "window": series.messages(conn, gateway, device, start, end),
            "chart": series.window(conn, gateway, device, start, end, points),
        }

    return query


async def _load(request: web.Request) -> dict[str, Any] | web.Response:
    refusal = operator_refusal(request)
    if refusal is not None:
        return refusal
    try:
        start, end, points = _window(request)
    except params.BadParam as exc:
        return params.bad_param(exc)
    gateway, device = request.match_info["gateway_id"], request.match_info["device"]
    doc = await request.app[STORE].read(_device(gateway, device, start, end, points))
    if doc is None:
        return error_response(404, "not_found", f"device: no stored data of {gateway}/{device}")
    return doc


async def get_device(request: web.Request) -> web.Response:
    doc = await _load(request)
    return doc if isinstance(doc, web.Response) else web.json_response(doc)


async def get_device_csv(request: web.Request) -> web.Response:
    doc = await _load(request)
    if isinstance(doc, web.Response):
        return doc
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    chart = doc["chart"]
    writer.writerow(["ts", "reading", "mean", "min", "max", "count", "seq"])
    for name, points in sorted(chart["series"].items()):
        seqs = chart["seq"][name] if chart["seq"] else [None] * len(points)
        for (t, mean, lo, hi, n), seq in zip(points, seqs, strict=True):
            writer.writerow([f"{t:.3f}", name, repr(mean), repr(lo), repr(hi), n, "" if seq is None else seq])
    filename = f"{doc['gateway']}-{doc['device']}-{int(doc['start'])}-{int(doc['end'])}.csv"
    return web.Response(
        text=out.getvalue(),
        content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
