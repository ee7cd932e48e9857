"""The epoch log's writer thread: puts closed epochs on disk and says when they are durable.

Owns: the open segment files (their descriptors and next write offset), the write pipeline and
its fsync in flight.
Round r writes the data of group r (the closed epochs queued so far, split into up to
``writer_threads`` regions at pre-assigned offsets, written in parallel and in any order) while the
fsync of round r-1 runs on the sync thread; when that fsync returns, group r-2's commit is durable
(reported) and group r-1's data is durable, so group r-1's commit record is written and the fsync
of round r starts. The writer does no per-record work: an epoch arrives as a list of ready buffers
(header, payload, ...) that go to the kernel in gathered writes (pwritev, GIL released), and the log
is told as soon as a group's bytes are written, so the appender's buffer space never waits for an fsync.

Invariant: a commit record is written only after the data it covers and every earlier commit record
are durable (the fsync that covered them had returned), so commits become durable in epoch order and a
durable commit vouches for every byte before it; a new segment is created only after every commit
before it is durable; no LSN is written before META's LSN limit is above it (``reserve``, meta.py).
An fsync error, of any file and whatever its errno, is final: the thread reports it and stops; it
never retries the fsync (the kernel may already have dropped the dirty pages). ENOSPC on a write is
not final: the write is retried (same bytes, same offsets) until space is freed.
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from gateway.storage.filelayer import FileLayer
from gateway.storage.log_format import SegmentHeader, encode_commit
from gateway.storage.scanner import Position
from runtime.backoff import Backoff

PARALLEL_MIN_BYTES = 1 << 20
IOV_MAX = 1024  # buffers per pwritev (Linux UIO_MAXIOV)
MAX_GROUP_BYTES = 16 << 20
ENOSPC_RETRY_S = (0.01, 0.5)


@dataclass
class ClosedEpoch:
    number: int
    first_lsn: int
    last_lsn: int
    segment: SegmentHeader
    path: str
    chunks: list[bytes]  # header, payload for each record; emptied once written
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
    data_offset: int = 0
    nbytes: int = 0
    writes: list[tuple[int, list[bytes], int]] = field(default_factory=list)  # fd, buffers, offset


@dataclass
class _Sync:
    """An fsync in flight and what it makes durable: ``data``'s records, ``committed``'s commit record."""

    future: Future[None]
    data: _Group | None
    committed: _Group | None


class EpochWriter:
    def __init__(
        self,
        layer: FileLayer,
        directory: str,
        writer_threads: int,
        on_durable: Callable[[DurableGroup], None],
        on_failed: Callable[[BaseException], None],
        on_disk_full: Callable[[], None],
        on_written: Callable[[int], None],
        reserve: Callable[[int], None],
    ) -> None:
        self._layer = layer
        self._directory = directory
        self._on_durable, self._on_failed, self._on_disk_full = on_durable, on_failed, on_disk_full
        self._on_written = on_written
        self._reserve = reserve  # makes META's LSN limit durable above an LSN (meta.py)
        self._queue: deque[ClosedEpoch] = deque()  # bounded by the log's buffer_bytes
        self._cond = threading.Condition()
        self._stopping = False
        self._files: dict[int, list[int]] = {}  # segment seq -> [fd, next offset]
        self._syncing: _Sync | None = None  # the fsync in flight (of the previous round)
        self._pool = ThreadPoolExecutor(max(1, writer_threads), thread_name_prefix="epochlog-region")
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="epochlog-fsync")
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
            self._syncer.shutdown(wait=True)
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
        """Pipeline rounds until stopped with nothing queued and nothing in flight, or until a failure
        (reported through ``on_failed``: the thread never dies silently)."""
        try:
            while True:
                group = self._take(block=self._syncing is None)
                if group is None and self._syncing is None:
                    if self._stopping:
                        break
                    continue  # idle: nothing queued, nothing in flight
                self._round(group)
        except _Fatal as fatal:
            self._on_failed(fatal.cause)
        except Exception as exc:  # a bug here must fail the log loudly, not leave appenders waiting
            self._on_failed(exc)
        finally:
            self._close_files()

    def _round(self, group: _Group | None) -> None:
        """Round r: write group r's data while round r-1's fsync runs on the sync thread; once that fsync
        is done, write group r-1's commit, then start round r's fsync, which covers both."""
        if group is not None:
            self._write_group_data(group)
        to_commit = self._finish_sync()  # its data is durable now: its commit may be written
        if to_commit is not None:
            self._write_commit(to_commit)
        if group is not None or to_commit is not None:
            self._start_sync(data=group, committed=to_commit)

    def _write_group_data(self, group: _Group) -> None:
        """Lay out and write the group's data, then free its buffers."""
        if self._syncing is not None and group.epochs[0].segment.seq not in self._files:
            self._drain()  # a segment appears only once every commit before it is durable
        self._with_enospc_retry(lambda: self._reserve(group.epochs[-1].last_lsn))
        self._with_enospc_retry(lambda: self._write_data(group))
        self._written(group)

    def _finish_sync(self) -> _Group | None:
        """Wait for the fsync in flight, if any, and report the group whose commit it made durable.
        Returns the group whose data it made durable (its commit is not written yet)."""
        syncing = self._syncing
        if syncing is None:
            return None
        self._wait_sync(syncing)
        self._syncing = None  # after the wait: a running fsync is never forgotten (see _close_files)
        if syncing.committed is not None:
            self._report(syncing.committed)  # its commit record is durable now
        return syncing.data

    def _write_commit(self, group: _Group) -> None:
        # The invariant: the fsync that covered this group's data (and every earlier commit) has returned.
        assert self._syncing is None, "a commit record is written only with no fsync in flight"
        commit = [(group.fd, [group.commit], group.commit_offset)]
        self._with_enospc_retry(lambda: self._write_all(commit, 0))

    def _start_sync(self, data: _Group | None, committed: _Group | None) -> None:
        """One fsync per file written this round, on the sync thread; the next round overlaps with it."""
        fds = list(dict.fromkeys(g.fd for g in (committed, data) if g is not None))
        self._syncing = _Sync(self._syncer.submit(self._fsync_all, fds), data, committed)
        self.rounds += 1
        if data is not None:
            self._release(data.epochs[0].segment.seq)  # keeps the two files in use

    def _drain(self) -> None:
        """Finish the pipeline: the fsync in flight, then the last commit and its own fsync. Before a
        segment rotation, so that a durable segment header implies the segments before it are whole
        (recovery and lazy reads treat a gap before a newer segment as corruption)."""
        last = self._finish_sync()
        if last is None:
            return
        self._write_commit(last)
        try:
            self._fsync_all([last.fd])
        except OSError as exc:
            raise _Fatal(exc) from exc
        self.rounds += 1
        self._report(last)

    def _close_files(self) -> None:
        if self._syncing is not None:  # never close a descriptor under a running fsync
            self._syncing.future.exception()
        for fd, _ in self._files.values():
            try:
                self._layer.close(fd)
            except OSError:
                pass
        self._files.clear()

    def _write_data(self, group: _Group) -> None:
        if group.fd < 0:
            self._lay_out(group)  # may create the segment: ENOSPC is possible here too
        self._write_all(group.writes, group.nbytes)

    def _with_enospc_retry(self, write: Callable[[], None]) -> None:
        """Run ``write`` (idempotent: same bytes, same offsets) until it succeeds; only ENOSPC is retried."""
        retry = Backoff(*ENOSPC_RETRY_S)
        while True:
            try:
                write()
                return
            except OSError as exc:
                if exc.errno != errno.ENOSPC or (self._stopping and retry.at_max):
                    raise _Fatal(exc) from exc
                self._on_disk_full()
                with self._cond:
                    self._cond.wait(retry.failed())

    def _fsync_all(self, fds: list[int]) -> None:
        for fd in fds:
            self._layer.fsync(fd)
            self.fsyncs += 1

    @staticmethod
    def _wait_sync(syncing: _Sync) -> None:
        error = syncing.future.exception()  # no timeout: an fsync cannot be abandoned, only failed
        if error is not None:
            raise _Fatal(error) from error

    def _lay_out(self, group: _Group) -> None:
        """Pre-assign offsets: the group's data, split into regions at record boundaries, then its commit.
        Only list slicing and C-level sums here: no Python loop over records, no copy of the bytes."""
        first = group.epochs[0]
        fd, offset = self._segment(first.segment, first.path)
        chunks = first.chunks
        if len(group.epochs) > 1:
            chunks = []
            for epoch in group.epochs:
                chunks += epoch.chunks  # C-level copy of references, not a Python loop per record
        records = len(chunks) // 2
        regions = min(records, self._regions if group.nbytes >= PARALLEL_MIN_BYTES else 1)
        region_start, start = offset, 0
        for region in range(1, regions + 1):
            end = 2 * (records * region // regions)  # an even index: a record boundary
            buffers = chunks[start:end] if regions > 1 else chunks
            group.writes.append((fd, buffers, region_start))
            region_start += group.nbytes if regions == 1 else sum(map(len, buffers))
            start = end
        group.data_offset = offset
        commit_offset = region_start
        last = group.epochs[-1]
        counts = [(e.number, e.last_lsn - e.first_lsn + 1) for e in group.epochs]
        group.commit = encode_commit(first.segment.salt, last.chain, counts, last.last_lsn)
        group.fd, group.commit_offset = fd, commit_offset
        self._files[first.segment.seq][1] = commit_offset + len(group.commit)

    def _segment(self, header: SegmentHeader, path: str) -> tuple[int, int]:
        entry = self._files.get(header.seq)
        if entry is None:
            fd = self._layer.open(path, create=True)
            block = header.encode()
            try:
                self._pwrite_all(fd, block, 0)  # ENOSPC here is retried by the caller (same bytes)
            except OSError:
                self._layer.close(fd)
                raise
            try:
                self._layer.fsync(fd)
                self._layer.fsync_dir(self._directory)  # the new file's name must survive too
            except OSError as exc:  # whatever the errno (ENOSPC too): an fsync is never retried
                self._layer.close(fd)
                raise _Fatal(exc) from exc
            entry = self._files[header.seq] = [fd, len(block)]
        return entry[0], entry[1]

    def _release(self, current_seq: int) -> None:
        """Close segments older than the one before ``current_seq``: no commit will go there again."""
        for seq in [s for s in self._files if s < current_seq - 1]:
            self._layer.close(self._files.pop(seq)[0])

    def _written(self, group: _Group) -> None:
        """The group's data is in the kernel's hands: free its buffers and tell the log (the appender's
        buffer space no longer waits for this group's fsync)."""
        group.writes = []
        for epoch in group.epochs:
            epoch.chunks = []
        self._on_written(group.nbytes)

    def _write_all(self, writes: list[tuple[int, list[bytes], int]], nbytes: int) -> None:
        if len(writes) > 1 and nbytes >= PARALLEL_MIN_BYTES:
            futures = [self._pool.submit(self._pwritev_all, fd, buffers, off) for fd, buffers, off in writes]
            errors = [f.exception() for f in futures]
            for error in errors:
                if error is not None:
                    raise error
        else:
            for fd, buffers, off in writes:
                self._pwritev_all(fd, buffers, off)

    def _pwritev_all(self, fd: int, buffers: list[bytes], offset: int) -> None:
        for at in range(0, len(buffers), IOV_MAX):
            batch = buffers[at : at + IOV_MAX]
            size = sum(map(len, batch))
            written = self._layer.pwritev(fd, batch, offset)
            if written < size:  # a short write (rare on regular files): finish it with plain pwrites
                self._pwrite_all(fd, b"".join(batch)[written:], offset + written)
            offset += size

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
        file_bytes = end - group.data_offset
        position = Position(end, last.chain, last.last_lsn + 1, last.number)
        self._on_durable(DurableGroup(last.segment.seq, position, last.last_lsn, group.nbytes, file_bytes))


class _Fatal(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause
