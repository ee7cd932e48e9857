"""Which uplink transfers have stalled: outstanding longer than the link monitor allows.

Owns one timer per transfer on the wire. Invariant: a transfer is reported (``on_stall``) at most
once, when it has been outstanding for the monitor's ``stall_after_s`` of the bytes of *every*
transfer in flight: pipelined batches share the link, so each takes as long as all of them, and a
deadline from its own bytes alone would call a busy link a black hole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.uplink.outcome import UploadObserver


class StallWatch:
    def __init__(
        self, monitor: UploadObserver | None, clock: Callable[[], float], on_stall: Callable[[], None]
    ):
        self._monitor = monitor
        self._clock = clock
        self._on_stall = on_stall
        self._transfers: dict[int, tuple[float, int]] = {}  # key -> (began, bytes), while on the wire
        self._reported: set[int] = set()
        self._timers: list[asyncio.TimerHandle] = []

    def began(self, key: int, nbytes: int) -> None:
        self._transfers[key] = (self._clock(), nbytes)
        self._rearm()

    def ended(self, key: int) -> None:
        del self._transfers[key]
        self._reported.discard(key)
        self._rearm()

    def _rearm(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers = []
        if self._monitor is None:
            return
        in_flight = sum(nbytes for _, nbytes in self._transfers.values())
        self._monitor.uplink_in_flight(in_flight)  # a probe shares the link with them (link.py)
        if not self._transfers:
            return
        allowed = self._monitor.stall_after_s(in_flight)
        now, loop = self._clock(), asyncio.get_running_loop()
        for key, (began, _) in self._transfers.items():
            if key not in self._reported:
                self._timers.append(loop.call_later(max(0.0, began + allowed - now), self._stalled, key))

    def _stalled(self, key: int) -> None:
        self._reported.add(key)
        self._on_stall()
