"""Frames for the cloud wait here, out of the log, until the uplink is ready to send them.

    router task --hold--> CloudHandoff --release (the uplink's task, between two requests)--> log
                                      \\--reclaim (the router, before a switch)--> inferred here

Why: a FrameForCloud record in the log can only be run by the cloud; if the link dies under it (a
black hole takes seconds to recognise), the frame's result waits for the whole outage. Held here
instead, it goes into the log only when the uplink is between two requests on a working link (its
next batch carries it at once); when the plan moves ``infer`` back to the edge the router reclaims
what is still held and infers it here. So the frames that wait out an outage are at most those of
the one request the outage caught. A frame may carry a *deadline* (when the edge would have inferred
it; docs/placement.md, "Dispatching each frame"): past it, the router takes it back (``take_overdue``)
and infers it here, without waiting for the link monitor to call a black hole down.

Owner: the camera runner's ``CameraEventRecorder`` builds one; its router task holds and reclaims,
the uplink's task releases (``Uplink.add_before_batch``). ``_lock`` orders them: a frame is released
or reclaimed, never both, and never after the marker that ended the sides it was routed under (the
router releases or reclaims everything held before it appends a marker).

Invariant: every held frame leaves exactly once: appended as its FrameForCloud record (or counted by
the append as lost to a full log), or returned by ``reclaim`` or ``take_overdue``; a release
cancelled mid-way leaves the frames it had not appended held. Held frames live in memory (like the
inference engine's queue): at most ``bound`` of them; the router releases the oldest itself when the
bound is reached (``overflow_released``), so a stalled uplink costs memory that is bounded.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HeldFrame:
    frame: Any  # the CameraSource frame: reclaimed, it is inferred here
    body: dict[str, Any]  # its FrameForCloud record body, the JPEG already in the blob spool
    deadline: float = math.inf  # time.monotonic() after which it is inferred here (module docstring)


Append = Callable[[HeldFrame], Awaitable[None]]


class CloudHandoff:
    def __init__(self, bound: int, on_held: Callable[[], None]) -> None:
        if bound < 1:
            raise ValueError("bound must be >= 1")
        self.bound = bound
        self._on_held = on_held  # wakes the uplink: an idle one would not look for a while
        self._held: collections.deque[HeldFrame] = collections.deque()
        self._lock = asyncio.Lock()
        self.counters = {"held": 0, "released": 0, "reclaimed": 0, "overdue": 0, "overflow_released": 0}

    def waiting(self) -> int:
        return len(self._held)

    def next_deadline(self) -> float:
        """The earliest deadline of the held frames (inf: none)."""
        return min((item.deadline for item in self._held), default=math.inf)

    async def hold(self, item: HeldFrame, append: Append) -> None:
        """Keep ``item`` until the uplink takes it; at the bound, the oldest goes into the log now."""
        async with self._lock:
            if len(self._held) >= self.bound:
                self.counters["overflow_released"] += 1
                await self._append_oldest(append)
            self._held.append(item)
            self.counters["held"] += 1
        self._on_held()

    async def release(self, append: Append) -> int:
        """Append every held frame, oldest first; how many."""
        async with self._lock:
            released = len(self._held)
            while self._held:
                await self._append_oldest(append)
            return released

    async def reclaim(self) -> list[HeldFrame]:
        """Take back every held frame, oldest first (``infer`` moves to the edge)."""
        async with self._lock:
            taken = list(self._held)
            self._held.clear()
            self.counters["reclaimed"] += len(taken)
            return taken

    async def take_overdue(self, now: float) -> list[HeldFrame]:
        """Take back the held frames whose deadline has passed, oldest first (inferred here)."""
        async with self._lock:
            overdue = [item for item in self._held if item.deadline <= now]
            if overdue:
                self._held = collections.deque(item for item in self._held if item.deadline > now)
                self.counters["overdue"] += len(overdue)
            return overdue

    async def _append_oldest(self, append: Append) -> None:
        item = self._held[0]
        # Taken off only once ``append`` returned (appended, or counted by it): an append cancelled
        # while it waited for room (the uplink bounds its wait) wrote nothing, and the frame stays.
        await append(item)
        self._held.popleft()
        self.counters["released"] += 1
