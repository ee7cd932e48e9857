"""SimpleLog: a small append-only segment log behind the RecordLog contract (interface.py).

Format (one place)::

    dir/log_id                  hex id of this log incarnation, written once when the log is created
    dir/trim                    the trimmed LSN as decimal text, replaced atomically (tmp, fsync, rename)
    dir/seg-<first lsn>.log     frame*      frame := len:u32 crc32c:u32 lsn:u64 data[len]

The CRC covers the lsn and data. ``flush`` hands the open epoch's frames to the one writer
thread, which writes and fsyncs them; one thread means epochs become durable in order.

Invariant: every record with LSN <= ``durable_lsn`` was fsynced, and LSNs in the files are
consecutive. Recovery names the damage: a torn or bad frame at the end of the last segment is
what a crash leaves and is cut back silently (counted as ``tail_bytes_cut``); a bad frame in an
earlier segment is corruption: logged, counted, and the segments after it are set aside as
``*.corrupt`` so that what remains is still a prefix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import struct
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import crc32c

from gateway.storage.interface import Epoch, LogFailed, LogFull, Lsn

log = logging.getLogger(__name__)
_HEADER = struct.Struct("<IIQ")
READ_CHUNK_RECORDS = 512


def _frame(lsn: Lsn, data: bytes) -> bytes:
    return _HEADER.pack(len(data), crc32c.crc32c(struct.pack("<Q", lsn) + data), lsn) + data


def _scan(path: Path, first_lsn: Lsn, from_lsn: Lsn, upto_lsn: Lsn, offset: int = 0,
          limit: int | None = None) -> tuple[list[tuple[Lsn, bytes, int]], int, Lsn]:
    """Frames of one segment with from_lsn <= lsn <= upto_lsn.

    Returns ([(lsn, data, offset after the frame)], offset after the last good frame, next lsn).
    """
    out: list[tuple[Lsn, bytes, int]] = []
    expected = first_lsn
    with open(path, "rb") as f:
        f.seek(offset)
        if offset:
            expected = -1  # resuming: trust the frame's lsn
        while limit is None or len(out) < limit:
            head = f.read(_HEADER.size)
            if len(head) < _HEADER.size:
                break
            length, crc, lsn = _HEADER.unpack(head)
            data = f.read(length)
            if len(data) < length or crc32c.crc32c(struct.pack("<Q", lsn) + data) != crc:
                break
            if (expected != -1 and lsn != expected) or lsn > upto_lsn:
                break
            offset += _HEADER.size + length
            expected = lsn + 1
            if lsn >= from_lsn:
                out.append((lsn, data, offset))
    return out, offset, (out[-1][0] + 1 if out else max(expected, from_lsn))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SimpleLog:
    def __init__(self, directory: Path, segment_bytes: int = 64 << 20, max_bytes: int = 1 << 30) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.log_id = ""
        self._segments: list[tuple[Lsn, Path]] = []  # (first lsn, path); guarded by _lock
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simplelog-writer")
        self._active: object | None = None  # the writer thread's open file
        self._active_size = 0
        self._roll_next = False
        self._pending: list[bytes] = []
        self._used_bytes = 0  # on disk, in flight and pending: what the byte budget counts
        self._next_lsn: Lsn = 1
        self._durable_lsn: Lsn = 0
        self._trimmed_lsn: Lsn = 0
        self._epoch = 0
        self._failed: BaseException | None = None
        self._write_failure: OSError | None = None  # set by the writer thread
        self._last_epoch: Epoch | None = None
        self._resume: tuple[Lsn, Path, int] = (0, Path(), 0)  # where the last read stopped
        self._stats = {"appended": 0, "epochs": 0, "fsyncs": 0, "rejected_full": 0,
                       "tail_bytes_cut": 0, "corrupt_segments": 0}

    @property
    def durable_lsn(self) -> Lsn:
        return self._durable_lsn

    @property
    def trimmed_lsn(self) -> Lsn:
        return self._trimmed_lsn

    async def open(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._writer, self._recover)

    def _recover(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        id_file = self.directory / "log_id"
        if not id_file.exists():
            tmp = id_file.with_suffix(".tmp")
            tmp.write_text(secrets.token_hex(16))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, id_file)
            _fsync_dir(self.directory)
        self.log_id = id_file.read_text().strip()
        trim_file = self.directory / "trim"
        self._trimmed_lsn = int(trim_file.read_text()) if trim_file.exists() else 0
        segments = sorted((int(p.stem.split("-")[1]), p) for p in self.directory.glob("seg-*.log"))
        last_lsn = self._trimmed_lsn
        for index, (first, path) in enumerate(segments):
            _, end, next_lsn = _scan(path, first, 0, 2**63)
            size = path.stat().st_size
            if end < size:
                if index == len(segments) - 1:
                    self._stats["tail_bytes_cut"] += size - end  # crash damage: silent
                else:
                    self._stats["corrupt_segments"] += 1
                    log.error(
                        "log %s: %d bad bytes in %s; setting later segments aside", self.directory,
                        size - end, path.name)
                    for _, later in segments[index + 1:]:
                        os.replace(later, later.with_suffix(".corrupt"))
                    segments = segments[:index + 1]
                with open(path, "rb+") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            if end == 0 and first > last_lsn + 1:
                path.unlink()
                continue
            self._segments.append((first, path))
            self._used_bytes += end
            last_lsn = max(last_lsn, next_lsn - 1)
            if end < size:
                break
        self._next_lsn = last_lsn + 1
        self._durable_lsn = last_lsn
        if self._segments:
            first, path = self._segments[-1]
            self._active = open(path, "ab")  # noqa: SIM115 - owned by the writer thread until close
            self._active_size = path.stat().st_size

    async def close(self) -> None:
        if self._pending and self._failed is None:
            await self.flush(wait=True)
        await asyncio.get_running_loop().run_in_executor(self._writer, self._close_active)
        self._writer.shutdown(wait=True)

    def _close_active(self) -> None:
        if self._active is not None:
            self._active.close()  # type: ignore[attr-defined]
            self._active = None

    async def append(self, record: bytes) -> Lsn:
        if self._failed is not None:
            raise LogFailed(str(self._failed))
        frame = _frame(self._next_lsn, record)
        if self._used_bytes + len(frame) > self.max_bytes:
            self._stats["rejected_full"] += 1
            raise LogFull(f"log {self.directory} holds {self._used_bytes} of {self.max_bytes} bytes")
        self._pending.append(frame)
        self._used_bytes += len(frame)
        self._next_lsn += 1
        self._stats["appended"] += 1
        return self._next_lsn - 1

    @property
    def pending_records(self) -> int:
        return len(self._pending)

    async def flush(self, wait: bool = False) -> Epoch:
        loop = asyncio.get_running_loop()
        frames, self._pending = self._pending, []
        self._epoch += 1
        epoch = Epoch(self._epoch, self._next_lsn - 1, loop.create_future())
        self._stats["epochs"] += 1
        if self._failed is not None:
            epoch.durable.set_exception(LogFailed(str(self._failed)))
        else:
            job = loop.run_in_executor(self._writer, self._write, frames, epoch.last_lsn - len(frames) + 1)
            job.add_done_callback(lambda done: self._on_written(done, epoch))
        self._last_epoch = epoch
        if wait:
            await epoch
        return epoch

    def _write(self, frames: list[bytes], first_lsn: Lsn) -> int:
        """Writer thread: write and fsync one epoch; returns the bytes freed by deleting old segments."""
        if self._write_failure is not None:  # never write past a failed fsync: it would leave a gap
            raise LogFailed(f"an earlier write failed: {self._write_failure}")
        if not frames:
            return 0
        try:
            freed = 0
            if self._active is None or self._roll_next or self._active_size >= self.segment_bytes:
                freed = self._roll(first_lsn)
            data = b"".join(frames)
            self._active.write(data)  # type: ignore[attr-defined]
            self._active.flush()  # type: ignore[attr-defined]
            os.fsync(self._active.fileno())  # type: ignore[attr-defined]
        except OSError as exc:
            self._write_failure = exc
            raise
        self._active_size += len(data)
        return freed

    def _roll(self, first_lsn: Lsn) -> int:
        """Writer thread: start a new segment; delete old ones the trim point covers entirely."""
        self._close_active()
        path = self.directory / f"seg-{first_lsn:020d}.log"
        self._active = open(path, "ab")  # noqa: SIM115 - owned by the writer thread until close
        self._active_size = 0
        self._roll_next = False
        _fsync_dir(self.directory)
        with self._lock:
            self._segments.append((first_lsn, path))
        return self._delete_trimmed(self._trimmed_lsn)

    def _on_written(self, done: asyncio.Future[int], epoch: Epoch) -> None:
        if epoch.durable.done():
            return
        exc = done.exception()
        if exc is not None:
            self._failed = self._failed or exc
            epoch.durable.set_exception(LogFailed(f"write/fsync failed: {exc}"))
            return
        self._stats["fsyncs"] += 1 if epoch.last_lsn > self._durable_lsn else 0
        self._used_bytes -= done.result()
        self._durable_lsn = max(self._durable_lsn, epoch.last_lsn)
        epoch.durable.set_result(None)

    async def read(self, from_lsn: Lsn) -> AsyncIterator[tuple[Lsn, bytes]]:
        loop = asyncio.get_running_loop()
        lsn = max(from_lsn, self._trimmed_lsn + 1)
        while lsn <= self._durable_lsn:
            path, chunk = await loop.run_in_executor(None, self._read_chunk, lsn, self._durable_lsn)
            if not chunk:
                return
            for entry_lsn, data, end in chunk:
                self._resume = (entry_lsn + 1, path, end)  # the uplink reads on from here next time
                yield entry_lsn, data
            lsn = chunk[-1][0] + 1

    def _read_chunk(self, lsn: Lsn, upto: Lsn) -> tuple[Path, list[tuple[Lsn, bytes, int]]]:
        with self._lock:
            segments = list(self._segments)
        for index, (first, path) in enumerate(segments):
            next_first = segments[index + 1][0] if index + 1 < len(segments) else 2**63
            if first <= lsn < next_first:
                resume_lsn, resume_path, resume_offset = self._resume
                offset = resume_offset if (resume_lsn, resume_path) == (lsn, path) else 0
                records, _, _ = _scan(path, first, lsn, upto, offset, READ_CHUNK_RECORDS)
                return path, records
        return Path(), []

    async def trim(self, upto_lsn: Lsn) -> None:
        upto_lsn = min(upto_lsn, self._durable_lsn)
        if upto_lsn <= self._trimmed_lsn:
            return
        self._trimmed_lsn = upto_lsn
        freed = await asyncio.get_running_loop().run_in_executor(self._writer, self._persist_trim, upto_lsn)
        self._used_bytes -= freed

    def _persist_trim(self, upto_lsn: Lsn) -> int:
        tmp = self.directory / "trim.tmp"
        with open(tmp, "w") as f:
            f.write(str(upto_lsn))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / "trim")
        _fsync_dir(self.directory)
        if upto_lsn >= self._durable_lsn:
            self._roll_next = True  # the active segment is all trimmed: the next epoch starts a new one
        return self._delete_trimmed(upto_lsn)

    def _delete_trimmed(self, upto_lsn: Lsn) -> int:
        """Writer thread: delete every segment except the last whose records are all <= upto_lsn."""
        freed = 0
        with self._lock:
            keep = []
            for index, (first, path) in enumerate(self._segments):
                next_first = self._segments[index + 1][0] if index + 1 < len(self._segments) else None
                if next_first is not None and next_first - 1 <= upto_lsn:
                    freed += path.stat().st_size
                    path.unlink()
                else:
                    keep.append((first, path))
            self._segments = keep
        return freed

    def stats(self) -> dict[str, int]:
        return {**self._stats, "durable_lsn": self._durable_lsn, "trimmed_lsn": self._trimmed_lsn,
                "next_lsn": self._next_lsn, "bytes": self._used_bytes,
                "max_bytes": self.max_bytes, "pending_records": len(self._pending),
                "segments": len(self._segments)}
