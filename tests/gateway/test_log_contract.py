"""The RecordLog contract (gateway/storage/interface.py), checked against every implementation.

Add an implementation by adding a factory to LOG_FACTORIES: ``factory(directory, max_bytes)``.
Crash damage is cut back to a whole epoch, so the damage tests close one epoch per record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.storage.epoch_log import EpochLog
from gateway.storage.interface import LogFull, RecordLog, RecordTooLarge

LogFactory = Callable[[Path, int], RecordLog]

LOG_FACTORIES: dict[str, LogFactory] = {
    "epoch": lambda directory, max_bytes: EpochLog(directory, segment_bytes=4096, max_bytes=max_bytes),
}


@pytest.fixture(params=sorted(LOG_FACTORIES))
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., RecordLog]:
    factory = LOG_FACTORIES[request.param]

    def make(max_bytes: int = 1 << 30) -> RecordLog:
        return factory(tmp_path / "log", max_bytes)

    return make


async def read_all(log: RecordLog, from_lsn: int = 1) -> list[tuple[int, bytes]]:
    return [entry async for entry in log.read(from_lsn)]


def record(i: int) -> bytes:
    return b'{"i":%d,"pad":"%s"}' % (i, b"x" * (i % 50))


async def test_lsns_increase_and_durable_follows_epochs(make_log):
    log = make_log()
    await log.open()
    lsns = [await log.append(record(i)) for i in range(5)]
    assert lsns == [1, 2, 3, 4, 5]
    assert log.durable_lsn == 0
    assert await read_all(log) == []  # nothing is readable before it is durable
    first = await log.flush()
    assert first.last_lsn == 5
    await log.append(record(5))
    second = await log.flush()
    await asyncio.wait_for(second, 10)
    assert first.durable.done()  # epochs become durable in order
    assert log.durable_lsn == 6
    await log.close()


async def test_read_returns_records_in_order_from_any_lsn(make_log):
    log = make_log()
    await log.open()
    for i in range(300):  # spans several 4 KiB segments
        await log.append(record(i))
        if i % 37 == 0:
            await log.flush()
    await log.flush(wait=True)
    everything = await read_all(log)
    assert [lsn for lsn, _ in everything] == list(range(1, 301))
    assert [data for _, data in everything] == [record(i) for i in range(300)]
    assert [lsn for lsn, _ in await read_all(log, 250)] == list(range(250, 301))
    # reading on where a partial read stopped
    partial = []
    async for lsn, _ in log.read(100):
        partial.append(lsn)
        if len(partial) == 10:
            break
    assert [lsn for lsn, _ in await read_all(log, 110)][:3] == [110, 111, 112]
    await log.close()


async def test_trim_survives_reopen_and_lsns_continue(make_log):
    log = make_log()
    await log.open()
    log_id = log.log_id
    for i in range(200):
        await log.append(record(i))
    await log.flush(wait=True)
    await log.trim(150)
    assert log.trimmed_lsn == 150
    assert [lsn for lsn, _ in await read_all(log)] == list(range(151, 201))
    await log.close()

    log = make_log()
    await log.open()
    assert log.log_id == log_id
    assert log.trimmed_lsn == 150
    assert log.durable_lsn == 200
    assert [lsn for lsn, _ in await read_all(log, 1)] == list(range(151, 201))
    assert await log.append(b'{"after":"reopen"}') == 201
    await log.flush(wait=True)
    await log.close()


async def test_lsns_are_not_reused_after_everything_is_trimmed(make_log):
    log = make_log()
    await log.open()
    for i in range(50):
        await log.append(record(i))
    await log.flush(wait=True)
    await log.trim(50)
    await log.close()
    log = make_log()
    await log.open()
    assert await log.append(record(0)) == 51
    await log.flush(wait=True)
    assert [lsn for lsn, _ in await read_all(log)] == [51]
    await log.close()


async def test_unflushed_records_are_gone_after_reopen(make_log):
    log = make_log()
    await log.open()
    for i in range(10):
        await log.append(record(i))
    await log.flush(wait=True)
    for i in range(10, 15):
        await log.append(record(i))
    # a crash: the object is abandoned without flush or close
    log = make_log()
    await log.open()
    assert log.durable_lsn == 10
    assert await log.append(record(99)) == 11
    await log.close()


async def test_torn_tail_is_cut_back(make_log, tmp_path):
    log = make_log()
    await log.open()
    for i in range(20):
        await log.append(record(i))
        await log.flush(wait=True)
    await log.close()
    segments = sorted((tmp_path / "log").glob("seg-*"))
    last = segments[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-7])  # a crash in the middle of the last epoch

    log = make_log()
    await log.open()
    assert log.durable_lsn == 19
    assert [lsn for lsn, _ in await read_all(log)] == list(range(1, 20))
    assert await log.append(record(19)) == 20
    await log.flush(wait=True)
    assert [data for _, data in await read_all(log, 20)] == [record(19)]
    await log.close()


async def test_bad_crc_tail_is_cut_back(make_log, tmp_path):
    log = make_log()
    await log.open()
    for i in range(5):
        await log.append(record(i))
        await log.flush(wait=True)
    await log.close()
    last = sorted((tmp_path / "log").glob("seg-*"))[-1]
    data = bytearray(last.read_bytes())
    data[-2] ^= 0xFF
    last.write_bytes(bytes(data))
    log = make_log()
    await log.open()
    assert log.durable_lsn == 4
    await log.close()


async def test_full_log_rejects_and_counts(make_log):
    log = make_log(max_bytes=64 * 1024)
    await log.open()
    big = b'{"pad":"%s"}' % (b"y" * 1000)
    with pytest.raises(LogFull):
        for _ in range(100):
            await log.append(big)
            await log.flush()
    assert log.stats()["rejected_records"] == 1
    accepted = (await log.flush(wait=True)).last_lsn
    # trimming what the cloud acknowledged makes room again
    await log.trim(accepted)
    await log.append(big)
    await log.flush(wait=True)
    await log.close()


async def test_a_record_no_budget_could_hold_is_refused_and_nothing_changes(make_log):
    log = make_log(max_bytes=64 * 1024)
    await log.open()
    await log.append(record(0))
    await log.flush(wait=True)
    with pytest.raises(RecordTooLarge):
        await log.append(b"z" * (64 * 1024))
    assert await log.append(record(1)) == 2
    await log.flush(wait=True)
    assert await read_all(log) == [(1, record(0)), (2, record(1))]
    await log.close()


async def test_verify_reads_every_record_and_finds_no_damage_in_a_sound_log(make_log):
    log = make_log()
    await log.open()
    for i in range(300):
        await log.append(record(i))
        if i % 37 == 0:
            await log.flush()
    await log.flush(wait=True)
    await log.trim(100)
    report = await log.verify()
    assert report.records >= 200  # every record not trimmed (and what shares a segment with them)
    assert report.damage == [] and log.damage == []
    await log.close()
