"""The model registry's HTTP routes (the store is ``cloud/registry.py``).

    POST /v1/models/{name}                    multipart/form-data: part "metadata" (ModelMetadata
                                              JSON) and part "onnx" (the bytes); operator token
                                              (401/403 otherwise). 201 stored, 200 same
                                              version+hash already there, 409 same version with
                                              other bytes, 400 invalid/hash
    GET  /v1/models[?name=N][&track=T]        {"models": [entry, ...]} by name, then upload order;
                                              track "central" (default), "federated" or "all";
                                              open
    GET  /v1/models/{name}/{version}          the version's metadata.json
    GET  /v1/models/{name}/{version}/onnx     the bytes; headers X-Model-Sha256 and ETag

An entry is ``{"name", "version", "sha256", "size", "seq", "uploaded_ts", "lineage", "track",
"evaluation", "factory", "stage"}`` (``cloud/registry.py``); ``seq`` counts a name's uploads from 1.
A version uploaded here is a ``candidate`` without an evaluation: it runs on no gateway until an
operator promotes it with ``force`` (stages and assignment: ``cloud/api/rollout.py``). A version's
lineage (which dataset, gateways and LSN ranges, or which job) is the ``notes["lineage"]`` of its
metadata, written by the job that produced it and copied into the entry when the version is
stored; versions uploaded by hand have ``lineage: null``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aiohttp import BodyPartReader, web

from cloud.api.auth import operator_refusal
from cloud.api.context import CONFIG, REGISTRY
from cloud.registry import TRACKS, ModelRegistry, RegistryEntry
from models.artifact import ArtifactError, artifact_from_bytes
from protocol.topics import check_id


def setup(app: web.Application) -> None:
    app[REGISTRY] = setup_model_routes(app, app[CONFIG].data_dir, operator_refusal)


MAX_MODEL_BYTES = 64 * 1024 * 1024
MAX_METADATA_BYTES = 256 * 1024


async def _read_upload(request: web.Request) -> tuple[bytes, bytes]:
    if not request.content_type.startswith("multipart/"):
        raise web.HTTPBadRequest(text="expected multipart/form-data with parts 'metadata' and 'onnx'")
    parts: dict[str, bytes] = {}
    reader = await request.multipart()
    async for part in reader:
        if not isinstance(part, BodyPartReader):  # a nested multipart
            raise web.HTTPBadRequest(text="expected parts 'metadata' and 'onnx', not a nested multipart")
        if part.name not in ("metadata", "onnx"):
            raise web.HTTPBadRequest(text=f"unexpected part {part.name!r}")
        limit = MAX_METADATA_BYTES if part.name == "metadata" else MAX_MODEL_BYTES
        chunks: list[bytes] = []
        size = 0
        while chunk := await part.read_chunk(1 << 16):
            size += len(chunk)
            if size > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
            chunks.append(chunk)
        parts[part.name] = b"".join(chunks)
    if set(parts) != {"metadata", "onnx"}:
        raise web.HTTPBadRequest(text="both parts 'metadata' and 'onnx' are required")
    return parts["metadata"], parts["onnx"]


def setup_model_routes(
    app: web.Application, data_dir: Path, refuse_upload: Callable[[web.Request], web.Response | None] | None
) -> ModelRegistry:
    """Add the registry routes to ``app``. ``refuse_upload(request)`` returns the refusal to answer an
    upload with (e.g. no operator token), or None to accept it. Returns the registry for in-process use."""
    registry = ModelRegistry(data_dir / "models")

    async def upload(request: web.Request) -> web.Response:
        refusal = refuse_upload(request) if refuse_upload is not None else None
        if refusal is not None:
            return refusal
        name = request.match_info["name"]
        metadata_json, onnx_bytes = await _read_upload(request)
        try:
            artifact = artifact_from_bytes(metadata_json, onnx_bytes)
        except ArtifactError as exc:
            return web.json_response({"error": exc.reason, "detail": exc.detail}, status=400)
        if artifact.name != name:
            detail = f"metadata name {artifact.name!r} != path {name!r}"
            return web.json_response({"error": "name_mismatch", "detail": detail}, status=400)
        status, entry = await registry.store(artifact)
        if status == 409:
            return web.json_response(
                {"error": "version_exists", "detail": "stored with another sha256", "entry": entry},
                status=409,
            )
        return web.json_response(entry, status=status)

    async def list_models(request: web.Request) -> web.Response:
        name = request.query.get("name")
        if name is not None:
            check_or_400(name)
        track = request.query.get("track", "central")
        if track not in (*TRACKS, "all"):
            raise web.HTTPBadRequest(text=f"track: {track!r} is not one of {', '.join(TRACKS)}, all")
        return web.json_response({"models": registry.entries(name, None if track == "all" else track)})

    def found(request: web.Request) -> tuple[str, str, RegistryEntry]:
        name, version = request.match_info["name"], request.match_info["version"]
        check_or_400(name)
        check_or_400(version)
        entry = registry.entry(name, version)
        if entry is None:
            raise web.HTTPNotFound(text=f"no model {name}@{version}")
        return name, version, entry

    async def get_metadata(request: web.Request) -> web.Response:
        name, version, entry = found(request)
        body = (registry.folder(name, version) / "metadata.json").read_bytes()
        return web.Response(
            body=body, content_type="application/json", headers={"X-Model-Seq": str(entry["seq"])}
        )

    async def get_onnx(request: web.Request) -> web.StreamResponse:
        name, version, entry = found(request)
        return web.FileResponse(
            registry.folder(name, version) / "model.onnx",
            headers={
                "X-Model-Sha256": entry["sha256"],
                "ETag": f'"{entry["sha256"]}"',
                "Content-Type": "application/octet-stream",
            },
        )

    app.router.add_post("/v1/models/{name}", upload)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{name}/{version}", get_metadata)
    app.router.add_get("/v1/models/{name}/{version}/onnx", get_onnx)
    return registry


def check_or_400(value: str) -> None:
    try:
        check_id("model", value)
    except ValueError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
