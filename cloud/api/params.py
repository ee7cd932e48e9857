"""Query-string parameters of the operator's read APIs: parsed, bounded, and refused by name.

Invariant: a handler gets either a value within its bounds or a ``BadParam`` whose message names
the parameter and what it must be; ``bad_param`` turns that into a 400 ``invalid`` answer.
"""

from __future__ import annotations

import math

from aiohttp import web

from cloud.api.errors import error_response


class BadParam(ValueError):
    """A query parameter that does not parse or is out of bounds (the message names it)."""


def number(request: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadParam(f"{name}: {text!r} is not a number") from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise BadParam(f"{name}: {text} is outside [{lo:g}, {hi:g}]")
    return value


def integer(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    value = number(request, name, default, lo, hi)
    if value != int(value):
        raise BadParam(f"{name}: {value:g} is not a whole number")
    return int(value)


def choice(request: web.Request, name: str, default: str | None, allowed: tuple[str, ...]) -> str | None:
    text = request.query.get(name, default)
    if text is not None and text not in allowed:
        raise BadParam(f"{name}: {text!r} is not one of {', '.join(allowed)}")
    return text


def flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "") in ("1", "true", "yes")


def bad_param(exc: BadParam) -> web.Response:
    return error_response(400, "invalid", str(exc))
