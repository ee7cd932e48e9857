"""Who may call what: the operator token for the API and dashboard, a gateway's own token for its
own ``/v1/gateways/{gateway_id}/...`` paths.

Each check returns None (allowed) or the refusal to send, a counted JSON error (errors as values):
401 ``unauthorized`` when no token or an unknown token came, 403 ``forbidden`` when a valid token
came for something it may not do (a gateway token on another gateway's path, or on an operator
route). Invariant: with ``operator_token`` unset (development) operator routes are open, and
gateway routes never are.
"""

from __future__ import annotations

from aiohttp import web

from cloud.api.context import CONFIG
from cloud.api.errors import bearer_token, reject, token_ok, unauthorized


def gateway_owning(request: web.Request, token: str) -> str | None:
    """The gateway whose token ``token`` is, if any (constant-time per comparison)."""
    for gateway, expected in request.app[CONFIG].gateway_tokens.items():
        if token_ok(token, expected):
            return gateway
    return None


def operator_refusal(request: web.Request) -> web.Response | None:
    expected = request.app[CONFIG].operator_token
    if expected is None:
        return None
    token = bearer_token(request)
    if token is None:
        return unauthorized(
            request, f"{request.method} {request.path} needs Authorization: Bearer <operator token>"
        )
    if token_ok(token, expected):
        return None
    owner = gateway_owning(request, token)
    if owner is not None:
        return reject(
            request,
            403,
            "forbidden",
            f"a gateway token (of {owner!r}) may not call {request.method} {request.path}; "
            "it needs the operator token",
        )
    return unauthorized(request, "Authorization: Bearer token is not the operator token")


def gateway_refusal(request: web.Request, gateway: str) -> web.Response | None:
    token = bearer_token(request)
    if token is None:
        return unauthorized(
            request,
            f"{request.method} {request.path} needs Authorization: Bearer <token of gateway {gateway!r}>",
        )
    if token_ok(token, request.app[CONFIG].gateway_tokens.get(gateway)):
        return None
    owner = gateway_owning(request, token)
    if owner is not None:
        return reject(
            request,
            403,
            "forbidden",
            f"the token of gateway {owner!r} may only be used on /v1/gateways/{owner}/..., "
            f"not on gateway {gateway!r}",
        )
    return unauthorized(request, f"Authorization: Bearer token is not the token of gateway {gateway!r}")
