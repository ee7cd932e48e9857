"""The epoch log's writer thread: puts closed epochs on disk and says when they are durable.

Owns: the open segment files (their descriptors and next write offset) and the write pipeline.
Each round writes, in parallel and in any order, (a) the commit record of the previous group, whose
data the previous round made durable, and (b) the data of the next group of closed epochs, split
into up to ``writer_threads`` regions at pre-assigned offsets; then it fsyncs the files it touched.

Invariant: a commit record is written only after the data it covers and every earlier commit record
are durable (one fsync round earlier), so commits become durable in epoch order and a durable
commit vouches for every byte before it. An fsync error is final: the thread reports it and stops;
it never retries the fsync (the kernel may already have dropped the dirty pages). ENOSPC on a
write is not final: the round is retried (same bytes, same offsets) until space is freed.
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gateway.storage.filelayer import FileLayer
from gateway.storage.log_format import SegmentHeader, encode_commit
from gateway.storage.recovery import Position

PARALLEL_MIN_BYTES = 1 << 20
MAX_GROUP_BYTES = 16 << 20
ENOSPC_RETRY_S = (0.01, 0.5)


@dataclass
class ClosedEpoch:
    number: int
    first_lsn: int
    last_lsn: int
    segment: SegmentHeader
    path: str
    chunks: list[bytes]  # crc, rest-of-header, payload for each record
    nbytes: int
    chain: int  # CRC of its last record


@dataclass
class DurableGroup:
    """Reported to the log when a group's commit record is durable."""

    seq: int
    end: Position  # just after the commit record
    last_lsn: int
    nbytes: int  # bytes of its records (header + payload), for the log's buffer accounting
    file_bytes: int  # bytes it took in the segment, commit included


@dataclass
class _Group:
    epochs: list[ClosedEpoch]
    fd: int = -1
    commit: bytes = b""
    commit_offset: int = 0
    nbytes: int = 0
    writes: list[tuple[int, bytes, int]] = field(default_factory=list)


class EpochWriter:
    def __init__(self, layer: FileLayer, directory: str, writer_threads: int,
                 on_durable: Callable[[DurableGroup], None], on_failed: Callable[[BaseException], None],
                 on_disk_full: Callable[[], None]) -> None:
        self._layer = layer
        self._directory = directory
        self._on_durable, self._on_failed, self._on_disk_full = on_durable, on_failed, on_disk_full
        self._queue: deque[ClosedEpoch] = deque()  # bounded by the log's buffer_bytes
        self._cond = threading.Condition()
        self._stopping = False
        self._files: dict[int, list[int]] = {}  # segment seq -> [fd, next offset]
        self._pool = ThreadPoolExecutor(max(1, writer_threads), thread_name_prefix="epochlog-region")
        self._regions = max(1, writer_threads)
        self._thread = threading.Thread(target=self._run, name="epochlog-writer", daemon=True)
        self.rounds = 0
        self.fsyncs = 0

    def start(self) -> None:
        self._thread.start()

    def submit(self, epoch: ClosedEpoch) -> None:
        with self._cond:
            self._queue.append(epoch)
            self._cond.notify()

    def stop(self, timeout: float) -> bool:
        """Finish what was submitted (unless failed), close files; False if the thread did not end."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        alive = self._thread.is_alive()
        if not alive:
            self._pool.shutdown(wait=True)
        return not alive

    def _take(self, block: bool) -> _Group | None:
        with self._cond:
            while block and not self._queue and not self._stopping:
                self._cond.wait(1.0)
            if not self._queue:
                return None
            first = self._queue.popleft()
            epochs, size = [first], first.nbytes
            while self._queue and self._queue[0].segment.seq == first.segment.seq and size < MAX_GROUP_BYTES:
                epochs.append(self._queue.popleft())
                size += epochs[-1].nbytes
            return _Group(epochs, nbytes=size)

    def _run(self) -> None:
        previous: _Group | None = None
        try:
            while True:
                group = self._take(block=previous is None)
                if group is None and previous is None:
                    if self._stopping:
                        break
                    continue
                self._round(previous, group)
                if previous is not None:
                    self._report(previous)
                previous = group
        except _Fatal as fatal:
            self._on_failed(fatal.cause)
        finally:
            for fd, _ in self._files.values():
                try:
                    self._layer.close(fd)
                except OSError:
                    pass
            self._files.clear()

    def _round(self, previous: _Group | None, group: _Group | None) -> None:
        commit: list[tuple[int, bytes, int]] = []
        sync: list[int] = []
        if previous is not None:
            commit.append((previous.fd, previous.commit, previous.commit_offset))
            sync.append(previous.fd)
        delay = ENOSPC_RETRY_S[0]
        while True:
            try:
                if group is not None and group.fd < 0:
                    self._lay_out(group)  # may create the segment: ENOSPC is possible here too
                self._write_all(commit + (group.writes if group is not None else []))
                break
            except OSError as exc:
                if exc.errno != errno.ENOSPC or (self._stopping and delay >= ENOSPC_RETRY_S[1]):
                    raise _Fatal(exc) from exc
                self._on_disk_full()
                with self._cond:
                    self._cond.wait(delay)
                delay = min(delay * 2, ENOSPC_RETRY_S[1])
        if group is not None and group.fd not in sync:
            sync.append(group.fd)
        for fd in sync:
            try:
                self._layer.fsync(fd)
            except OSError as exc:
                raise _Fatal(exc) from exc
            self.fsyncs += 1
        self.rounds += 1
        if group is not None:
            self._release(group.epochs[0].segment.seq)

    def _lay_out(self, group: _Group) -> None:
        """Pre-assign offsets: the group's data, split into regions at record boundaries, then its commit."""
        first = group.epochs[0]
        fd, offset = self._segment(first.segment, first.path)
        chunks = [c for epoch in group.epochs for c in epoch.chunks]
        regions = self._regions if group.nbytes >= PARALLEL_MIN_BYTES else 1
        target = group.nbytes / regions
        start, size, region_start = 0, 0, offset
        for i in range(0, len(chunks), 3):
            size += len(chunks[i]) + len(chunks[i + 1]) + len(chunks[i + 2])
            if size >= target and i + 3 < len(chunks):
                data = b"".join(chunks[start:i + 3])
                group.writes.append((fd, data, region_start))
                region_start += len(data)
                start, size = i + 3, 0
        data = b"".join(chunks[start:])
        group.writes.append((fd, data, region_start))
        commit_offset = region_start + len(data)
        last = group.epochs[-1]
        counts = [(e.number, e.last_lsn - e.first_lsn + 1) for e in group.epochs]
        group.commit = encode_commit(first.segment.salt, last.chain, counts, last.last_lsn)
        group.fd, group.commit_offset = fd, commit_offset
        self._files[first.segment.seq][1] = commit_offset + len(group.commit)

    def _segment(self, header: SegmentHeader, path: str) -> tuple[int, int]:
        entry = self._files.get(header.seq)
        if entry is None:
            fd = self._layer.open(path, create=True)
            try:
                block = header.encode()
                self._pwrite_all(fd, block, 0)
                self._layer.fsync(fd)
                self._layer.fsync_dir(self._directory)  # the new file's name must survive too
            except OSError as exc:
                self._layer.close(fd)
                if exc.errno == errno.ENOSPC:
                    raise
                raise _Fatal(exc) from exc
            entry = self._files[header.seq] = [fd, len(block)]
        return entry[0], entry[1]

    def _release(self, current_seq: int) -> None:
        """Close segments older than the one before ``current_seq``: no commit will go there again."""
        for seq in [s for s in self._files if s < current_seq - 1]:
            self._layer.close(self._files.pop(seq)[0])

    def _write_all(self, writes: list[tuple[int, bytes, int]]) -> None:
        if len(writes) > 1 and sum(len(w[1]) for w in writes) >= PARALLEL_MIN_BYTES:
            futures = [self._pool.submit(self._pwrite_all, fd, data, off) for fd, data, off in writes]
            errors = [f.exception() for f in futures]
            for error in errors:
                if error is not None:
                    raise error
        else:
            for fd, data, off in writes:
                self._pwrite_all(fd, data, off)

    def _pwrite_all(self, fd: int, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = self._layer.pwrite(fd, view, offset)
            if written <= 0:
                raise OSError(errno.EIO, "pwrite wrote nothing")
            view, offset = view[written:], offset + written

    def _report(self, group: _Group) -> None:
        last = group.epochs[-1]
        end = group.commit_offset + len(group.commit)
        file_bytes = end - group.writes[0][2]
        position = Position(end, last.chain, last.last_lsn + 1, last.number)
        self._on_durable(DurableGroup(last.segment.seq, position, last.last_lsn, group.nbytes, file_bytes))


class _Fatal(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause

