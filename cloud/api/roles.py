"""The singleton roles this replica holds (cloud/roles.py), and the refusal of a standby.

    GET /v1/roles          no auth; {"federated": bool, "jobs": bool, "rollout": bool, "tasks": bool}
    GET /v1/roles/{name}   no auth; 200 {"role", "held": true} | 503 {"role", "held": false} |
                           404 unknown: what a load balancer's health check of that role asks

Invariant: a route that needs a role's work (``standby_refusal``) answers 503 ``standby`` on a
replica that does not hold it, never with this replica's empty or stale view.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from cloud.api.context import ROLES, STORE
from cloud.api.errors import error_response, reject
from cloud.roles import Role


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/roles", get_roles)
    app.router.add_get("/v1/roles/{name}", get_role)


@asynccontextmanager
async def role_lifetime(
    app: web.Application, name: str, start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]
) -> AsyncIterator[Role]:
    """Within it, this replica runs ``start``..``stop`` while it holds role ``name`` (a cleanup
    context's body: after the store opened, before it closes)."""
    role = app[ROLES][name] = Role(name, app[STORE].store.db, start, stop)
    await role.open()
    try:
        yield role
    finally:
        await role.close()


def standby_refusal(request: web.Request, name: str) -> web.Response | None:
    """503 ``standby`` unless this replica holds role ``name``."""
    role = request.app[ROLES].get(name)
    if role is not None and role.held:
        return None
    return reject(
        request,
        503,
        "standby",
        f"the {name} role runs on another cloudd replica; this one is a standby for it "
        "(GET /v1/roles; docs/cloud.md, Replicas)",
        headers={"Retry-After": "5"},
    )


async def get_roles(request: web.Request) -> web.Response:
    return web.json_response({name: role.held for name, role in sorted(request.app[ROLES].items())})


async def get_role(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    roles: dict[str, Role] = request.app[ROLES]
    role = roles.get(name)
    if role is None:
        return error_response(404, "not_found", f"name: no role {name!r} (known: {sorted(roles)})")
    return web.json_response({"role": name, "held": role.held}, status=200 if role.held else 503)
