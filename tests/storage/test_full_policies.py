"""The full-log policies beside "reject": "drop_oldest" keeps an exact ledger of what it lost (also
across a crash at any point of a drop) and "hold" makes appends wait for a trim instead of losing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.storage.drops import DropLedger
from gateway.storage.epoch_log import EpochLog

RECORD = b"x" * 200


def small_log(directory: Path, policy: str) -> EpochLog:
    return EpochLog(directory, segment_bytes=4096, max_bytes=8192, full_policy=policy)  # type: ignore[arg-type]


async def test_drop_oldest_counts_only_what_the_cloud_lacks(tmp_path: Path) -> None:
    log = small_log(tmp_path / "log", "drop_oldest")
    await log.open()
    # the uplink's view: every even LSN is acknowledged (a priority drain acks out of order)
    log.set_unacked_view(lambda a, b: [(x, x) for x in range(a, b + 1) if x % 2])
    for _ in range(200):
        await log.append(RECORD)
        await log.flush(wait=True)  # a drop takes only durable segments
    stats, gaps = log.stats(), log.gaps
    assert stats["dropped_segments"] > 0 and log.trimmed_lsn > 0
    assert stats["dropped_records"] == sum(1 for x in range(1, log.trimmed_lsn + 1) if x % 2)
    assert [lsn for lo, hi in gaps for lsn in range(lo, hi + 1)] == list(range(1, log.trimmed_lsn + 1, 2))
    await log.gaps_recorded(gaps[:2])
    await log.close()
    reopened = small_log(tmp_path / "log", "drop_oldest")
    await reopened.open()
    try:
        assert reopened.stats()["dropped_records"] == stats["dropped_records"]
        assert reopened.gaps == gaps[2:]
    finally:
        await reopened.close()


def test_a_crash_between_the_ledger_and_the_trim_undoes_that_drop() -> None:
    ledger = DropLedger()
    ledger.add_drop(100, [(1, 100)])
    ledger.add_drop(200, [(101, 150), (170, 200)])
    decoded = DropLedger.decode(ledger.encode())
    assert decoded == ledger
    decoded.settle(100)  # the log on disk still holds 101..200: the second drop never happened
    assert (decoded.dropped_records, decoded.dropped_segments, decoded.gaps) == (100, 1, [(1, 100)])
    ledger.settle(200)  # it did happen: nothing changes
    assert ledger.dropped_records == 181 and ledger.gaps == [(1, 150), (170, 200)]
    assert DropLedger.decode(b"not json") is None


async def test_hold_waits_for_a_trim_and_loses_nothing(tmp_path: Path) -> None:
    log = small_log(tmp_path / "log", "hold")
    await log.open()
    try:
        appended = 0

        async def fill() -> None:
            nonlocal appended
            while True:
                await log.append(RECORD)
                appended += 1
                await log.flush()

        writer = asyncio.create_task(fill())
        try:
            while log.stats()["holding"] == 0:
                await asyncio.sleep(0.01)
            held_at = appended
            await asyncio.sleep(0.2)
            assert appended == held_at  # nothing appended, nothing dropped, nothing refused
            stats = log.stats()
            assert stats["dropped_records"] == 0 and stats["rejected_records"] == 0
            await log.flush(wait=True)
            await log.trim(log.durable_lsn)  # the uplink caught up
            while appended <= held_at:
                await asyncio.sleep(0.01)
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        assert log.stats()["hold_waits"] >= 1
    finally:
        await log.close()
