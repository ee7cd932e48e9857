"""The log's scrub: verify every segment now and then at a low I/O rate, or at once when asked.

Owns: one task (``start`` creates it, ``stop`` cancels and awaits it; ``EpochLog.open``/``close``
call them) that runs a verify pass (``EpochLog.verify``: every record from the trim point to the
durable LSN, through the checks a read makes) every ``interval_s`` (0: only when asked), paced to
``rate_Bps``; ``request`` (``gatewayctl log verify``) starts a pass at once, or makes the pass in
progress go on at full speed, and waits for it a bounded time. ``status()`` is the last pass's
report and the progress of the one running; damage a pass finds is counted and logged by the log.

Invariant: at most one pass runs at a time, and ``request`` never waits past its ``wait_s``: a pass
it did not see finish goes on and its report is in the next ``status()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.storage.interface import VerifyReport
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

Verify = Callable[[Callable[[int], Awaitable[None]]], Awaitable[VerifyReport]]


class Scrubber:
    def __init__(self, verify: Verify, interval_s: float, rate_Bps: float) -> None:
        self._verify = verify
        self.interval_s, self.rate_Bps = interval_s, rate_Bps
        self._task: asyncio.Task[None] | None = None
        self._asked = asyncio.Event()
        self._full_speed = False  # the pass in progress (or the next) was asked for: no pacing
        self._running: asyncio.Future[None] | None = None  # done when the pass in progress ends
        self._next: asyncio.Future[None] | None = None  # done when the pass asked for ends
        self._progress = (0.0, 0)  # (when the pass in progress started, bytes verified so far)
        self.last: VerifyReport | None = None
        self.last_error = ""
        self.counters = {"scrub_passes": 0, "scrub_bytes": 0, "scrub_errors": 0}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="log-scrub")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def request(self, wait_s: float) -> dict[str, Any]:
        """Start a pass at full speed (or speed up the one in progress); wait up to ``wait_s`` for it.
        ``status()`` and ``done``: whether that pass ended (then ``last`` is its report)."""
        self._full_speed = True
        if self._running is not None:
            waiter = self._running
        else:
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
            waiter = self._next
            self._asked.set()
        try:
            async with asyncio.timeout(wait_s):
                await asyncio.shield(waiter)
        except TimeoutError:
            pass
        return {**self.status(), "done": waiter.done()}

    async def _run(self) -> None:
        while True:
            if self.interval_s > 0:
                await wait_event(self._asked, self.interval_s)
            else:
                await self._asked.wait()
            self._asked.clear()
            self._running = self._next or asyncio.get_running_loop().create_future()
            self._next = None
            self._progress = (time.time(), 0)
            try:
                await self._one_pass()
            finally:
                self._running.set_result(None)
                self._running, self._full_speed = None, False

    async def _one_pass(self) -> None:
        try:
            report = await self._verify(self._pace)
        except Exception as exc:  # a failing disk fails the log elsewhere; the scrub says so and goes on
            self.counters["scrub_errors"] += 1
            self.last, self.last_error = None, f"{type(exc).__name__}: {exc}"
            log.warning("log scrub failed: %s", self.last_error)
            return
        self.last, self.last_error = report, ""
        self.counters["scrub_passes"] += 1
        self.counters["scrub_bytes"] += report.bytes
        log.info(
            "log scrub: %d segments, %d records, %.1f MB in %.2fs: %s",
            report.segments,
            report.records,
            report.bytes / 1e6,
            report.seconds,
            f"{len(report.damage)} damaged" if report.damage else "no damage",
        )

    async def _pace(self, nbytes: int) -> None:
        """After each window verified: hold the I/O rate, unless this pass was asked for."""
        self._progress = (self._progress[0], self._progress[1] + nbytes)
        await asyncio.sleep(0 if self._full_speed else nbytes / self.rate_Bps)

    def status(self) -> dict[str, Any]:
        running = self._running is not None
        return {
            "running": running,
            "running_since_ts": self._progress[0] if running else None,
            "running_bytes": self._progress[1] if running else 0,
            "interval_s": self.interval_s,
            "rate_Bps": self.rate_Bps,
            "last": self.last.as_dict() if self.last is not None else None,
            "last_error": self.last_error,
        }

    def stats(self) -> dict[str, int]:
        """Counters, and two gauges: ``scrub_running``, ``scrub_last_damage`` (places the last pass found)."""
        last_damage = len(self.last.damage) if self.last is not None else 0
        return {
            **self.counters,
            "scrub_running": int(self._running is not None),
            "scrub_last_damage": last_damage,
        }
