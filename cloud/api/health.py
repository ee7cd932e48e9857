"""GET /healthz (liveness, no auth) and GET /metrics (Prometheus text of cloudd's own registry)."""

from __future__ import annotations

from aiohttp import web

from cloud.api.context import METRICS, STORE
from cloud.metrics import METRICS_CONTENT_TYPE


def setup(app: web.Application) -> None:
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/metrics", get_metrics)


async def get_healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "pending_store_calls": request.app[STORE].pending})


async def get_metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    metrics.pending_writes.set(request.app[STORE].pending)
    response = web.Response(body=metrics.render())
    response.headers["Content-Type"] = METRICS_CONTENT_TYPE
    return response
