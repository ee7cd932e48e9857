"""Resumable blob upload: ``/v1/gateways/{gateway_id}/blobs/{blob_id}`` (docs/http-api.md, "Blobs").

- ``PUT ...?offset=N`` with a chunk as the body appends it at N (N must be the stored offset);
  ``&final=1`` with header ``X-Sha256: <hex>`` then verifies the whole blob and commits it.
- ``HEAD ...`` answers the stored offset in ``Upload-Offset`` (and ``Blob-Committed``, ``X-Sha256``);
  ``GET .../status`` answers the same as JSON.
Auth: the gateway's upload token, as for batches. A chunk is read whole before anything is written,
so a connection cut mid-chunk stores nothing of it (400 ``truncated``, counted).
Invariant: 200 is answered only after the chunk is fsynced (and, for ``final``, the blob committed);
re-sending a committed blob is a 200 no-op; every refusal is counted (``cloudd_rejections``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter

from cloud.api.context import CONFIG, METRICS, TASKS
from cloud.api.errors import bearer_token, reject, token_ok, unauthorized
from cloud.api.ingest import _read_body
from cloud.store.blobs import (
    Appended,
    AppendResult,
    AsyncBlobStore,
    BlobBusy,
    BlobStatus,
    BlobStore,
    Conflict,
    HashMismatch,
    OffsetMismatch,
    TooLarge,
    valid_blob_id,
    valid_sha256,
)

log = logging.getLogger(__name__)

BLOB_PATH = "/v1/gateways/{gateway_id}/blobs/{blob_id}"
BLOB_STATUS_PATH = BLOB_PATH + "/status"


@dataclass(frozen=True)
class BlobMetrics:
    chunks: Counter
    bytes_written: Counter
    committed: Counter


BLOBS = web.AppKey("blobs", AsyncBlobStore)
BLOB_METRICS = web.AppKey("blob_metrics", BlobMetrics)


def setup(app: web.Application) -> None:
    registry = app[METRICS].registry
    app[BLOB_METRICS] = BlobMetrics(
        Counter("cloudd_blob_chunks", "Blob chunks stored (fsynced)", registry=registry),
        Counter(
            "cloudd_blob_bytes_written",
            "Blob bytes stored; each byte of a blob is written once unless its hash fails",
            registry=registry,
        ),
        Counter("cloudd_blobs_committed", "Blobs verified and committed", registry=registry),
    )
    app[BLOBS] = AsyncBlobStore(BlobStore(app[CONFIG].data_dir / "blobs"))
    app.cleanup_ctx.append(_blobs_lifetime)
    app.router.add_put(BLOB_PATH, put_blob)
    app.router.add_route("HEAD", BLOB_PATH, head_blob)
    app.router.add_get(BLOB_STATUS_PATH, get_blob_status)


async def _blobs_lifetime(app: web.Application) -> AsyncIterator[None]:
    yield
    app[BLOBS].close()  # after in-flight requests: their chunks are written (or never acknowledged)


def _check(request: web.Request) -> tuple[str, str] | web.Response:
    gateway, blob_id = request.match_info["gateway_id"], request.match_info["blob_id"]
    if not token_ok(bearer_token(request), request.app[CONFIG].gateway_tokens.get(gateway)):
        return unauthorized(request, f"Authorization: Bearer token is not the token of gateway {gateway!r}")
    if not valid_blob_id(blob_id):
        return reject(
            request, 400, "invalid", f"blob_id {blob_id!r} must match [A-Za-z0-9_-][A-Za-z0-9_.-]{{0,127}}"
        )
    return gateway, blob_id


def _status_response(status: BlobStatus, http_status: int = 200) -> web.Response:
    return web.json_response(status.to_dict(), status=http_status)


async def put_blob(request: web.Request) -> web.Response:
    checked = _check(request)
    if isinstance(checked, web.Response):
        return checked
    gateway, blob_id = checked
    try:
        offset = int(request.query.get("offset", ""))
        if offset < 0:
            raise ValueError
    except ValueError:
        return reject(request, 400, "invalid", "offset: query parameter must be an integer >= 0")
    final = request.query.get("final") in ("1", "true")
    sha = request.headers.get("X-Sha256")
    if final and (sha is None or not valid_sha256(sha.lower())):
        return reject(
            request, 400, "invalid", "X-Sha256: final=1 needs the blob's SHA-256 as 64 hex characters"
        )
    body = await _read_body(request, request.app[CONFIG].max_body_bytes)
    if isinstance(body, web.Response):
        return body
    try:
        result = await request.app[BLOBS].append(
            gateway, blob_id, offset, body, sha.lower() if final and sha else None
        )
    except BlobBusy as exc:
        return reject(request, 503, "busy", str(exc), headers={"Retry-After": "1"})
    except OSError as exc:
        log.exception("storing blob %s/%s failed", gateway, blob_id)
        return reject(request, 500, "store_failed", f"blob {blob_id} chunk at {offset} not stored: {exc}")
    return _answer(request, result)


def _answer(request: web.Request, result: AppendResult) -> web.Response:
    metrics = request.app[BLOB_METRICS]
    if isinstance(result, OffsetMismatch):
        response = reject(
            request,
            409,
            "offset_mismatch",
            f"offset: the blob holds {result.status.offset} bytes; resume there",
        )
        response.headers["Upload-Offset"] = str(result.status.offset)
        return response
    if isinstance(result, HashMismatch):
        metrics.bytes_written.inc(result.written)
        return reject(
            request,
            422,
            "sha256_mismatch",
            f"X-Sha256: blob hashes to {result.actual}, not {result.expected}; "
            "the partial upload was discarded, start again at offset 0",
        )
    if isinstance(result, Conflict):
        return reject(
            request,
            409,
            "blob_conflict",
            f"blob {result.status.blob_id} is committed with sha256 {result.status.sha256}",
        )
    if isinstance(result, TooLarge):
        return reject(request, 413, "too_large", f"blob {result.blob_id} would be {result.size} bytes")
    assert isinstance(result, Appended)
    if result.written:
        metrics.chunks.inc()
        metrics.bytes_written.inc(result.written)
    if result.committed_now:
        metrics.committed.inc()
        if TASKS in request.app:
            request.app[TASKS].wake()  # a frame waiting for this blob is inferred now
    return _status_response(result.status)


async def _status(request: web.Request) -> BlobStatus | web.Response:
    checked = _check(request)
    if isinstance(checked, web.Response):
        return checked
    try:
        return await request.app[BLOBS].status(*checked)
    except BlobBusy as exc:
        return reject(request, 503, "busy", str(exc), headers={"Retry-After": "1"})


async def head_blob(request: web.Request) -> web.Response:
    status = await _status(request)
    if isinstance(status, web.Response):
        return web.Response(status=status.status, headers=status.headers)
    headers = {"Upload-Offset": str(status.offset), "Blob-Committed": "1" if status.committed else "0"}
    if status.sha256:
        headers["X-Sha256"] = status.sha256
    return web.Response(status=200, headers=headers)


async def get_blob_status(request: web.Request) -> web.Response:
    status = await _status(request)
    return status if isinstance(status, web.Response) else _status_response(status)
