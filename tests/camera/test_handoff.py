"""CloudHandoff: every held frame leaves once, released into the log or reclaimed, within its bound."""

from __future__ import annotations

import asyncio
import math

import pytest

from gateway.camera.handoff import CloudHandoff, HeldFrame


def held(seq: int) -> HeldFrame:
    return HeldFrame(frame=seq, body={"seq": seq})


async def test_held_frames_leave_once_released_or_reclaimed_oldest_first():
    wakes: list[int] = []
    appended: list[int] = []

    async def append(item: HeldFrame) -> None:
        appended.append(item.body["seq"])

    handoff = CloudHandoff(bound=8, on_held=lambda: wakes.append(1))
    for seq in (1, 2, 3):
        await handoff.hold(held(seq), append)
    assert appended == [] and handoff.waiting() == 3 and len(wakes) == 3  # the uplink is woken each time
    assert await handoff.release(append) == 3 and appended == [1, 2, 3]
    await handoff.hold(held(4), append)
    await handoff.hold(held(5), append)
    assert [h.frame for h in await handoff.reclaim()] == [4, 5]
    assert await handoff.release(append) == 0 and appended == [1, 2, 3]  # reclaimed: never appended
    assert handoff.counters == {
        "held": 5,
        "released": 3,
        "reclaimed": 2,
        "overdue": 0,
        "overflow_released": 0,
    }


async def test_a_frame_past_its_deadline_is_taken_back_the_others_stay():
    appended: list[int] = []

    async def append(item: HeldFrame) -> None:
        appended.append(item.body["seq"])

    handoff = CloudHandoff(bound=8, on_held=lambda: None)
    assert handoff.next_deadline() == math.inf
    for seq, deadline in ((1, 10.0), (2, 5.0), (3, math.inf)):
        await handoff.hold(HeldFrame(frame=seq, body={"seq": seq}, deadline=deadline), append)
    assert handoff.next_deadline() == 5.0
    assert await handoff.take_overdue(4.9) == []
    assert [h.frame for h in await handoff.take_overdue(10.0)] == [1, 2]
    assert handoff.next_deadline() == math.inf and handoff.counters["overdue"] == 2
    assert await handoff.release(append) == 1 and appended == [3]  # taken back: never appended


async def test_at_the_bound_the_oldest_goes_into_the_log():
    appended: list[int] = []

    async def append(item: HeldFrame) -> None:
        appended.append(item.body["seq"])

    handoff = CloudHandoff(bound=2, on_held=lambda: None)
    for seq in range(1, 5):
        await handoff.hold(held(seq), append)
    assert appended == [1, 2] and handoff.waiting() == 2
    assert handoff.counters["overflow_released"] == 2


async def test_a_release_and_a_reclaim_never_share_a_frame():
    """The uplink's release awaits each append (the log's); a reclaim meanwhile gets only what the
    release has not taken."""
    appended: list[int] = []
    gate = asyncio.Event()

    async def slow_append(item: HeldFrame) -> None:
        await gate.wait()
        appended.append(item.body["seq"])

    handoff = CloudHandoff(bound=8, on_held=lambda: None)
    for seq in (1, 2):
        await handoff.hold(held(seq), slow_append)
    releasing = asyncio.create_task(handoff.release(slow_append))
    await asyncio.sleep(0)
    reclaiming = asyncio.create_task(handoff.reclaim())
    gate.set()
    assert await releasing == 2
    assert await reclaiming == [] and appended == [1, 2]


def test_the_bound_is_positive():
    with pytest.raises(ValueError):
        CloudHandoff(bound=0, on_held=lambda: None)
