"""Damage a crash cannot cause is reported wherever it is reached, never skipped, never taken for a
torn write, and never makes an LSN come round again (docs/storage.md, "Guarantee" and "Damage")."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.storage.epoch_log import EpochLog
from gateway.storage.interface import LogCorrupted, LogFailed
from gateway.storage.log_format import SegmentHeader
from tests.storage.storagetest_damage import (
    filled_log,
    first_lsn,
    flip,
    flip_payload,
    record,
    segments,
    small_log,
)

Where = tuple[str, int, int]  # (segment, byte offset, first LSN not readable)


async def read_until_damage(log: EpochLog, from_lsn: int = 1) -> tuple[list[int], Where | None]:
    """The LSNs one read yields, and where it raised LogCorrupted (None: it ended cleanly)."""
    got: list[int] = []
    try:
        async for lsn, _ in log.read(from_lsn):
            got.append(lsn)
    except LogCorrupted as exc:
        return got, (exc.damage.segment, exc.damage.offset, exc.damage.lsn)
    return got, None


async def reopened(directory: Path) -> EpochLog:
    log = small_log(directory)
    await log.open()
    return log


async def test_every_read_reports_damage_in_an_older_segment(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 80)
    await log.close()
    assert len(segments(directory)) >= 3
    victim = first_lsn(segments(directory)[1]) + 2
    segment, offset = flip_payload(directory, victim)
    log = await reopened(directory)
    try:
        for _ in range(3):  # the first read, and every one after it
            assert await read_until_damage(log) == (list(range(1, victim)), (str(segment), offset, victim))
        assert log.stats()["corruptions"] == 1  # one damaged place, however often it is reached
    finally:
        await log.close()


async def test_damage_in_a_segment_this_process_wrote_is_reported(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 80)
    try:
        victim = first_lsn(segments(directory)[1]) + 5
        segment, offset = flip_payload(directory, victim)  # under the running log
        for _ in range(2):
            assert await read_until_damage(log) == (list(range(1, victim)), (str(segment), offset, victim))
        after = first_lsn(segments(directory)[2])  # a read that starts past the damaged segment
        assert await read_until_damage(log, after) == (list(range(after, 81)), None)
        assert log.stats()["corruptions"] == 1
    finally:
        await log.close()


async def test_a_damaged_header_of_the_newest_segment_is_reported_and_its_lsns_not_reused(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 80)
    await log.close()
    newest = segments(directory)[-1]
    held_from = first_lsn(newest)
    flip(newest, 20)  # the segment number, in the header: its CRC fails
    log = await reopened(directory)
    try:
        assert newest.exists()  # it holds committed records: never deleted
        lsn = await log.append(record(0))
        assert lsn > 80  # 80 was durable: never assigned again
        await log.flush(wait=True)
        assert [d.segment for d in log.damage] == [str(newest)] and log.stats()["corruptions"] == 1
        got, where = await read_until_damage(log)
        assert got == list(range(1, held_from)) and where is not None and where[2] == held_from
    finally:
        await log.close()


async def test_a_damaged_header_of_the_oldest_segment_is_reported_and_not_trimmed_past(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 80)
    await log.close()
    oldest = segments(directory)[0]
    flip(oldest, 30)  # its first LSN, in the header
    for _ in range(2):  # at every open
        log = await reopened(directory)
        try:
            assert log.trimmed_lsn == 0 and log.durable_lsn == 80
            assert await read_until_damage(log) == ([], (str(oldest), 0, 1))
            assert [d.segment for d in log.damage] == [str(oldest)] and log.stats()["corruptions"] == 1
        finally:
            await log.close()


async def test_lsns_past_damaged_committed_data_are_never_reused(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 80)
    await log.close()
    victim = first_lsn(segments(directory)[-1]) + 1  # committed, with valid commits after it
    segment, offset = flip_payload(directory, victim)
    log = await reopened(directory)
    assert log.durable_lsn == victim - 1 and log.stats()["corruptions"] == 1
    await log.close()
    log = await reopened(directory)  # the cut is made: this open sees no damage, and still knows
    try:
        first_new = await log.append(record(0))
        assert first_new > 80
        await log.flush(wait=True)
        got, where = await read_until_damage(log)
        assert got == list(range(1, victim)) and where is not None and where[2] == victim
    finally:
        await log.close()
    log = await reopened(directory)
    try:
        assert await log.append(record(1)) == first_new + 1
    finally:
        await log.close()


async def test_a_segment_removed_at_recovery_leaves_no_false_alarm(tmp_path: Path) -> None:
    """A crash right after a new segment's header was written: recovery removes the segment (nothing
    in it was committed), and the next segment takes its number: no gap, no corruption later."""
    directory = tmp_path / "log"
    log = await filled_log(directory, 10)
    await log.close()
    fresh = directory / "seg-0000000002.log"
    fresh.write_bytes(SegmentHeader(0x1234, 2, 11, 11).encode())
    for _ in range(2):
        log = await reopened(directory)
        try:
            assert log.stats()["corruptions"] == 0
            await log.append(record(log.stats()["next_lsn"]))
            await log.flush(wait=True)
        finally:
            await log.close()
    assert [p.name for p in segments(directory)] == [f"seg-000000000{n}.log" for n in (1, 2, 3)]
    log = await reopened(directory)
    try:
        assert log.stats()["corruptions"] == 0
        assert await read_until_damage(log) == (list(range(1, 13)), None)
    finally:
        await log.close()


async def test_a_damaged_meta_is_reported_not_guessed(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 3)
    await log.close()
    flip(directory / "META", 2)
    log = small_log(directory)
    with pytest.raises(LogFailed, match="META is damaged"):
        await log.open()
    await log.close()
