"""The fleet and its data: gateway heartbeats in, fleet and dataset documents out.

    POST /v1/gateways/{gateway_id}/heartbeat   gateway token; body protocol.fleet.GatewayHeartbeat
    GET  /v1/fleet                             operator; cloud.fleet.fleet_page: the summary and one
                                               page (?sort=&desc=1&q=&state=&offset=&limit=)
    GET  /v1/gateways/{gateway_id}             operator; cloud.fleet.gateway_document + its devices
    GET  /v1/datasets                          operator; record counts per gateway and device

Heartbeat checks, in order, each refusal a JSON error and nothing kept: auth (401/403) -> body
(413 ``too_large``, 400 ``not_json`` | ``invalid``) -> body gateway equals the path (400
``gateway_mismatch``). Invariant: a heartbeat is kept only after all checks passed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from aiohttp import web

from cloud.api import params
from cloud.api.auth import gateway_refusal, operator_refusal
from cloud.api.context import CONFIG, FLEET, STORE
from cloud.api.errors import error_response, reject, reject_invalid
from cloud.fleet import SORT_KEYS, FleetView, fleet_page, fleet_rows, gateway_document
from cloud.store import alerts
from protocol.errors import ProtocolError
from protocol.fleet import MAX_HEARTBEAT_BYTES, OFFLINE_AFTER_INTERVALS, parse_heartbeat

HEARTBEAT_PATH = "/v1/gateways/{gateway_id}/heartbeat"


def setup(app: web.Application) -> None:
    app[FLEET] = FleetView()
    app.router.add_post(HEARTBEAT_PATH, post_heartbeat)
    app.router.add_get("/v1/fleet", get_fleet)
    app.router.add_get("/v1/gateways/{gateway_id}", get_gateway)
    app.router.add_get("/v1/datasets", get_datasets)


async def post_heartbeat(request: web.Request) -> web.Response:
    gateway = request.match_info["gateway_id"]
    refusal = gateway_refusal(request, gateway)
    if refusal is not None:
        return refusal
    if (request.content_length or 0) > MAX_HEARTBEAT_BYTES:
        return reject(request, 413, "too_large", f"heartbeat > {MAX_HEARTBEAT_BYTES} bytes")
    try:
        heartbeat = parse_heartbeat(await request.read())
    except ProtocolError as exc:
        return reject_invalid(request, exc)
    if heartbeat.gateway != gateway:
        return reject(
            request,
            400,
            "gateway_mismatch",
            f"gateway: body says {heartbeat.gateway!r}, path says {gateway!r}",
        )
    request.app[FLEET].record(heartbeat, time.time())
    return web.json_response({"ok": True, "offline_after_s": OFFLINE_AFTER_INTERVALS * heartbeat.interval_s})


async def _rows(request: web.Request) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], float]:
    store = request.app[STORE]
    counts = await store.counts()
    open_alerts = await store.read(alerts.open_counts)
    uploads = {g.id: dataclasses.asdict(g) for g in counts.gateways}
    now = time.time()
    configured = sorted(request.app[CONFIG].gateway_tokens)
    return fleet_rows(configured, request.app[FLEET].latest(), uploads, open_alerts, now), uploads, now


async def get_fleet(request: web.Request) -> web.Response:
    refusal = operator_refusal(request)
    if refusal is not None:
        return refusal
    try:
        sort = params.choice(request, "sort", "id", SORT_KEYS) or "id"
        state = params.choice(request, "state", None, ("online", "degraded", "offline"))
        offset = params.integer(request, "offset", 0, 0, 10**9)
        limit = params.integer(request, "limit", 100, 1, 1000)
    except params.BadParam as exc:
        return params.bad_param(exc)
    rows, _, now = await _rows(request)
    page = fleet_page(
        rows,
        now,
        sort=sort,
        desc=params.flag(request, "desc"),
        query=request.query.get("q", ""),
        state=state,
        offset=offset,
        limit=limit,
    )
    return web.json_response(page)


async def get_gateway(request: web.Request) -> web.Response:
    refusal = operator_refusal(request)
    if refusal is not None:
        return refusal
    gateway = request.match_info["gateway_id"]
    rows, uploads, _ = await _rows(request)
    row = next((r for r in rows if r["id"] == gateway), None)
    if row is None:
        return error_response(404, "not_found", f"gateway_id: no gateway {gateway!r}")
    fleet = request.app[FLEET]
    doc = gateway_document(row, fleet.latest().get(gateway), fleet.history(gateway), uploads.get(gateway, {}))
    counts = await request.app[STORE].counts()
    doc["devices"] = [
        {"device": d.device, "records": d.records, "last_ts": d.last_ts}
        for d in counts.devices
        if d.gateway == gateway
    ]
    return web.json_response(doc)


async def get_datasets(request: web.Request) -> web.Response:
    refusal = operator_refusal(request)
    if refusal is not None:
        return refusal
    counts = await request.app[STORE].counts()
    devices: dict[str, list[dict[str, Any]]] = {}
    for d in counts.devices:
        row = {"device": d.device, "records": d.records, "last_ts": d.last_ts}
        devices.setdefault(d.gateway, []).append(row)
    gateways = [
        {
            "id": g.id,
            "records": g.records,
            "batches": g.batches,
            "last_seen": g.last_seen,
            "devices": devices.get(g.id, []),
        }
        for g in counts.gateways
    ]
    return web.json_response(
        {
            "v": 1,
            "gateways": gateways,
            "totals": {"records": counts.records, "batches": counts.batches, "devices": len(counts.devices)},
            "trainable": {
                "digits": "sklearn's bundled digits (always)",
                "sensor_windows": "windows of uploaded telemetry",
                "camera_frames": "uploaded camera frames, labelled by the gateway model's verdicts",
            },
        }
    )
