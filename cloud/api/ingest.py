"""POST /v1/gateways/{gateway_id}/batches: a gateway uploads a batch of log records.

Checks, in this order, each refusal a JSON error naming the problem and nothing stored:
auth (401 ``unauthorized``) -> a store with no room (503 ``busy``, before the body is read or
decoded: under overload a refusal must cost next to nothing, or refusing eats the capacity; the
fleet bench saw one PostgreSQL replica store 100 batches/s at the pace it keeps up with and 46/s
at twice that pace, refusing 595/s after decoding each) -> declared size (413 ``too_large``,
before reading the body) -> body read whole (400 ``truncated``) ->
``protocol.batch.decode_batch`` (400 ``not_json`` | ``invalid``, 413 ``too_large``) -> body
gateway equals the path (400 ``gateway_mismatch``) -> ``Idempotency-Key`` equals the batch's
(400 ``missing_idempotency_key`` | ``idempotency_key_mismatch``) -> store (503 ``busy`` when the
room was taken meanwhile, 500 ``store_failed``).
Invariant: 200 with ``BatchAck`` is sent only after ``store_batch`` returned, i.e. after the
records are durable (see cloud/store/dataset.py).
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cloud.api.auth import gateway_refusal
from cloud.api.context import CONFIG, METRICS, STORE, TASKS
from cloud.api.errors import reject, reject_invalid
from cloud.store.writer import StoreBusy
from protocol.batch import decode_batch
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

BATCHES_PATH = "/v1/gateways/{gateway_id}/batches"


def setup(app: web.Application) -> None:
    app.router.add_post(BATCHES_PATH, post_batch)


async def _read_body(request: web.Request, limit: int) -> bytes | web.Response:
    declared = request.content_length
    if declared is not None and declared > limit:
        response = reject(request, 413, "too_large", f"Content-Length {declared} > limit {limit} bytes")
        response.force_close()  # the body was never read, so this connection cannot carry another request
        return response
    try:
        return await request.read()  # aiohttp stops at client_max_size (= limit) for chunked bodies
    except web.HTTPRequestEntityTooLarge:
        response = reject(request, 413, "too_large", f"body > limit {limit} bytes")
        response.force_close()
        return response
    except (OSError, HttpProcessingError) as exc:
        # The client cut the connection (or the chunked framing broke) before the whole body came.
        # Usually no one is left to read this answer; it is still counted.
        return reject(
            request,
            400,
            "truncated",
            f"body ended before its declared length {declared} ({type(exc).__name__}: {exc})",
        )


def _busy(request: web.Request, detail: str) -> web.Response:
    return reject(request, 503, "busy", detail, headers={"Retry-After": "1"})


async def post_batch(request: web.Request) -> web.Response:
    config, metrics = request.app[CONFIG], request.app[METRICS]
    gateway = request.match_info["gateway_id"]
    refusal = gateway_refusal(request, gateway)
    if refusal is not None:
        return refusal
    store = request.app[STORE]
    if store.pending >= store.max_pending:  # aiohttp reads the unread body away, keeping the connection
        return _busy(request, f"{store.pending} store calls pending (limit {store.max_pending})")
    body = await _read_body(request, config.max_body_bytes)
    if isinstance(body, web.Response):
        return body
    try:
        batch = decode_batch(body)
    except ProtocolError as exc:
        return reject_invalid(request, exc)
    if batch.gateway != gateway:
        return reject(
            request, 400, "gateway_mismatch", f"gateway: body says {batch.gateway!r}, path says {gateway!r}"
        )
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return reject(
            request,
            400,
            "missing_idempotency_key",
            f"Idempotency-Key header is required (expected {batch.idempotency_key!r})",
        )
    if key != batch.idempotency_key:
        return reject(
            request,
            400,
            "idempotency_key_mismatch",
            f"Idempotency-Key {key!r} != {batch.idempotency_key!r} from the body",
        )
    started = time.perf_counter()
    try:
        ack = await store.store_batch(batch)
    except StoreBusy as exc:  # the room checked above was taken while the body was read
        return _busy(request, str(exc))
    except Exception as exc:  # a disk or database error: not acknowledged, the gateway retries
        log.exception("storing batch %s failed", batch.idempotency_key)
        return reject(request, 500, "store_failed", f"batch {batch.idempotency_key} not stored: {exc}")
    finally:
        metrics.pending_writes.set(store.pending)
    metrics.store_seconds.observe(time.perf_counter() - started)
    metrics.batches.inc()
    metrics.records_stored.inc(ack.stored)
    metrics.duplicates.inc(ack.duplicates)
    if ack.stored and TASKS in request.app:
        request.app[TASKS].wake()  # the plan's cloud tasks run on these now, not at the next poll
    return web.Response(body=ack.model_dump_json(), content_type="application/json")
