"""GET /healthz (liveness, no auth), GET /metrics (Prometheus text of cloudd's own registry), and
the roles this replica holds (cloud/roles.py; no auth: a load balancer's health check asks):

    GET /v1/roles          {"jobs": true, "tasks": false, ...}: held or not, per role
    GET /v1/roles/{name}   200 {"role", "held": true} | 503 {"role", "held": false} | 404 unknown
"""

from __future__ import annotations

from aiohttp import web

from cloud.api.context import METRICS, ROLES, STORE
from cloud.api.errors import error_response
from cloud.metrics import METRICS_CONTENT_TYPE
from cloud.roles import Role


def setup(app: web.Application) -> None:
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/v1/roles", get_roles)
    app.router.add_get("/v1/roles/{name}", get_role)


async def get_healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "pending_store_calls": request.app[STORE].pending})


async def get_metrics(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    metrics.pending_writes.set(request.app[STORE].pending)
    response = web.Response(body=metrics.render())
    response.headers["Content-Type"] = METRICS_CONTENT_TYPE
    return response


async def get_roles(request: web.Request) -> web.Response:
    return web.json_response({name: role.held for name, role in sorted(request.app[ROLES].items())})


async def get_role(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    roles: dict[str, Role] = request.app[ROLES]
    role = roles.get(name)
    if role is None:
        return error_response(404, "not_found", f"name: no role {name!r} (known: {sorted(roles)})")
    return web.json_response({"role": name, "held": role.held}, status=200 if role.held else 503)
