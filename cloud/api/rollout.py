"""Route group of the model lifecycle: stages, aliases, assignment, the rollout controller.

    GET  /v1/models/{name}                       operator; {"name", "production", "canary",
                                                 "factory", "versions", "history", "events_total",
                                                 "rollout", "controller"} (every decision is in
                                                 "history"; "controller": its counters)
    GET  /v1/models/{name}/assignment?gateway=G  G's token (or the operator's); {"name", "version",
                                                 "stage", "sha256", "reason"}; 404 ``no_assignment``
    POST /v1/models/{name}/promote               operator; {"version", "canary": [gw...] | "share":
                                                 0.2 | "production": true, "force": false}
    POST /v1/models/{name}/rollback              operator; {"to": version | null, "reason": str}
    POST /v1/models/{name}/{version}/stage       operator; {"stage": "candidate" | "archived"}

Refusals of a transition are 409 with the reason of ``cloud.rollout.transitions.Refused`` (e.g.
``not_promotable`` naming the evaluation); an unknown version is 404; a bad body 400 naming the field.
This group is set up before ``cloud.api.registry`` so that ``/v1/models/{name}/assignment`` is
matched before ``/v1/models/{name}/{version}``. Its cleanup context registers the factory models
(``models/artifacts/``) when absent, production while nothing else is, then runs the controller.

Invariant: every change goes through ``ModelRegistry.change_lifecycle`` (one lock, one atomic file
write per change) and records one event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import models
from cloud.api.auth import gateway_refusal, operator_refusal
from cloud.api.context import CONFIG, FLEET, REGISTRY, ROLLOUT
from cloud.api.errors import error_response, reject
from cloud.api.roles import role_lifetime
from cloud.registry import ModelRegistry, RegistryEntry
from cloud.rollout.controller import RolloutController
from cloud.rollout.lifecycle import Lifecycle
from cloud.rollout.transitions import (
    Refused,
    assignment,
    canary_share_gateways,
    promote_canary,
    promote_production,
    rollback,
    set_stage,
)
from models.artifact import ArtifactError, load_artifact
from protocol.topics import check_id

log = logging.getLogger(__name__)
FACTORY_DIR = Path(models.__file__).resolve().parent / "artifacts"
OPERATOR = "operator"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromoteBody(_Body):
    version: str
    canary: list[str] | None = None
    share: float | None = Field(None, gt=0, le=1)
    production: bool = False
    force: bool = False
    reason: str = Field("", max_length=200)


class RollbackBody(_Body):
    to: str | None = None
    reason: str = Field("", max_length=200)


class StageBody(_Body):
    stage: Literal["candidate", "canary", "production", "archived"]


def setup(app: web.Application) -> None:
    app.cleanup_ctx.append(_lifetime)
    app.router.add_get("/v1/models/{name}/assignment", get_assignment)
    app.router.add_post("/v1/models/{name}/promote", post_promote)
    app.router.add_post("/v1/models/{name}/rollback", post_rollback)
    app.router.add_post("/v1/models/{name}/{version}/stage", post_stage)
    app.router.add_get("/v1/models/{name}", get_model)


def _factory_folders(factory_dir: Path) -> list[Path]:
    return sorted(p for p in factory_dir.iterdir() if p.is_dir()) if factory_dir.exists() else []


def _adopt_factory(name: str, version: str, now: float) -> Callable[[Lifecycle], None]:
    def adopt(state: Lifecycle) -> None:
        if state.production is None:
            entry = {"name": name, "version": version, "factory": True}
            promote_production(state, entry, force=False, by="cloudd", now=now, reason="factory model")

    return adopt


async def register_factory_models(registry: ModelRegistry, factory_dir: Path = FACTORY_DIR) -> None:
    """Store each factory model absent from the registry; make it production if its name has none."""
    for folder in await asyncio.to_thread(_factory_folders, factory_dir):
        try:
            artifact = await asyncio.to_thread(load_artifact, folder)
        except ArtifactError as exc:
            log.error("factory model %s unreadable: %s", folder, exc)
            continue
        status, _ = await registry.store(artifact, factory=True)
        await registry.change_lifecycle(
            artifact.name, _adopt_factory(artifact.name, artifact.version, time.time())
        )
        if status == 201:
            log.info("registered the factory model %s@%s", artifact.name, artifact.version)


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    registry = app[REGISTRY]
    await register_factory_models(registry)
    controller = RolloutController(registry, app[FLEET], app[CONFIG].rollout)
    app[ROLLOUT] = controller
    # One controller acts on a name's lifecycle: with replicas, the holder of the rollout role
    # (the load balancer sends it the heartbeats its health judgement reads: docs/cloud.md).
    async with role_lifetime(app, "rollout", controller.start, controller.stop):
        yield


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    try:
        return check_id("model", name)
    except ValueError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None


def _entry(registry: ModelRegistry, name: str, version: str) -> RegistryEntry:
    try:
        entry = registry.entry(name, check_id("version", version))
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"version: {exc}") from None
    if entry is None:
        raise web.HTTPNotFound(text=f"no model {name}@{version}")
    return entry


async def _body(request: web.Request, model: type[_Body]) -> Any:
    try:
        return model.model_validate_json(await request.read())
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise web.HTTPBadRequest(text=f"{field}: {first['msg']}") from None


async def _change(request: web.Request, name: str, change: Callable[[Lifecycle], Any]) -> web.Response:
    try:
        result = await request.app[REGISTRY].change_lifecycle(name, change)
    except Refused as exc:
        return reject(request, 409, exc.reason, exc.detail)
    state = request.app[REGISTRY].lifecycle(name)
    return web.json_response({"name": name, "result": result, "event": state.events[-1]})


async def get_model(request: web.Request) -> web.Response:
    if (refusal := operator_refusal(request)) is not None:
        return refusal
    name, registry = _name(request), request.app[REGISTRY]
    versions = registry.entries(name)
    if not versions:
        raise web.HTTPNotFound(text=f"no model {name}")
    state = registry.lifecycle(name)
    controller = request.app.get(ROLLOUT)
    return web.json_response(
        {
            "name": name,
            "production": state.production,
            "canary": state.to_json()["canary"],
            "factory": registry.factory_version(name),
            "versions": versions,
            "history": state.events,
            "events_total": state.events_total,
            "rollout": controller.judgements.get(name) if controller else None,
            "controller": dict(controller.counters) if controller else None,
        }
    )


async def get_assignment(request: web.Request) -> web.Response:
    name, registry = _name(request), request.app[REGISTRY]
    gateway = request.query.get("gateway")
    if not gateway:
        return error_response(400, "invalid", "gateway: ?gateway=<id> is required")
    refusal = gateway_refusal(request, gateway)
    if refusal is not None and operator_refusal(request) is not None:
        return refusal
    assigned = assignment(registry.lifecycle(name), gateway, registry.factory_version(name))
    if assigned is None:
        return reject(request, 404, "no_assignment", f"{name}: no canary, production or factory version")
    version, stage, reason = assigned
    entry = _entry(registry, name, version)
    return web.json_response(
        {"name": name, "version": version, "stage": stage, "sha256": entry["sha256"], "reason": reason}
    )


async def post_promote(request: web.Request) -> web.Response:
    if (refusal := operator_refusal(request)) is not None:
        return refusal
    name, registry = _name(request), request.app[REGISTRY]
    body: PromoteBody = await _body(request, PromoteBody)
    if sum([body.canary is not None, body.share is not None, body.production]) != 1:
        return error_response(400, "invalid", "promote: give exactly one of canary, share, production")
    entry = _entry(registry, name, body.version)
    now = time.time()
    if body.production:
        reason = body.reason or "promoted by the operator"
        return await _change(
            request,
            name,
            lambda s: promote_production(
                s, dict(entry), force=body.force, by=OPERATOR, now=now, reason=reason
            ),
        )
    fleet = sorted(request.app[CONFIG].gateway_tokens)
    if body.canary is not None:
        unknown = sorted(set(body.canary) - set(fleet))
        if unknown:
            return error_response(
                400, "invalid", f"canary: unknown gateways {unknown} (cloudd knows {fleet})"
            )
        gateways = body.canary
    else:
        try:
            gateways = canary_share_gateways(fleet, body.share or 0.0, name, body.version)
        except Refused as exc:
            return error_response(400, "invalid", exc.detail)
    return await _change(
        request,
        name,
        lambda s: promote_canary(
            s, dict(entry), gateways, body.share, force=body.force, by=OPERATOR, now=now
        ),
    )


async def post_rollback(request: web.Request) -> web.Response:
    if (refusal := operator_refusal(request)) is not None:
        return refusal
    name, registry = _name(request), request.app[REGISTRY]
    body: RollbackBody = await _body(request, RollbackBody)
    target = dict(_entry(registry, name, body.to)) if body.to is not None else None
    factory = registry.factory_version(name)
    reason = body.reason or "rolled back by the operator"
    return await _change(
        request, name, lambda s: rollback(s, target, factory, by=OPERATOR, now=time.time(), reason=reason)
    )


async def post_stage(request: web.Request) -> web.Response:
    if (refusal := operator_refusal(request)) is not None:
        return refusal
    name, registry = _name(request), request.app[REGISTRY]
    entry = _entry(registry, name, request.match_info["version"])
    body: StageBody = await _body(request, StageBody)
    return await _change(
        request, name, lambda s: set_stage(s, dict(entry), body.stage, by=OPERATOR, now=time.time())
    )
