"""A daemon's stop under a deadline: its steps one after another, what they leave behind, the exit.

``run_stop_steps`` runs the named stop steps in order, each under what is left of one deadline;
``cancel_leftovers`` ends the tasks still running after them; ``arm_exit_guard`` is the last resort
for what cannot be ended from the loop (a thread blocked in a system call, a task that swallows its
cancellation): it ends the process. ``in_daemon_thread`` runs a blocking call that a stop need not
wait for (a TCP connect to a broker that drops SYNs) where it cannot hold the exit.

Invariant: a stop never hides that it missed its deadline, and never outlives the guard. A step
that overruns its share is cancelled, named in the log and reported; a task still running after the
steps is named and reported; a process still alive when the guard fires exits with its code at once,
naming its threads. Steps that honour cancellation end within the deadline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

log = logging.getLogger(__name__)

StopStep = tuple[str, Callable[[], Awaitable[object]]]

T = TypeVar("T")

STEP_RESERVE_S = 0.25  # kept back for each later step, so one hung step cannot starve the rest


async def run_stop_steps(
    steps: Sequence[StopStep], deadline_s: float, reserve_s: float = STEP_RESERVE_S
) -> list[str]:
    """Run ``steps`` one after another within ``deadline_s`` in all; the names of those that failed.

    Sequential on purpose: each subsystem is either stopped or still running, never half. Each step
    gets what is left of the deadline less ``reserve_s`` for each step after it (at least
    ``reserve_s`` itself). A step that overruns is cancelled (its owner's ``cancel_and_wait``
    passes that on) and named in the log; a step that raises is logged with its traceback. Either
    way the next step still runs.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    failed: list[str] = []
    for index, (name, step) in enumerate(steps):
        later = len(steps) - index - 1
        budget = max(reserve_s, end - loop.time() - later * reserve_s)
        share = asyncio.timeout(budget)
        try:
            async with share:
                await step()
        except Exception as exc:
            failed.append(name)
            if isinstance(exc, TimeoutError) and share.expired():
                log.error(
                    "stop: %s did not stop within %.1fs (its share of the %.1fs deadline)",
                    name,
                    budget,
                    deadline_s,
                )
            else:  # a TimeoutError of the step's own included
                log.exception("stop: %s failed", name)
    return failed


async def cancel_leftovers(grace_s: float) -> list[str]:
    """Cancel every task of this loop but the caller's; wait up to ``grace_s`` for them to end.

    Returns the names of those still running (their owners failed to end them and they ignore
    cancellation): ``asyncio.run`` would wait for them for ever.
    """
    me = asyncio.current_task()
    leftovers = [task for task in asyncio.all_tasks() if task is not me]
    for task in leftovers:
        task.cancel()
    if leftovers:
        await asyncio.wait(leftovers, timeout=grace_s)
    return sorted(task.get_name() for task in leftovers if not task.done())


def arm_exit_guard(after_s: float, exit_code: int = 1) -> threading.Timer:
    """Exit the process with ``exit_code`` in ``after_s`` seconds if it has not exited by then.

    For the end of a stop: the interpreter waits for every non-daemon thread and ``asyncio.run``
    for every task and executor thread, so one that never ends holds the process for ever. The
    guard is a daemon thread: it runs while the main thread waits for those at exit, and vanishes
    with a process that exits in time. ``os._exit`` skips the rest of the teardown, which is what
    a crash-only daemon may do (everything acknowledged is durable by then).
    """

    def give_up() -> None:
        stuck = [
            thread.name
            for thread in threading.enumerate()
            if not thread.daemon and thread is not threading.main_thread()
        ]
        log.critical(
            "stop: still running %.1fs after the stop began (non-daemon threads: %s); exiting with %d now",
            after_s,
            ", ".join(stuck) or "none but the main thread",
            exit_code,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(exit_code)

    guard = threading.Timer(after_s, give_up)
    guard.name = "exit-guard"
    guard.daemon = True
    guard.start()
    return guard


async def in_daemon_thread(call: Callable[[], T], name: str) -> T:
    """``call()`` in a daemon thread of its own; its result or exception.

    Unlike ``run_in_executor`` (whose threads ``asyncio.run`` and the interpreter wait for at exit),
    a call still blocked when the daemon stops does not hold the exit: a connect to a broker that
    drops SYNs held gatewayd's exit for its whole ``connect_timeout_s`` (8.7 s after a clean stop).
    Cancelling the caller abandons the call; what it returns then is dropped.
    """
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: object) -> None:
        if not outcome.done():  # else the caller was cancelled meanwhile
            setter(value)

    def deliver(setter: Callable[[Any], None], value: object) -> None:
        try:
            loop.call_soon_threadsafe(settle, setter, value)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            pass

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the caller, whatever it is
            deliver(outcome.set_exception, exc)
        else:
            deliver(outcome.set_result, result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await outcome
