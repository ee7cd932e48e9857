"""Task ownership: the owner of an asyncio task ends it with ``cancel_and_wait`` on teardown.

Invariant: ``cancel_and_wait`` returns only once the task has finished, and it never swallows a
cancellation aimed at its caller: a deadline around it (``asyncio.timeout``, ``wait_for``) fires
on time even when the task is slow to stop (docs/architecture.md, "House rules").
"""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (if any) and wait until it has finished, so nothing outlives its owner.

    The task's own ``CancelledError`` is the expected end and is absorbed; any other exception it
    raised propagates. If the caller is cancelled while waiting, that ``CancelledError`` propagates
    at once and the task, already told to stop, is left to finish on its own: ``asyncio.wait``
    (unlike ``await task``) neither passes the caller's cancellation on to the task nor waits for it.
    """
    if task is None:
        return
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.result()  # raises what the task raised while stopping


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` has passed; True when it is set.

    Built on ``asyncio.timeout``, never ``wait_for``: in Python 3.11 ``wait_for`` returns normally
    when the awaited thing completes in the same loop pass as a cancellation of the caller, and the
    cancellation is lost (a loop woken often, like an intake under load, then never stops). The
    same holds for every deadline in edgefed: ``async with asyncio.timeout(...)``.
    """
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
