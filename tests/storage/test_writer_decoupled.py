"""The appender does not wait for the disk: a stalled fsync holds back durability, never intake.

A disk that takes its time over an fsync cannot be produced on demand, so ``StallingFileLayer``
(real files) holds fsyncs at a gate; everything else is the real log. No timing in the assertions:
the test checks what did and did not happen while the gate was closed.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path

from gateway.storage.epoch_log import EpochLog
from gateway.storage.filelayer import OsFileLayer
from gateway.storage.log_format import RECORD_HEADER_BYTES
from gateway.storage.recovery import recover_all
from tests.harness.poll import eventually

BUFFER = 64 * 1024
RECORD = 1024


class StallingFileLayer(OsFileLayer):
    """Once ``armed``, every fsync waits for ``gate`` (at most 30 s, then fails as a disk would)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.gate = threading.Event()
        self.stalled = threading.Event()

    def fsync(self, fd: int) -> None:
        if self.armed:
            self.stalled.set()
            if not self.gate.wait(30):
                raise OSError(errno.EIO, "test gate never opened")
        super().fsync(fd)


def _record(lsn: int) -> bytes:
    return lsn.to_bytes(8, "little") * (RECORD // 8)


async def _epoch(log: EpochLog, nbytes: int) -> int:
    """Append ``nbytes`` worth of buffer (records and their headers) as one epoch; its last LSN."""
    for _ in range(nbytes // (RECORD + RECORD_HEADER_BYTES)):
        await log.append(_record(log.stats()["next_lsn"]))
    return (await log.flush()).last_lsn


async def test_stalled_fsync_does_not_hold_up_appends(tmp_path: Path) -> None:
    layer = StallingFileLayer()
    log = EpochLog(
        tmp_path,
        segment_bytes=1 << 20,
        max_bytes=16 << 20,
        buffer_bytes=BUFFER,
        file_layer=layer,
        append_timeout_s=20.0,
        close_timeout_s=20.0,
    )
    await log.open()
    try:
        await log.append(_record(1))  # warm-up: the segment exists and is durable
        await log.flush(wait=True)
        layer.armed = True
        first = await _epoch(log, BUFFER // 2)
        await eventually(
            lambda: layer.stalled.is_set() and log.stats()["buffered_bytes"] == 0,
            10,
            "the epoch's bytes written and its fsync stuck at the gate",
            interval_s=0.005,
        )
        # its bytes are in the file and their fsync is stuck: buffer space is free, durability is not
        assert log.durable_lsn == 1 and first > 1
        waits = log.stats()["buffer_waits"]
        last = await _epoch(log, BUFFER * 9 // 10)  # 0.9 of the buffer on top of the 0.5 not yet durable
        assert log.stats()["buffer_waits"] == waits, "an append waited for a stalled fsync"
        assert log.durable_lsn == 1
    finally:
        layer.gate.set()
    await asyncio.wait_for(log.flush(wait=True), 20)
    assert log.durable_lsn == last
    records = [r async for r in log.read(1)]
    assert records == [(lsn, _record(lsn)) for lsn in range(1, last + 1)]
    await log.close()
    assert recover_all(OsFileLayer(), str(tmp_path)).last_lsn == last
