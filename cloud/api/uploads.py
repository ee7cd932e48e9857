"""Datasets users upload for their jobs (``cloud.jobs.uploads``; operator token on every route).

    PUT /v1/datasets/files/{name}   body: the file's bytes (.npz or torch tensor file); optional
                                    header X-Sha256 (the client's hash, checked)
                                    201 stored | 200 the same bytes were already there |
                                    409 dataset_exists (other bytes) | 400 invalid_dataset |
                                    400 truncated | 411 length_required | 413 too_large |
                                    422 sha256_mismatch
    GET /v1/datasets/files          {"datasets": [meta, ...]} by name
    GET /v1/datasets/files/{name}   the dataset's meta | 404 not_found

A meta is ``{"name", "format", "sha256", "size", "rows", "x_shape", "x_dtype", "y_shape",
"y_dtype", "classes", "uploaded_ts"}`` (shapes and rows null for a torch file until a job reads it).

Invariant: the body is streamed to a file under the uploads folder and counted against its
Content-Length (required) and the size cap (``--max-dataset-bytes``) before anything is kept; a
connection cut mid-body keeps nothing (400 ``truncated``); PUT is idempotent per name and bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cloud.api.auth import operator_refusal
from cloud.api.context import CONFIG, UPLOADS
from cloud.api.errors import reject
from cloud.jobs.uploads import DatasetInvalid, Exists, UploadedDatasets
from protocol.errors import ProtocolError
from protocol.topics import ID_PATTERN, check_id

FILE_PATH = "/v1/datasets/files/{name}"
CHUNK_BYTES = 1 << 20
_STORE_LOCK = web.AppKey("uploads_lock", asyncio.Lock)


def setup(app: web.Application) -> None:
    config = app[CONFIG]
    app[UPLOADS] = UploadedDatasets(config.data_dir / "uploads", config.max_dataset_bytes)
    app[UPLOADS].clear_incoming()  # uploads a previous cloudd was cut off in
    app[_STORE_LOCK] = asyncio.Lock()
    app.router.add_put(FILE_PATH, put_dataset)
    app.router.add_get("/v1/datasets/files", list_datasets)
    app.router.add_get(FILE_PATH, get_dataset)


def _name_or_400(request: web.Request) -> str | web.Response:
    name = request.match_info["name"]
    try:
        check_id("dataset", name)
    except ProtocolError:
        return reject(request, 400, "invalid", f"name: {name!r} must match {ID_PATTERN}")
    return name


async def _receive(request: web.Request, path: Path, limit: int) -> str | web.Response:
    """Stream the body into ``path``; its sha256, or the refusal."""
    declared = request.content_length
    if declared is None:
        return reject(request, 411, "length_required", "Content-Length: a dataset upload needs its size")
    if declared > limit:
        response = reject(request, 413, "too_large", f"Content-Length {declared} > limit {limit} bytes")
        response.force_close()  # the body was never read
        return response
    digest, received = hashlib.sha256(), 0
    handle = await asyncio.to_thread(open, path, "wb")
    try:
        while chunk := await request.content.read(CHUNK_BYTES):
            received += len(chunk)
            if received > declared:
                break
            digest.update(chunk)
            await asyncio.to_thread(handle.write, chunk)
        await asyncio.to_thread(handle.flush)
        await asyncio.to_thread(os.fsync, handle.fileno())
    except (OSError, HttpProcessingError) as exc:
        return reject(request, 400, "truncated", f"body ended before its declared length {declared}: {exc}")
    finally:
        handle.close()
    if received != declared:
        return reject(
            request, 400, "truncated", f"body: {received} bytes came, Content-Length said {declared}"
        )
    return digest.hexdigest()


async def put_dataset(request: web.Request) -> web.Response:
    if (refusal := operator_refusal(request)) is not None:
        return refusal
    name = _name_or_400(request)
    if isinstance(name, web.Response):
        return name
    uploads = request.app[UPLOADS]
    path = uploads.temp_path()
    try:
        sha = await _receive(request, path, uploads.max_bytes)
        if isinstance(sha, web.Response):
            return sha
        expected = request.headers.get("X-Sha256")
        if expected is not None and expected.lower() != sha:
            return reject(
                request, 422, "sha256_mismatch", f"X-Sha256: the body hashes to {sha}, not {expected}"
            )
        async with request.app[_STORE_LOCK]:
            status, meta = await asyncio.to_thread(uploads.store, name, path, time.time())
    except DatasetInvalid as exc:
        return reject(request, 400, "invalid_dataset", str(exc))
    finally:
        await asyncio.to_thread(path.unlink, missing_ok=True)
    if isinstance(meta, Exists):
        return reject(
            request,
            409,
            "dataset_exists",
            f"name: dataset {name!r} holds other bytes (sha256 {meta.meta['sha256']}); "
            "upload under another name",
        )
    return web.json_response(meta, status=status)


async def list_datasets(request: web.Request) -> web.Response:
    if (refusal := operator_refusal(request)) is not None:
        return refusal
    return web.json_response({"datasets": await asyncio.to_thread(request.app[UPLOADS].list)})


async def get_dataset(request: web.Request) -> web.Response:
    if (refusal := operator_refusal(request)) is not None:
        return refusal
    name = _name_or_400(request)
    if isinstance(name, web.Response):
        return name
    meta = await asyncio.to_thread(request.app[UPLOADS].meta, name)
    if meta is None:
        return reject(request, 404, "not_found", f"no uploaded dataset {name!r}")
    return web.json_response(meta)
