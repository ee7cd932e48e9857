"""Route group of federated training (``cloud.server.ROUTE_GROUPS``).

    PUT /v1/federated/job                        FederatedJob JSON; operator. 201 started (a new
                                                 global model, version 0), 200 already running
    DELETE /v1/federated/job                     operator; stops the job (its state is kept as
                                                 federated/stopped.json); 404 none running
    GET /v1/federated/job                        the running job (404 none); operator
    GET /v1/federated/status                     rounds, participants, staleness, bytes; operator
    GET /v1/federated/gateways/{gw}/model[?have=V]
                                                 GlobalModel JSON with that gateway's token;
                                                 304 when V is already the latest version

The coordinator (``cloud/federated/coordinator.py``) imports torch; this module does not, and
starts the coordinator only when a job exists (on disk at startup, or PUT), so a cloudd without
federated training never imports torch. Invariant: the coordinator is started and stopped by the
app's cleanup context, after the store opened and before it closes. With replicas on PostgreSQL it
runs only on the replica holding the ``federated`` role (cloud/roles.py); the others answer every
route here 503 ``standby``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from cloud.api.auth import gateway_refusal, operator_refusal
from cloud.api.context import CONFIG, REGISTRY
from cloud.api.errors import reject, reject_invalid
from cloud.api.roles import role_lifetime, standby_refusal

if TYPE_CHECKING:  # the coordinator imports torch: at run time only once federated training is on
    from cloud.federated.coordinator import FederatedCoordinator

JOB_PATH = "/v1/federated/job"
STATUS_PATH = "/v1/federated/status"
MODEL_PATH = "/v1/federated/gateways/{gateway_id}/model"
MAX_JOB_BYTES = 64 * 1024
STATE_FILE = "federated/state.json"


@dataclass
class FederatedSlot:
    """The route group's state: the coordinator while a job exists, and the lock that starts it once."""

    coordinator: FederatedCoordinator | None = None
    starting: asyncio.Lock = field(default_factory=asyncio.Lock)


FEDERATED = web.AppKey("federated", FederatedSlot)


def setup(app: web.Application) -> None:
    app[FEDERATED] = FederatedSlot()
    app.cleanup_ctx.append(_lifetime)
    app.router.add_put(JOB_PATH, put_job)
    app.router.add_delete(JOB_PATH, delete_job)
    app.router.add_get(JOB_PATH, get_job)
    app.router.add_get(STATUS_PATH, get_status)
    app.router.add_get(MODEL_PATH, get_model)


async def _start_coordinator(app: web.Application) -> FederatedCoordinator:
    from cloud.federated.coordinator import FederatedCoordinator  # torch: only once federated training is on
    from cloud.registry import ModelRegistry

    data_dir = app[CONFIG].data_dir
    coordinator = FederatedCoordinator(data_dir)
    # The registry's routes (cloud/api/registry.py) own one instance; share it (its lock orders seq).
    coordinator.registry = app.get(REGISTRY) or ModelRegistry(data_dir / "models")
    coordinator.gate = app[CONFIG].gate
    await coordinator.start()
    app[FEDERATED].coordinator = coordinator
    return coordinator


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    async def resume() -> None:
        if (app[CONFIG].data_dir / STATE_FILE).exists():
            await _start_coordinator(app)

    async def stop() -> None:
        slot = app[FEDERATED]
        coordinator, slot.coordinator = slot.coordinator, None
        if coordinator is not None:
            await coordinator.stop()

    async with role_lifetime(app, "federated", resume, stop):
        yield


def _refusal(request: web.Request) -> web.Response | None:
    return operator_refusal(request) or standby_refusal(request, "federated")


def _no_job(request: web.Request) -> web.Response:
    return reject(request, 404, "no_job", f"no federated job is running (PUT {JOB_PATH})")


async def put_job(request: web.Request) -> web.Response:
    from protocol.errors import ProtocolError
    from protocol.federated import parse_job

    if (refusal := _refusal(request)) is not None:
        return refusal
    body = await request.read()
    if len(body) > MAX_JOB_BYTES:
        return reject(request, 413, "too_large", f"job of {len(body)} bytes > {MAX_JOB_BYTES}")
    try:
        job = parse_job(body)
    except ProtocolError as exc:
        return reject_invalid(request, exc)
    slot = request.app[FEDERATED]
    async with slot.starting:  # two first PUTs must not start two coordinators
        coordinator = slot.coordinator or await _start_coordinator(request.app)
    try:
        changed = await coordinator.set_job(job)
    except ValueError as exc:  # the architecture does not build here (a factory that does not import)
        return reject(request, 400, "invalid", str(exc))
    return web.json_response(
        {"started": changed, "version": coordinator.status.get("version")}, status=201 if changed else 200
    )


async def delete_job(request: web.Request) -> web.Response:
    if (refusal := _refusal(request)) is not None:
        return refusal
    slot = request.app[FEDERATED]
    async with slot.starting:
        coordinator, slot.coordinator = slot.coordinator, None
        if coordinator is None:
            return _no_job(request)
        status = coordinator.status
        await coordinator.stop()
        state = request.app[CONFIG].data_dir / STATE_FILE
        if state.exists():  # a cloudd restart must not resume a stopped job
            state.replace(state.with_name("stopped.json"))
    return web.json_response(
        {"stopped": True, "model": status.get("model"), "version": status.get("version")}
    )


async def get_job(request: web.Request) -> web.Response:
    if (refusal := _refusal(request)) is not None:
        return refusal
    coordinator = request.app[FEDERATED].coordinator
    if coordinator is None or coordinator.status.get("job") is None:
        return _no_job(request)
    return web.json_response(coordinator.status["job"])


async def get_status(request: web.Request) -> web.Response:
    if (refusal := _refusal(request)) is not None:
        return refusal
    coordinator = request.app[FEDERATED].coordinator
    if coordinator is None:
        return web.json_response({"v": 1, "job": None})
    return web.Response(text=json.dumps(coordinator.status), content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    gateway = request.match_info["gateway_id"]
    if (refusal := gateway_refusal(request, gateway) or standby_refusal(request, "federated")) is not None:
        return refusal
    coordinator = request.app[FEDERATED].coordinator
    document = coordinator.model_document if coordinator is not None else None
    if document is None:
        return _no_job(request)
    version, body = document
    if request.query.get("have") == str(version):
        return web.Response(status=304, headers={"X-Model-Version": str(version)})
    return web.Response(body=body, content_type="application/json", headers={"X-Model-Version": str(version)})
