"""A stop under a deadline (runtime/shutdown.py) and the cancellation rule it rests on
(runtime/tasks.py): the caller's own cancellation always gets through ``cancel_and_wait``."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import threading

import pytest

from runtime.shutdown import cancel_leftovers, in_daemon_thread, run_stop_steps
from runtime.tasks import cancel_and_wait

GUARD_S = 5.0  # the test's own bound around a stop that should end long before


async def ignore_cancellation(release: asyncio.Event) -> None:
    """A task that ignores every cancellation until ``release`` is set (the fault under test)."""
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            continue


async def started_stubborn_child(release: asyncio.Event) -> asyncio.Task[None]:
    child = asyncio.create_task(ignore_cancellation(release))
    await asyncio.sleep(0)  # running: a task cancelled before its first step just never runs
    return child


async def run_for_at_most(seconds: float, task: asyncio.Task, release: asyncio.Event) -> None:
    """Wait up to ``seconds`` for ``task``, then release the stubborn child either way, so that a
    regression (a cancellation swallowed) fails the test instead of hanging it."""
    await asyncio.wait({task}, timeout=seconds)
    ended = task.done()
    release.set()
    assert ended, f"still running after {seconds}s: the cancellation was swallowed"


async def test_cancel_and_wait_passes_the_callers_cancellation_on():
    release = asyncio.Event()
    child = await started_stubborn_child(release)
    caller = asyncio.create_task(cancel_and_wait(child))
    await asyncio.sleep(0)  # the caller is inside cancel_and_wait now
    caller.cancel()
    await asyncio.wait({caller}, timeout=GUARD_S)
    caller_ended, child_running = caller.done(), not child.done()
    release.set()
    await asyncio.wait({caller, child})
    assert caller_ended and caller.cancelled(), "the caller's own cancellation was swallowed"
    assert child_running  # the child, told to stop, was left to finish on its own


async def test_a_step_over_its_deadline_is_named_and_the_later_steps_still_run(caplog):
    release = asyncio.Event()
    child = await started_stubborn_child(release)
    ran: list[str] = []

    async def first() -> None:
        ran.append("first")

    async def last() -> None:
        ran.append("last")

    steps = [("first", first), ("stubborn", lambda: cancel_and_wait(child)), ("last", last)]
    with caplog.at_level(logging.ERROR, logger="runtime.shutdown"):
        stopping = asyncio.create_task(run_stop_steps(steps, deadline_s=0.5, reserve_s=0.1))
        await run_for_at_most(GUARD_S, stopping, release)
    assert stopping.result() == ["stubborn"]
    assert ran == ["first", "last"]
    assert "stop: stubborn did not stop within" in caplog.text
    await child


@pytest.mark.parametrize("error", [OSError("disk gone"), TimeoutError("the step's own timeout")])
async def test_a_step_that_raises_is_named_and_the_next_one_runs(error, caplog):
    ran: list[str] = []

    async def broken() -> None:
        raise error

    async def after() -> None:
        ran.append("after")

    with caplog.at_level(logging.ERROR, logger="runtime.shutdown"):
        failed = await run_stop_steps([("log", broken), ("after", after)], deadline_s=1.0)
    assert failed == ["log"] and ran == ["after"]
    assert "stop: log failed" in caplog.text and str(error) in caplog.text
    assert "did not stop within" not in caplog.text  # not mistaken for an overrun


def test_cancel_leftovers_ends_what_it_can_and_names_the_rest():
    """In a loop of its own: the caller of ``cancel_leftovers`` is the loop's main task, as in gatewayd."""

    async def main() -> tuple[list[str], bool]:
        release = asyncio.Event()
        stubborn = await started_stubborn_child(release)
        stubborn.set_name("stubborn")
        polite = asyncio.create_task(asyncio.sleep(3600), name="polite")
        # a swallowed cancellation must not hang the test: release the stubborn task in time regardless
        asyncio.get_running_loop().call_later(GUARD_S, release.set)
        stuck = await cancel_leftovers(grace_s=0.2)
        release.set()
        await stubborn
        return stuck, polite.cancelled()

    assert asyncio.run(main()) == (["stubborn"], True)


def test_the_exit_guard_ends_a_process_a_thread_holds_with_code_1():
    """A non-daemon thread blocked for ever keeps the interpreter from exiting; the guard ends it."""
    script = textwrap.dedent(
        """
        import logging, sys, threading
        from runtime.shutdown import arm_exit_guard
        logging.basicConfig(level=logging.INFO)
        threading.Thread(target=threading.Event().wait, name="blocked-for-ever").start()
        arm_exit_guard(0.5)
        sys.exit(0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 1
    assert "non-daemon threads: blocked-for-ever" in done.stderr


@pytest.mark.parametrize("exit_code", [0, 3])
def test_the_exit_guard_leaves_a_process_that_exits_in_time_alone(exit_code):
    script = (
        f"from runtime.shutdown import arm_exit_guard\narm_exit_guard(30.0)\nraise SystemExit({exit_code})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == exit_code, done.stderr


async def test_in_daemon_thread_runs_the_call_where_it_cannot_hold_the_exit():
    def refuse() -> None:
        raise ConnectionRefusedError("refused")

    thread = await in_daemon_thread(threading.current_thread, name="blocking-call")
    assert thread.daemon and thread.name == "blocking-call"
    with pytest.raises(ConnectionRefusedError, match="refused"):
        await in_daemon_thread(refuse, name="blocking-call")
