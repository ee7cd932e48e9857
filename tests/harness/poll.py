"""Waiting for a condition: ``wait_until`` (blocking) and ``eventually`` (async), nothing else.

Both call ``probe`` until ``check(value)`` holds (by default: until the value is truthy) and return
that value, so a test can assert on the state it waited for. On timeout they raise ``TimeoutError``
naming what was waited for and the last value seen (or the last exception), so a failure says where
the system stood. An exception of a type in ``ignoring`` (by default OSError, LookupError and
ValueError: a daemon not listening yet, a status field or list entry not there yet, a file half
written) means "not yet"; any other exception, an AssertionError included, propagates at once. The
probe runs at least once, and once more at the deadline.

A test waits for the condition that makes its next assert valid, never for a fixed time. A sleep
that is the scenario itself ("the link is down for 2 s") is written as a sleep, with a comment.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

NOT_YET: tuple[type[BaseException], ...] = (OSError, LookupError, ValueError)
INTERVAL_S = 0.05
_SHOWN = 2000  # characters of the last value in a timeout message


class _Tracker:
    """The deadline and the last thing the probe gave, for the timeout message."""

    def __init__(self, timeout_s: float, what: str) -> None:
        self.what, self.timeout_s = what, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.last = "nothing yet"
        self.tries = 0

    def saw(self, value: object) -> None:
        self.tries += 1
        self.last = f"last value: {value!r}"

    def failed(self, exc: BaseException) -> None:
        self.tries += 1
        self.last = f"last error: {type(exc).__name__}: {exc}"

    def pause_s(self, interval_s: float) -> float | None:
        """How long to sleep before the next try; None when the deadline has passed."""
        left = self.deadline - time.monotonic()
        return None if left <= 0 else min(interval_s, left)

    def timeout(self) -> TimeoutError:
        last = self.last if len(self.last) <= _SHOWN else self.last[:_SHOWN] + "..."
        return TimeoutError(
            f"timed out after {self.timeout_s}s ({self.tries} tries) waiting for {self.what}; {last}"
        )


def wait_until(
    probe: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    check: Callable[[T], Any] = bool,
    interval_s: float = INTERVAL_S,
    ignoring: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """Call ``probe`` every ``interval_s`` until ``check`` holds for its value; return the value."""
    tracker = _Tracker(timeout_s, what)
    while True:
        try:
            value = probe()
            if check(value):
                return value
            tracker.saw(value)
        except ignoring as exc:
            tracker.failed(exc)
        pause = tracker.pause_s(interval_s)
        if pause is None:
            raise tracker.timeout()
        time.sleep(pause)


async def eventually(
    probe: Callable[[], T | Awaitable[T]],
    timeout_s: float,
    what: str,
    *,
    check: Callable[[T], Any] = bool,
    interval_s: float = INTERVAL_S,
    ignoring: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """``wait_until`` for async tests: ``probe`` may return an awaitable (e.g. ``asyncio.to_thread``
    around a blocking call), which is awaited; the loop sleeps with ``asyncio.sleep``."""
    tracker = _Tracker(timeout_s, what)
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
            if check(value):
                return value
            tracker.saw(value)
        except ignoring as exc:
            tracker.failed(exc)
        pause = tracker.pause_s(interval_s)
        if pause is None:
            raise tracker.timeout()
        await asyncio.sleep(pause)
