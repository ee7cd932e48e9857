"""Error responses and bearer auth shared by every route group.

Invariant: every error cloudd answers is JSON ``{"error": <stable token>, "detail": <message>}``
(the ``json_errors`` middleware converts aiohttp's own 404/405/413 and unexpected exceptions),
and every refusal that goes through ``reject`` is counted in ``cloudd_rejections{reason}``.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from cloud.api.context import METRICS

log = logging.getLogger(__name__)

# aiohttp's own HTTP errors, as our tokens
_STATUS_TOKENS = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


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
    request: web.Request, status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A counted refusal."""
    request.app[METRICS].rejections.labels(reason=error).inc()
    return error_response(status, error, detail, headers)


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
