"""The fleet and its data: gateway heartbeats in, fleet and dataset documents out.

    POST /v1/gateways/{gateway_id}/heartbeat   gateway token; body protocol.fleet.GatewayHeartbeat
    GET  /v1/fleet                             operator; cloud.fleet.fleet_document
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

from cloud.api.auth import gateway_refusal, operator_refusal
from cloud.api.context import CONFIG, FLEET, STORE
from cloud.api.errors import reject, reject_invalid
from cloud.fleet import FleetView, fleet_document
from protocol.errors import ProtocolError
from protocol.fleet import MAX_HEARTBEAT_BYTES, OFFLINE_AFTER_INTERVALS, parse_heartbeat

HEARTBEAT_PATH = "/v1/gateways/{gateway_id}/heartbeat"


def setup(app: web.Application) -> None:
    app[FLEET] = FleetView()
    app.router.add_post(HEARTBEAT_PATH, post_heartbeat)
    app.router.add_get("/v1/fleet", get_fleet)
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


async def get_fleet(request: web.Request) -> web.Response:
    refusal = operator_refusal(request)
    if refusal is not None:
        return refusal
    counts = await request.app[STORE].counts()
    uploads = {g.id: dataclasses.asdict(g) for g in counts.gateways}
    doc = fleet_document(
        sorted(request.app[CONFIG].gateway_tokens), request.app[FLEET].latest(), uploads, time.time()
    )
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
