"""The shared runtime (runtime/): durable file writes, retry backoff, task ownership."""

from __future__ import annotations

import asyncio
import os
import random
import stat

import pytest

from runtime.backoff import Backoff
from runtime.files import atomic_write, atomic_writer, fsync_dir, remove_leftovers
from runtime.tasks import cancel_and_wait

# -- files ------------------------------------------------------------------------------------------


def test_atomic_write_replaces_the_file_whole_with_the_mode_asked(tmp_path):
    target = tmp_path / "state.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "weights.bin"
    atomic_write(target, b"v1")
    with pytest.raises(RuntimeError), atomic_writer(target) as handle:
        handle.write(b"half of v2")
        raise RuntimeError("the writer died mid-way")
    assert target.read_bytes() == b"v1"
    assert os.listdir(tmp_path) == ["weights.bin"]


def test_remove_leftovers_removes_only_this_files_temporaries(tmp_path):
    target = tmp_path / "desired.json"
    atomic_write(target, b"{}")
    (tmp_path / ".desired.json.abc123.tmp").write_bytes(b"torn")  # a write that crashed
    (tmp_path / ".other.json.abc123.tmp").write_bytes(b"someone else's")
    assert remove_leftovers(target) == 1
    assert sorted(os.listdir(tmp_path)) == [".other.json.abc123.tmp", "desired.json"]


def test_fsync_dir_refuses_a_file(tmp_path):
    (tmp_path / "f").write_bytes(b"")
    fsync_dir(tmp_path)
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "f")


# -- backoff ----------------------------------------------------------------------------------------


def test_backoff_doubles_to_the_cap_with_equal_jitter():
    retry = Backoff(0.2, 5.0, random.Random(1))
    bases = []
    for _ in range(8):
        delay = retry.failed()
        bases.append(retry.base_s)
        assert retry.base_s / 2 <= delay <= retry.base_s
    assert bases == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0])
    assert retry.at_max
    retry.succeeded()
    assert retry.failures == 0 and not retry.at_max
    assert 0.1 <= retry.failed() <= 0.2


def test_backoff_longest_waits_up_to_the_cap_and_a_seed_repeats():
    first = Backoff(1.0, 8.0, random.Random(7))
    assert all(4.0 <= first.longest() <= 8.0 for _ in range(50))
    one, two = Backoff(0.1, 3.0, random.Random(3)), Backoff(0.1, 3.0, random.Random(3))
    assert [one.failed() for _ in range(10)] == [two.failed() for _ in range(10)]


def test_backoff_refuses_an_empty_range():
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(2.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)


# -- tasks ------------------------------------------------------------------------------------------


async def test_cancel_and_wait_ends_the_task_and_absorbs_its_cancellation():
    finished = asyncio.Event()

    async def child() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            finished.set()

    task = asyncio.create_task(child())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and finished.is_set()
    await cancel_and_wait(None)
    await cancel_and_wait(task)  # already finished: nothing to do


async def test_cancel_and_wait_lets_a_deadline_around_it_fire():
    """A child that takes long to stop must not hold its owner past the owner's own deadline."""
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # ignores cancellation until released

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await cancel_and_wait(task)
    assert not task.done()
    release.set()
    await task


async def test_cancel_and_wait_passes_on_the_childs_own_error():
    async def broken() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise OSError("cleanup failed") from None

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(OSError, match="cleanup failed"):
        await cancel_and_wait(task)
