"""What one upload to the cloud came to, as a value: the uplink's boundary with HTTP.

Invariant: every answer of the cloud, every timeout and every aiohttp client error (refused,
reset) of a ``post`` becomes an ``Outcome`` whose ``kind`` is "ok" or one of ``FAILURE_KINDS``,
never an exception. "ok" always carries the cloud's ``BatchAck``;
a 200 whose body is not one is "bad_ack". ``LINK_FAILURES`` are the kinds in which the link itself
failed (the others got an answer), which is what the link monitor and the short retry go by.
A 503 carries the cloud's ``Retry-After`` (seconds) as ``retry_after_s``: a busy cloudd says when
to come back, and the uplink waits at least that long (sender.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import aiohttp
from pydantic import ValidationError

from protocol.batch import BatchAck

FailureKind = Literal[
    "connection",
    "timeout",
    "server_error",
    "auth",
    "rejected_by_cloud",
    "unexpected_status",
    "bad_ack",
    "local",  # the gateway's own side failed (a spool file could not be read)
]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)
OutcomeKind = Literal["ok"] | FailureKind
# the others got an answer: the link itself worked
LINK_FAILURES: tuple[FailureKind, ...] = ("connection", "timeout")


class UploadObserver(Protocol):
    """What the uplink tells the link monitor (gateway/placement/link.py) about its requests."""

    def observe_upload(self, nbytes: int, seconds: float, ok: bool) -> None: ...

    def stall_after_s(self, nbytes: int) -> float: ...

    def observe_stall(self) -> None: ...

    def uplink_in_flight(self, nbytes: int) -> None:
        """The uplink now has ``nbytes`` on the link (its transfers in flight)."""
        ...

    @property
    def return_round_trip_s(self) -> float:
        """The round trip of the observation that last brought the link back up."""
        ...


@dataclass(frozen=True)
class Outcome:
    """The result of one POST, as a value: ``kind`` is "ok" or one of FAILURE_KINDS."""

    kind: OutcomeKind
    detail: str = ""
    ack: BatchAck | None = None
    retry_after_s: float | None = None


# Told each batch POST's answer and how long it took (seconds): a load driver or a latency metric.
# The link monitor cannot be it: a 503 from a busy cloud is a working link but no batch stored.
AnswerObserver = Callable[[Outcome, float], None]


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> Outcome:
    """POST ``body`` to ``url`` (``timeout_s``: the session's own timeout, for the message)."""
    try:
        async with session.post(url, data=body, headers=headers) as response:
            text = await response.text()
            status = response.status
            retry_after = response.headers.get("Retry-After")
    except TimeoutError:
        return Outcome("timeout", f"no answer from {url} within {timeout_s}s")
    except aiohttp.ClientError as exc:
        return Outcome("connection", f"{type(exc).__name__}: {exc}")
    return classify_response(status, text, retry_after)


def classify_response(status: int, text: str, retry_after: str | None = None) -> Outcome:
    """Pure: turn the cloud's answer (and its ``Retry-After`` header) into an Outcome."""
    if status == 200:
        try:
            return Outcome("ok", ack=BatchAck.model_validate_json(text))
        except ValidationError as exc:
            return Outcome("bad_ack", f"200 with a body that is not a BatchAck: {exc.errors()[0]['msg']}")
    if status in (401, 403):
        return Outcome("auth", f"HTTP {status}")
    if status == 400:
        try:
            error = json.loads(text)
            detail = f"{error.get('error')}: {error.get('detail')}"
        except (ValueError, AttributeError):
            detail = text[:300]
        return Outcome("rejected_by_cloud", f"HTTP 400 {detail}")
    if status == 503 and retry_after is not None and retry_after.strip().isdigit():
        return Outcome("server_error", f"HTTP {status}", retry_after_s=float(retry_after))
    if status >= 500:
        return Outcome("server_error", f"HTTP {status}")
    return Outcome("unexpected_status", f"HTTP {status}: {text[:200]}")
