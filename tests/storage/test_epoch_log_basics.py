"""EpochLog behaviour on real files: the contract, corruption reports, fsync failure, full disk."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import crc32c
import pytest

from gateway.storage.epoch_log import EpochLog
from gateway.storage.filelayer import FaultyFileLayer, OsFileLayer
from gateway.storage.interface import LogFailed, LogFull
from gateway.storage.log_format import RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES
from gateway.storage.recovery import recover_all
from tests.harness.poll import eventually
from tests.storage.storagetest_workload import check_prefix, payload


async def _fill(log: EpochLog, epochs: int, size: int = 5) -> None:
    for _ in range(epochs):
        for index in range(size):
            await log.append(payload(log.stats()["next_lsn"], 7, size, index))
        await log.flush()
    await log.flush(wait=True)


async def test_append_flush_read_trim_reopen(tmp_path: Path) -> None:
    log = EpochLog(tmp_path, segment_bytes=8192, max_bytes=1 << 20)
    await log.open()
    await _fill(log, 40)
    assert log.durable_lsn == 200
    records = [r async for r in log.read(1)]
    assert [lsn for lsn, _ in records] == list(range(1, 201)) and check_prefix(records) is None
    await log.trim(100)
    assert log.stats()["segments"] > 1
    await log.close()
    again = EpochLog(tmp_path, segment_bytes=8192, max_bytes=1 << 20)
    await again.open()
    assert (again.durable_lsn, again.trimmed_lsn, again.log_id) == (200, 100, log.log_id)
    assert [lsn for lsn, _ in [r async for r in again.read(1)]] == list(range(101, 201))
    assert await again.append(b"next") == 201
    await again.close()


async def test_byte_flip_in_committed_record_is_reported_with_offset(tmp_path: Path) -> None:
    log = EpochLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20)
    await log.open()
    await _fill(log, 10)
    await log.close()
    segment = next(tmp_path.glob("seg-*.log"))
    data = bytearray(segment.read_bytes())
    record_3 = SEGMENT_HEADER_BYTES + sum(RECORD_HEADER_BYTES + len(payload(lsn, 7, 5, 0)) for lsn in (1, 2))
    where = record_3 + RECORD_HEADER_BYTES + 5  # a payload byte of lsn 3, in the first epoch
    data[where] ^= 0x40
    segment.write_bytes(bytes(data))
    full = recover_all(OsFileLayer(), str(tmp_path))
    assert full.damage is not None and full.damage.kind == "corrupt"
    assert full.damage.offset == record_3 and full.last_lsn == 0
    reopened = EpochLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20)
    await reopened.open()
    assert [d.offset for d in reopened.recovery.damage] == [record_3] and reopened.stats()["corruptions"] == 1
    assert reopened.durable_lsn == 0 and list(tmp_path.glob("*.corrupt-*"))
    await reopened.close()


async def test_torn_tail_is_cut_silently(tmp_path: Path) -> None:
    log = EpochLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20)
    await log.open()
    await _fill(log, 4)
    await log.close()
    segment = next(tmp_path.glob("seg-*.log"))
    size = segment.stat().st_size
    with open(segment, "r+b") as f:  # a crash in the middle of a further epoch: header and half a record
        f.seek(size)
        f.write(b"\x45\x46\x64\x31" * 9)
    reopened = EpochLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20)
    await reopened.open()
    assert reopened.recovery.damage == [] and reopened.recovery.cut_bytes == 36
    assert reopened.durable_lsn == 20
    await reopened.close()


async def test_fsync_error_is_fatal_and_not_retried(tmp_path: Path) -> None:
    layer = FaultyFileLayer(fail_fsync_from=5)
    log = EpochLog(tmp_path, segment_bytes=1 << 20, max_bytes=4 << 20, file_layer=layer)
    await log.open()
    with pytest.raises(LogFailed):
        for _ in range(20):
            await _fill(log, 1)
    fsyncs = layer.fsyncs
    with pytest.raises(LogFailed):
        await log.append(b"more")
    assert log.stats()["failed"] == 1
    await log.close()  # its writer has stopped: every fsync it would ever make is counted
    assert layer.fsyncs == fsyncs, "a failed fsync was retried"


@pytest.mark.parametrize("policy", ["reject", "drop_oldest"])
async def test_byte_budget_policy(tmp_path: Path, policy: str) -> None:
    log = EpochLog(tmp_path, segment_bytes=16 * 1024, max_bytes=64 * 1024, full_policy=policy)  # type: ignore[arg-type]
    await log.open()
    rejected = 0
    for _ in range(200):
        try:
            await _fill(log, 1)
        except LogFull:
            rejected += 1
    stats = log.stats()
    assert stats["bytes_used"] <= 64 * 1024
    if policy == "reject":
        assert rejected > 0 and stats["rejected_records"] >= rejected and stats["dropped_records"] == 0
    else:
        assert rejected == 0 and stats["dropped_records"] > 0 and log.trimmed_lsn > 0
        records = [r async for r in log.read(0)]
        assert records[-1][0] == log.durable_lsn and check_prefix(records) is None
    await log.append(b"still running")
    await log.close()


async def test_enospc_injected_policy_holds_and_log_recovers(tmp_path: Path) -> None:
    layer = FaultyFileLayer(write_quota=40 * 1024)
    log = EpochLog(tmp_path, segment_bytes=8 * 1024, max_bytes=1 << 20, file_layer=layer)
    await log.open()

    async def refused() -> bool:
        try:
            await _fill_no_wait(log)
        except LogFull:
            return True
        return False

    await eventually(refused, 10, "an append refused with LogFull once the quota is used", interval_s=0.005)
    assert layer.enospc > 0 and log.stats()["disk_full_events"] > 0
    layer.free(1 << 20)
    epoch = await log.flush()
    await asyncio.wait_for(epoch, 10)
    assert log.stats()["failed"] == 0
    await log.close()


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return result.returncode == 0


@pytest.mark.parametrize("policy", ["reject", "drop_oldest"])
async def test_real_full_tmpfs(tmp_path: Path, policy: str) -> None:
    mount = tmp_path / "small"
    if not _mount_tmpfs(mount, "2m"):
        pytest.skip("cannot mount a tmpfs here; ENOSPC is covered by the injected test")
    try:
        # the budget is larger than the disk on purpose: the disk fills first, for real
        log = EpochLog(
            mount / "log",
            segment_bytes=128 * 1024,
            max_bytes=64 << 20,  # type: ignore[arg-type]
            full_policy=policy,
            append_timeout_s=2.0,
            close_timeout_s=5.0,
        )
        await log.open()
        rejected = 0

        async def write_until_full() -> dict:
            nonlocal rejected
            try:
                for index in range(20):
                    await log.append(payload(log.stats()["next_lsn"], 7, 20, index))
            except LogFull:
                rejected += 1
            await log.flush()
            return log.stats()

        def full_and_handled(stats: dict) -> bool:
            handled = rejected > 0 if policy == "reject" else stats["dropped_records"] > 0
            return stats["disk_full_events"] > 0 and handled

        what = f"the disk full and the {policy} policy applied"
        stats = await eventually(write_until_full, 30, what, check=full_and_handled, interval_s=0.002)
        assert stats["failed"] == 0
        await log.trim(log.durable_lsn)  # the uplink catches up: space comes back
        await asyncio.wait_for(log.flush(wait=True), 10)
        await asyncio.wait_for(_fill(log, 1), 10)
        records = [r async for r in log.read(0)]
        assert records and records[-1][0] == log.durable_lsn
        await log.close()
        assert recover_all(OsFileLayer(), str(mount / "log")).damage is None
    finally:
        subprocess.run(["umount", str(mount)], check=False)


class KernelFullDisk(OsFileLayer):
    """Real files, but while ``full`` every write goes to /dev/full: the error the log sees is the
    kernel's own answer to a write on a full device, not one a test made up."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False
        self.refused = 0
        self._dev_full = os.open("/dev/full", os.O_WRONLY)

    def _target(self, fd: int) -> int:
        if not self.full:
            return fd
        self.refused += 1
        return self._dev_full

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return super().pwrite(self._target(fd), data, offset)

    def pwritev(self, fd: int, buffers: list[bytes], offset: int) -> int:
        return super().pwritev(self._target(fd), buffers, offset)

    def release(self) -> None:
        os.close(self._dev_full)


async def test_the_kernels_full_disk_error_is_disk_full_not_a_failure(tmp_path: Path) -> None:
    """What a full disk raises for real (ENOSPC from the kernel) stops intake with LogFull and is
    counted as disk full; the log does not fail, and once writes succeed again the epochs held back
    become durable."""
    layer = KernelFullDisk()
    log = EpochLog(tmp_path, segment_bytes=8 * 1024, max_bytes=1 << 20, file_layer=layer)
    await log.open()
    try:
        await _fill(log, 2)
        layer.full = True

        async def refused() -> bool:
            try:
                await _fill_no_wait(log)
            except LogFull:
                return True
            return False

        await eventually(refused, 10, "an append refused with LogFull", interval_s=0.005)
        assert layer.refused > 0 and log.stats()["disk_full_events"] >= 1 and log.stats()["failed"] == 0
        layer.full = False
        await asyncio.wait_for(log.flush(wait=True), 10)
        assert log.stats()["failed"] == 0 and log.durable_lsn == log.stats()["next_lsn"] - 1
        records = [r async for r in log.read(1)]
        assert records[-1][0] == log.durable_lsn and check_prefix(records) is None
        await log.close()
    finally:
        layer.release()


async def _fill_no_wait(log: EpochLog, size: int = 5) -> None:
    """One epoch of ``size`` records, flushed without waiting for it to be durable."""
    for index in range(size):
        await log.append(payload(log.stats()["next_lsn"], 7, size, index))
    await log.flush()


async def test_long_reads_from_any_start_resume_between_chunks(tmp_path: Path) -> None:
    """Reads longer than one chunk (1024 records) carry on where the last chunk stopped, within a
    segment and across segments, from any start, before and after a reopen (index from recovery)."""
    log = EpochLog(tmp_path, segment_bytes=256 << 10, max_bytes=64 << 20)
    await log.open()
    await _fill(log, 300, size=20)  # 6000 records of ~100 bytes: several segments, many index points
    assert log.stats()["segments"] > 2

    async def lsns(from_lsn: int, count: int) -> list[int]:
        out = []
        async for lsn, _ in log.read(from_lsn):
            out.append(lsn)
            if len(out) == count:
                break
        return out

    for start in (1, 777, 1023, 1025, 2999, 5000):
        assert await lsns(start, 2500) == list(range(start, min(6001, start + 2500)))
    records = [r async for r in log.read(1)]
    assert [lsn for lsn, _ in records] == list(range(1, 6001)) and check_prefix(records) is None
    await log.close()
    log = EpochLog(tmp_path, segment_bytes=256 << 10, max_bytes=64 << 20)
    await log.open()
    assert await lsns(1234, 4000) == list(range(1234, 5234))
    await log.close()


async def test_a_meta_from_before_the_lsn_marks_is_read(tmp_path: Path) -> None:
    """META used to hold the log id and the trim point only: such a log opens with both, and goes on."""
    log = EpochLog(tmp_path, segment_bytes=8192, max_bytes=1 << 20)
    await log.open()
    await _fill(log, 4)
    await log.trim(10)
    await log.close()
    body = f"{log.log_id} 10".encode()
    (tmp_path / "META").write_bytes(body + b" " + f"{crc32c.crc32c(body):08x}".encode())
    again = EpochLog(tmp_path, segment_bytes=8192, max_bytes=1 << 20)
    await again.open()
    try:
        assert (again.log_id, again.trimmed_lsn, again.durable_lsn) == (log.log_id, 10, 20)
        assert await again.append(b"next") == 21
    finally:
        await again.close()
