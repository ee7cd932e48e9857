"""The model registry: versioned ONNX artifacts under ``DATA_DIR/models/<name>/<version>/``, and the
HTTP routes that upload, list and download them.

    POST /v1/models/{name}                    multipart/form-data: part "metadata" (ModelMetadata
                                              JSON) and part "onnx" (the bytes); operator only.
                                              201 stored, 200 same version+hash already there,
                                              409 same version with other bytes, 400 invalid/hash
    GET  /v1/models[?name=N]                  {"models": [entry, ...]} by name, then upload order
    GET  /v1/models/{name}/{version}          the version's metadata.json
    GET  /v1/models/{name}/{version}/onnx     the bytes; headers X-Model-Sha256 and ETag

An entry is ``{"name", "version", "sha256", "size", "seq", "uploaded_ts"}``; ``seq`` counts a
name's uploads from 1, and "latest" means the highest seq.

Invariant: a version folder is visible (has ``registry.json``) only after its ONNX file and
metadata are durably written and the bytes hash to the metadata's sha256; a stored version is
never overwritten.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from models.artifact import ArtifactError, ModelArtifact, artifact_from_bytes, load_artifact, save_artifact
from protocol.events import ModelMetadata
from protocol.topics import check_id

MAX_MODEL_BYTES = 64 * 1024 * 1024
MAX_METADATA_BYTES = 256 * 1024
ENTRY_FILE = "registry.json"


class ModelRegistry:
    """Files under ``root``; one instance per process (the lock orders seq assignment).

    Listeners (``add_listener``) are told of every new version, whoever stores it: the upload
    route, a training job, the federated service.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[ModelMetadata], None]] = []

    def add_listener(self, listener: Callable[[ModelMetadata], None]) -> None:
        """Call ``listener(metadata)`` (on the loop; it must not block) after each new version."""
        self._listeners.append(listener)

    def _folder(self, name: str, version: str) -> Path:
        return self.root / check_id("model", name) / check_id("version", version)

    def entries(self, name: str | None = None) -> list[dict[str, Any]]:
        names = [name] if name else sorted(p.name for p in self.root.iterdir() if p.is_dir()) \
            if self.root.exists() else []
        found = []
        for each in names:
            folder = self.root / each
            if not folder.is_dir():
                continue
            for version_dir in folder.iterdir():
                entry_file = version_dir / ENTRY_FILE
                if entry_file.exists():
                    found.append(json.loads(entry_file.read_text()))
        return sorted(found, key=lambda e: (e["name"], e["seq"]))

    def entry(self, name: str, version: str) -> dict[str, Any] | None:
        entry_file = self._folder(name, version) / ENTRY_FILE
        return json.loads(entry_file.read_text()) if entry_file.exists() else None

    def load(self, name: str, version: str) -> ModelArtifact:
        return load_artifact(self._folder(name, version))

    async def store(self, artifact: ModelArtifact) -> tuple[int, dict[str, Any]]:
        """(HTTP status, entry): 201 stored, 200 already stored with the same hash, 409 conflict."""
        metadata = artifact.metadata
        async with self._lock:
            existing = self.entry(metadata.name, metadata.version)
            if existing is not None:
                return (200 if existing["sha256"] == metadata.sha256 else 409), existing
            seq = 1 + max((e["seq"] for e in self.entries(metadata.name)), default=0)
            entry = {"name": metadata.name, "version": metadata.version, "sha256": metadata.sha256,
                     "size": metadata.size, "seq": seq, "uploaded_ts": time.time(),
                     "lineage": metadata.notes.get("lineage")}  # what produced it; None if uploaded by hand
            await asyncio.to_thread(self._write, artifact, entry)
        for listener in self._listeners:
            listener(metadata)
        return 201, entry

    def _write(self, artifact: ModelArtifact, entry: dict[str, Any]) -> None:
        folder = self._folder(artifact.name, artifact.version)
        if folder.exists():  # leftovers of a crash before registry.json: not a stored version
            shutil.rmtree(folder)
        save_artifact(folder, artifact)
        tmp = folder / f".{ENTRY_FILE}.tmp"
        tmp.write_text(json.dumps(entry))
        tmp.replace(folder / ENTRY_FILE)


async def _read_upload(request: web.Request) -> tuple[bytes, bytes]:
    if not request.content_type.startswith("multipart/"):
        raise web.HTTPBadRequest(text="expected multipart/form-data with parts 'metadata' and 'onnx'")
    parts: dict[str, bytes] = {}
    reader = await request.multipart()
    async for part in reader:
        if part.name not in ("metadata", "onnx"):
            raise web.HTTPBadRequest(text=f"unexpected part {part.name!r}")
        limit = MAX_METADATA_BYTES if part.name == "metadata" else MAX_MODEL_BYTES
        chunks, size = [], 0
        while chunk := await part.read_chunk(1 << 16):
            size += len(chunk)
            if size > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
            chunks.append(chunk)
        parts[part.name] = b"".join(chunks)
    if set(parts) != {"metadata", "onnx"}:
        raise web.HTTPBadRequest(text="both parts 'metadata' and 'onnx' are required")
    return parts["metadata"], parts["onnx"]


def setup_model_routes(app: web.Application, data_dir: Path,
                       refuse_upload: Callable[[web.Request], web.Response | None] | None) -> ModelRegistry:
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
            return web.json_response({"error": "version_exists", "detail": "stored with another sha256",
                                      "entry": entry}, status=409)
        return web.json_response(entry, status=status)

    async def list_models(request: web.Request) -> web.Response:
        name = request.query.get("name")
        if name is not None:
            check_or_400(name)
        return web.json_response({"models": registry.entries(name)})

    def found(request: web.Request) -> tuple[str, str, dict[str, Any]]:
        name, version = request.match_info["name"], request.match_info["version"]
        check_or_400(name)
        check_or_400(version)
        entry = registry.entry(name, version)
        if entry is None:
            raise web.HTTPNotFound(text=f"no model {name}@{version}")
        return name, version, entry

    async def get_metadata(request: web.Request) -> web.Response:
        name, version, entry = found(request)
        body = (registry._folder(name, version) / "metadata.json").read_bytes()
        return web.Response(body=body, content_type="application/json",
                            headers={"X-Model-Seq": str(entry["seq"])})

    async def get_onnx(request: web.Request) -> web.StreamResponse:
        name, version, entry = found(request)
        return web.FileResponse(registry._folder(name, version) / "model.onnx",
                                headers={"X-Model-Sha256": entry["sha256"], "ETag": f'"{entry["sha256"]}"',
                                         "Content-Type": "application/octet-stream"})

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
