"""Error responses and bearer auth shared by every route group.

Invariant: every error cloudd answers is JSON ``{"error": <stable token>, "detail": <message>}``
(the ``json_errors`` middleware converts aiohttp's own 404/405/413 and unexpected exceptions),
and every refusal that goes through ``reject`` or ``reject_invalid`` is counted in
``cloudd_rejections{reason}``.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal

from aiohttp import web

from cloud.api.context import METRICS
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

# cloudd's own error tokens (a body the protocol refuses keeps the protocol's reason: ``reject_invalid``)
RejectionReason = Literal[
    # auth
    "unauthorized",
    "forbidden",
    # requests: HTTP-level, then per route group
    "not_found",
    "method_not_allowed",
    "too_large",
    "truncated",
    "invalid",
    "http_error",
    "gateway_mismatch",
    "missing_idempotency_key",
    "idempotency_key_mismatch",
    "offset_mismatch",
    "sha256_mismatch",
    "blob_conflict",
    "invalid_spec",
    "invalid_dataset",
    "dataset_exists",
    "length_required",
    "invalid_since",
    "queue_full",
    "already_finished",
    "no_job",
    # model lifecycle (cloud/rollout/transitions.py)
    "not_promotable",
    "canary_running",
    "already_production",
    "no_target",
    "use_promote",
    "is_production",
    "no_assignment",
    # cloudd itself
    "busy",
    "standby",
    "store_failed",
    "internal",
]

# aiohttp's own HTTP errors, as our tokens
_STATUS_TOKENS: dict[int, RejectionReason] = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


def error_response(
    status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps({"error": error, "detail": detail}),
        content_type="application/json",
        headers=headers,
    )


def reject(
    request: web.Request,
    status: int,
    error: RejectionReason,
    detail: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """A counted refusal."""
    request.app[METRICS].rejections.labels(reason=error).inc()
    return error_response(status, error, detail, headers)


def reject_invalid(request: web.Request, exc: ProtocolError) -> web.Response:
    """A counted refusal of a body the protocol refused, under the protocol's reason (``not_json``,
    ``invalid``, ...): 413 for ``too_large``, else 400."""
    request.app[METRICS].rejections.labels(reason=exc.reason).inc()
    return error_response(413 if exc.reason == "too_large" else 400, exc.reason, exc.detail)


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_ok(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; a missing token never matches."""
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def unauthorized(request: web.Request, detail: str) -> web.Response:
    return reject(request, 401, "unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        token = _STATUS_TOKENS.get(exc.status, "http_error")
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return reject(request, exc.status, token, f"{request.method} {request.path}: {exc.reason}", allow)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return reject(request, 500, "internal", f"{request.method} {request.path}: internal error (see log)")
