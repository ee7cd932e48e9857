"""Alerts as they arrive (the stored event records of severity "alert"), and acknowledging them.

    GET  /v1/alerts       operator; newest first; ?gateway=ID, ?open=1 (unacknowledged only),
                          ?limit= (default 100), ?before=ID (the next page)
    POST /v1/alerts/ack   operator; body {"ids": [int, ...]}; answers {"acknowledged": found}

Invariant: an acknowledgement is written through the store's writer in one transaction
(cloud/store/alerts.py), so it is durable once answered and survives a restart of cloudd.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from cloud.api import params
from cloud.api.auth import operator_refusal
from cloud.api.context import STORE
from cloud.api.errors import error_response
from cloud.store import alerts
from cloud.store.database import Conn

MAX_ACK_IDS = 1000


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/alerts", get_alerts)
    app.router.add_post("/v1/alerts/ack", post_ack)


async def get_alerts(request: web.Request) -> web.Response:
    refusal = operator_refusal(request)
    if refusal is not None:
        return refusal
    try:
        limit = params.integer(request, "limit", 100, 1, 1000)
        before = params.integer(request, "before", 0, 1, 2**62) if "before" in request.query else None
    except params.BadParam as exc:
        return params.bad_param(exc)
    gateway, open_only = request.query.get("gateway"), params.flag(request, "open")

    def query(conn: Conn) -> dict[str, Any]:
        return {
            "v": 1,
            "alerts": alerts.listing(conn, gateway, open_only, limit, before),
            "open": alerts.open_counts(conn),
        }

    return web.json_response(await request.app[STORE].read(query))


async def post_ack(request: web.Request) -> web.Response:
    refusal = operator_refusal(request)
    if refusal is not None:
        return refusal
    try:
        body = json.loads(await request.read())
    except ValueError:
        return error_response(400, "not_json", "body: not JSON")
    ids = body.get("ids") if isinstance(body, dict) else None
    if (
        not isinstance(ids, list)
        or not ids
        or len(ids) > MAX_ACK_IDS
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        return error_response(
            400, "invalid", f"ids: must be a list of 1 to {MAX_ACK_IDS} alert ids (integers)"
        )
    now = time.time()
    found = await request.app[STORE].write(lambda conn: alerts.acknowledge(conn, ids, now, "operator"))
    return web.json_response({"acknowledged": found, "acked_ts": now})
