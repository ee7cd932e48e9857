"""What the log refuses, and how it fails: a record it could never return is refused before anything
is written or dropped; a trim persists or raises; a failed fsync of any file is fatal, never retried
(docs/storage.md, "Guarantee")."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from gateway.storage.epoch_log import EpochLog
from gateway.storage.filelayer import FaultyFileLayer, OsFileLayer
from gateway.storage.interface import LogFailed, LogFull, RecordTooLarge, TrimFailed
from gateway.storage.log_format import MAX_RECORD_BYTES
from tests.storage.storagetest_damage import filled_log, first_lsn, segments, small_log


def sizes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir())}


async def test_a_record_over_the_readable_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    log = EpochLog(tmp_path, segment_bytes=32 << 20, max_bytes=64 << 20)
    await log.open()
    try:
        await log.append(b"before")
        await log.flush(wait=True)
        on_disk = sizes(tmp_path)
        with pytest.raises(RecordTooLarge, match=f"limit of {MAX_RECORD_BYTES}"):
            await log.append(bytes(MAX_RECORD_BYTES + 1))
        await log.flush(wait=True)
        assert sizes(tmp_path) == on_disk and log.stats()["rejected_records"] == 1
        assert await log.append(b"after") == 2
        await log.flush(wait=True)
        assert [r async for r in log.read(1)] == [(1, b"before"), (2, b"after")]
    finally:
        await log.close()


async def test_drop_oldest_drops_nothing_for_a_record_that_cannot_fit(tmp_path: Path) -> None:
    log = EpochLog(tmp_path, segment_bytes=4096, max_bytes=8192, full_policy="drop_oldest")
    await log.open()
    try:
        for index in range(40):
            await log.append(b"r%03d" % index)
            await log.flush(wait=True)
        with pytest.raises(LogFull):
            await log.append(bytes(9000))  # more than the whole budget
        stats = log.stats()
        assert stats["dropped_records"] == 0 and stats["dropped_segments"] == 0 and log.trimmed_lsn == 0
        assert [lsn for lsn, _ in [r async for r in log.read(1)]] == list(range(1, 41))
    finally:
        await log.close()


class MetaOnFullDisk(OsFileLayer):
    """Real files; while ``full``, writes to META's temporary file go to /dev/full, so the error the
    trim sees is the kernel's own answer on a full device (ENOSPC)."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False
        self._paths: dict[int, str] = {}
        self._dev_full = os.open("/dev/full", os.O_WRONLY)

    def open(self, path: str, create: bool = False) -> int:
        fd = super().open(path, create)
        self._paths[fd] = path
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        full = self.full and self._paths.get(fd, "").endswith("META.tmp")
        return super().pwrite(self._dev_full if full else fd, data, offset)

    def release(self) -> None:
        os.close(self._dev_full)


async def test_a_trim_that_cannot_be_persisted_raises_and_the_log_says_what_is_durable(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "log"
    layer = MetaOnFullDisk()
    try:
        log = await filled_log(directory, 80, file_layer=layer)
        third = first_lsn(segments(directory)[2])
        layer.full = True
        with pytest.raises(TrimFailed, match="not persisted"):
            await log.trim(third + 3)  # frees two segments; the trim point itself cannot be written
        assert log.trimmed_lsn == third - 1  # what the deleted segments make durable, not more
        assert log.stats()["trim_persist_failures"] == 1
        await log.close()  # as good as a crash for the trim point: close does not write it
        log = small_log(directory)
        await log.open()
        assert log.trimmed_lsn == third - 1
        assert [r async for r in log.read(1)][0][0] == third
        await log.trim(third + 3)  # the disk has room again: the trim persists
        await log.close()
        log = small_log(directory)
        await log.open()
        assert log.trimmed_lsn == third + 3
        await log.close()
    finally:
        layer.release()


async def test_a_failed_fsync_of_a_new_segment_header_is_fatal_whatever_its_errno(tmp_path: Path) -> None:
    layer = FaultyFileLayer(fsync_errno=errno.ENOSPC)  # not a full disk here: an fsync that failed
    log = EpochLog(tmp_path, segment_bytes=4096, max_bytes=1 << 20, file_layer=layer)
    await log.open()
    layer.fail_fsync_matching = "seg-"
    layer.fail_fsync_from = layer.fsyncs + 1
    await log.append(b"x")
    async with asyncio.timeout(10):
        with pytest.raises(LogFailed):
            await log.flush(wait=True)
    fsyncs = layer.fsyncs
    await log.close()  # its writer has stopped: every fsync it would ever make is counted
    assert layer.fsyncs == fsyncs, "a failed fsync was retried"
    assert log.stats()["failed"] == 1


async def test_a_failed_fsync_of_meta_is_fatal(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    log = await filled_log(tmp_path / "log", 40, file_layer=layer)
    try:
        layer.fail_fsync_matching = "META"
        layer.fail_fsync_from = layer.fsyncs + 1
        with pytest.raises(LogFailed):
            await log.trim(20)
        assert log.stats()["failed"] == 1
        with pytest.raises(LogFailed):
            await log.append(b"more")
    finally:
        await log.close()


async def test_a_failed_fsync_of_the_drop_ledger_is_fatal(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    layer.fail_fsync_matching = "DROPS"
    layer.fail_fsync_from = 1
    log = EpochLog(tmp_path, segment_bytes=4096, max_bytes=8192, full_policy="drop_oldest", file_layer=layer)
    await log.open()
    try:
        with pytest.raises(LogFailed):
            for index in range(400):  # until the budget is full and a drop writes the ledger
                await log.append(b"r%03d" % index + bytes(60))
                await log.flush(wait=True)
        assert log.stats()["failed"] == 1 and log.stats()["dropped_segments"] == 1
    finally:
        await log.close()
