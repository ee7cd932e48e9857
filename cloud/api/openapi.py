"""GET /v1/openapi.json: the OpenAPI 3.1 document of cloudd's HTTP API (open, no token).

Request schemas come from the pydantic models that validate those requests (``JobSpec``,
``GatewayHeartbeat``, ``ModelMetadata``), so the document cannot drift from what is checked.
Invariant: every route cloudd serves under /v1 has an entry (a route not written out here gets
one from its handler's docstring, ``add_undocumented``; tests/jobs checks the whole set).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel

from cloud.api.rollout import PromoteBody, RollbackBody, StageBody
from cloud.jobs.spec import JobSpec
from protocol.events import ModelMetadata
from protocol.fleet import GatewayHeartbeat

OPENAPI_PATH = "/v1/openapi.json"
_ERROR = {"$ref": "#/components/schemas/Error"}
_OBJECT = {"type": "object"}


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        found.update(schema.pop("$defs", {}))
        found[model.__name__] = schema
    return found


def _op(
    summary: str,
    auth: str | None,
    ok: int = 200,
    body: str | None = None,
    errors: tuple[int, ...] = (),
    ok_type: str = "application/json",
    params: tuple[str, ...] = (),
) -> dict[str, Any]:
    responses: dict[str, Any] = {str(ok): {"description": "ok", "content": {ok_type: {"schema": _OBJECT}}}}
    for code in (*((401, 403) if auth else ()), *errors):
        responses[str(code)] = {"description": "refused", "content": {"application/json": {"schema": _ERROR}}}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if auth:
        op["security"] = [{auth: []}]
    if body:
        schema = {"$ref": f"#/components/schemas/{body}"}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    if params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
        ]
    return op


def document() -> dict[str, Any]:
    gw, job = ("gateway_id",), ("job_id",)
    paths = {
        "/healthz": {"get": _op("liveness", None)},
        "/metrics": {"get": _op("Prometheus text", None, ok_type="text/plain")},
        "/v1/status": {"get": _op("uploads per gateway and device", "operator")},
        "/v1/gateways/{gateway_id}/batches": {
            "post": _op(
                "upload a batch of log records (protocol.batch)", "gateway", errors=(400, 413, 503), params=gw
            )
        },
        "/v1/gateways/{gateway_id}/heartbeat": {
            "post": _op(
                "a gateway's status", "gateway", body="GatewayHeartbeat", errors=(400, 413), params=gw
            )
        },
        "/v1/gateways/{gateway_id}/blobs/{blob_id}": {
            "put": _op(
                "append a chunk of a resumable blob (?offset=N[&final=1])",
                "gateway",
                errors=(400, 409, 413),
                params=(*gw, "blob_id"),
            ),
            "head": _op("stored offset of a blob (Upload-Offset header)", "gateway", params=(*gw, "blob_id")),
        },
        "/v1/gateways/{gateway_id}/blobs/{blob_id}/status": {
            "get": _op("a blob's stored offset as JSON", "gateway", params=(*gw, "blob_id"))
        },
        "/v1/probe": {"post": _op("goodput probe: the body is read and discarded", None)},
        "/v1/fleet": {
            "get": _op(
                "the fleet's summary and one page of gateways (?sort=&desc=1&q=&state=&offset=&limit=)",
                "operator",
                errors=(400,),
            )
        },
        "/v1/gateways/{gateway_id}": {
            "get": _op(
                "one gateway: services, placement, link and backlog history, devices",
                "operator",
                errors=(404,),
                params=gw,
            )
        },
        "/v1/devices/{gateway_id}/{device}": {
            "get": _op(
                "one device: last message, rate, gaps, faults, readings (?start=&end=&points=)",
                "operator",
                errors=(400, 404),
                params=(*gw, "device"),
            )
        },
        "/v1/devices/{gateway_id}/{device}/series.csv": {
            "get": _op(
                "the device window's readings as CSV",
                "operator",
                ok_type="text/csv",
                errors=(400, 404),
                params=(*gw, "device"),
            )
        },
        "/v1/alerts": {
            "get": _op("alerts, newest first (?gateway=&open=1&limit=&before=)", "operator", errors=(400,))
        },
        "/v1/alerts/ack": {"post": _op('acknowledge alerts: {"ids": [...]}', "operator", errors=(400,))},
        "/v1/datasets": {"get": _op("record counts per gateway and device", "operator")},
        "/v1/datasets/files": {"get": _op("datasets uploaded for jobs", "operator")},
        "/v1/datasets/files/{name}": {
            "put": _op(
                "upload a dataset file (.npz or torch tensor file; body = the bytes)",
                "operator",
                ok=201,
                errors=(400, 409, 411, 413, 422),
                params=("name",),
            ),
            "get": _op("an uploaded dataset's meta", "operator", errors=(404,), params=("name",)),
        },
        "/v1/jobs": {
            "get": _op("all jobs, oldest first", "operator"),
            "post": _op("submit a training job", "operator", ok=201, body="JobSpec", errors=(400, 413, 429)),
        },
        "/v1/jobs/{job_id}": {"get": _op("one job", "operator", errors=(404,), params=job)},
        "/v1/jobs/{job_id}/cancel": {"post": _op("cancel a job", "operator", errors=(404, 409), params=job)},
        "/v1/jobs/{job_id}/events": {
            "get": _op(
                "progress as server-sent events (?since=N)",
                "operator",
                ok_type="text/event-stream",
                errors=(400, 404),
                params=job,
            )
        },
        "/v1/models": {
            "get": _op("model versions with stage and evaluation (?name=N, ?track=T)", None, errors=(400,))
        },
        "/v1/models/{name}/assignment": {
            "get": _op(
                "the version a gateway should run (?gateway=G)",
                "gateway",
                errors=(400, 404),
                params=("name",),
            )
        },
        "/v1/models/{name}/promote": {
            "post": _op(
                "candidate -> canary (gateways or share) or -> production",
                "operator",
                body="PromoteBody",
                errors=(400, 404, 409),
                params=("name",),
            )
        },
        "/v1/models/{name}/rollback": {
            "post": _op(
                "end the canary, or restore an earlier production",
                "operator",
                body="RollbackBody",
                errors=(400, 404, 409),
                params=("name",),
            )
        },
        "/v1/models/{name}/{version}/stage": {
            "post": _op(
                "set a version's stage (candidate, archived)",
                "operator",
                body="StageBody",
                errors=(400, 404, 409),
                params=("name", "version"),
            )
        },
        "/v1/models/{name}": {
            "get": _op(
                "a name's versions, aliases, rollout judgement and history",
                "operator",
                errors=(400, 404),
                params=("name",),
            ),
            "post": _op(
                "upload a version: multipart parts metadata (ModelMetadata) + onnx",
                "operator",
                ok=201,
                errors=(400, 409, 413),
                params=("name",),
            ),
        },
        "/v1/models/{name}/{version}": {
            "get": _op("a version's metadata", None, errors=(404,), params=("name", "version"))
        },
        "/v1/models/{name}/{version}/onnx": {
            "get": _op(
                "a version's ONNX bytes",
                None,
                errors=(404,),
                ok_type="application/octet-stream",
                params=("name", "version"),
            )
        },
        "/v1/openapi.json": {"get": _op("this document", None)},
    }
    schemas = _schemas(JobSpec, GatewayHeartbeat, ModelMetadata, PromoteBody, RollbackBody, StageBody)
    schemas["Error"] = {
        "type": "object",
        "required": ["error", "detail"],
        "properties": {
            "error": {"type": "string", "description": "stable token"},
            "detail": {"type": "string", "description": "what was wrong"},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "cloudd",
            "version": "1",
            "description": "edgefed cloud daemon; see docs/http-api.md",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "operator": {"type": "http", "scheme": "bearer", "description": "cloudd --operator-token"},
                "gateway": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the gateway's own upload token",
                },
            },
        },
    }


def add_undocumented(doc: dict[str, Any], routes: list[tuple[str, str, Any]]) -> dict[str, Any]:
    """Give every served (method, path) that ``doc`` lacks an entry from its handler's docstring, so a
    route group added later is listed (briefly) before someone documents it by hand."""
    paths = doc["paths"]
    for method, path, handler in routes:
        ops = paths.setdefault(path, {})
        if method in ops or (method == "head" and "get" in ops):
            continue
        summary = ((handler.__doc__ or "").strip().splitlines() or [f"{method.upper()} {path}"])[0]
        params = tuple(part[1:-1] for part in path.split("/") if part.startswith("{"))
        ops[method] = _op(summary, None, params=params)
    return doc


def setup(app: web.Application) -> None:
    cache: dict[str, Any] = {}

    async def get_openapi(request: web.Request) -> web.Response:
        if "doc" not in cache:  # the router is frozen by the first request: every route is there
            routes = [
                (r.method.lower(), r.resource.canonical, r.handler)
                for r in request.app.router.routes()
                if r.resource is not None and r.resource.canonical.startswith("/v1/")
            ]
            cache["doc"] = add_undocumented(document(), routes)
        return web.json_response(cache["doc"])

    app.router.add_get(OPENAPI_PATH, get_openapi)
