"""How a running camera is doing, as the control plane and ``/status`` ``camera.state`` show it.

Invariant: a camera whose capture has lost its source and not yet got it back (in backoff, or
reopening it after a failure) is ``degraded`` with the source's last error; one whose router task
ended with an exception is ``failed``; otherwise there is nothing to add (None) to what the camera
answered when it was applied. Pure: it reads the source and the task, changes nothing.
"""

from __future__ import annotations

import asyncio

from gateway.camera.source import CameraSource
from gateway.control.handlers import Applied


def camera_health(
    camera_id: str, source: CameraSource | None, router: asyncio.Task[int] | None
) -> Applied | None:
    if source is None:  # the camera is not running: what it answered stands
        return None
    if router is not None and router.done() and not router.cancelled() and router.exception() is not None:
        return Applied("failed", False, f"camera {camera_id}: its frame router died: {router.exception()!r}")
    state = source.state
    # the first connect is not a failure; connecting again after one is still down
    if state == "backoff" or (state == "connecting" and source.counters.reconnects > 0):
        why = source.counters.last_error or "the source failed"
        detail = f"camera {camera_id}: capture {state} ({why}); reopening {source.config.source!r}"
        return Applied("degraded", True, detail)
    return None
