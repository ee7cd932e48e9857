"""EpochLog: the gateway's crash-consistent log, ordering decoupled from durability (Blizzard, NSDI'14).

Owns: the asyncio side of the log: LSN and epoch assignment, framing and chained checksums, trim,
and the durability futures. Its room for appends (the bounded buffer, the byte budget, the full
policies, the drop ledger's use) is budget.py, its ``read`` and ``verify`` log_reader.py, its
``trim`` log_trim.py; the writer thread (epoch_writer.py) owns the disk writes; recovery.py what
``open`` finds on disk; meta.py the META file and its LSN marks; drops.py the ledger of what policy
"drop_oldest" lost; scrub.py the background verification.

Invariant: after any crash the log holds a prefix of whole flush epochs that contains every epoch
whose durability future completed; ``append`` never waits for the disk (only, when the buffer is
full, for space) and refuses a record that could never be read back or fit before anything is
written or dropped; no LSN that was durable is assigned again (the next LSN is at least META's
floor); damage is counted once per place (``_note_damage``) and reported wherever it is reached; a
failed fsync of any file makes the log fail (LogFailed) and is never retried.
The format and the guarantee are written up in docs/storage.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, get_args

from gateway.storage.budget import FullPolicy, LogBudget
from gateway.storage.drops import DropLedger, Run
from gateway.storage.durable_files import FsyncFailed
from gateway.storage.epoch_writer import ClosedEpoch, DurableGroup, EpochWriter
from gateway.storage.filelayer import FileLayer, OsFileLayer
from gateway.storage.interface import Damage, Epoch, LogFailed, Lsn, RecordTooLarge
from gateway.storage.log_format import (
    MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    SegmentHeader,
    commit_bytes,
    frame_data,
    segment_name,
)
from gateway.storage.log_reader import LogReading
from gateway.storage.log_trim import LogTrimming
from gateway.storage.meta import MetaFile
from gateway.storage.recovery import SegmentInfo, TailRecovery, UnreadableSegment, recover_tail
from gateway.storage.scanner import INDEX_EVERY_BYTES
from gateway.storage.scrub import Scrubber

log = logging.getLogger(__name__)


class EpochLog(LogBudget, LogReading, LogTrimming):
    def __init__(
        self,
        directory: Path | str,
        *,
        segment_bytes: int = 64 << 20,
        max_bytes: int = 1 << 30,
        full_policy: FullPolicy = "reject",
        writer_threads: int = 2,
        buffer_bytes: int = 32 << 20,
        file_layer: FileLayer | None = None,
        rng: random.Random | None = None,
        append_timeout_s: float = 30.0,
        close_timeout_s: float = 30.0,
        scrub_interval_s: float = 0.0,
        scrub_rate_Bps: float = 4 << 20,
    ) -> None:
        if full_policy not in get_args(FullPolicy):
            raise ValueError(f"full_policy must be one of {get_args(FullPolicy)}, not {full_policy!r}")
        if max_bytes < 2 * segment_bytes:
            raise ValueError("max_bytes must hold at least two segments (max_bytes >= 2 * segment_bytes)")
        self.directory = str(directory)
        self.segment_bytes, self.max_bytes, self.full_policy = segment_bytes, max_bytes, full_policy
        self.buffer_bytes = buffer_bytes
        # the largest record a read returns and, alone in a segment, the budget holds
        budget_room = max_bytes - SEGMENT_HEADER_BYTES - commit_bytes(1) - RECORD_HEADER_BYTES
        self.max_record_bytes = min(MAX_RECORD_BYTES, budget_room)
        self.append_timeout_s, self.close_timeout_s = append_timeout_s, close_timeout_s
        self._layer: FileLayer = file_layer or OsFileLayer()
        self._rng = rng or random.SystemRandom()
        self._writer_threads = writer_threads
        self.log_id = ""
        self.recovery: TailRecovery | None = None
        self.recovery_s = 0.0
        self._admin = ThreadPoolExecutor(1, thread_name_prefix="epochlog-admin")  # meta, unlink
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="epochlog-reader")
        self._writer: EpochWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._meta = MetaFile(self._layer, self.directory)
        self._segments: list[SegmentInfo] = []  # oldest first; the last may be the active one
        self._unreadable: list[UnreadableSegment] = []  # damaged headers: kept, never read
        self._damage: dict[tuple[str, int], Damage] = {}  # (segment, offset) -> damage found there
        self.scrub = Scrubber(self.verify, scrub_interval_s, scrub_rate_Bps)
        self._active: SegmentHeader | None = None
        self._active_bytes = 0
        self._next_seq = 1
        self._next_lsn: Lsn = 1
        self._last_lsn: Lsn = 0  # the last LSN appended (below next_lsn - 1 only past damaged data)
        self._epoch_no = 0
        self._durable_lsn: Lsn = 0
        self._trimmed_lsn: Lsn = 0
        self._chain = 0
        self._open_chunks: list[bytes] = []
        self._open_first: Lsn = 0
        self._open_bytes = 0
        self._buffered = 0  # appended, held in memory, not yet written to the file: <= buffer_bytes
        self._bytes_used = 0  # on disk or on the way, for the byte budget
        self._pending: deque[tuple[Lsn, asyncio.Future[None]]] = deque()
        self._space = asyncio.Event()
        self._room_lock = asyncio.Lock()
        self._failed: BaseException | None = None
        self._closed = False
        self._disk_full = False
        self._ledger = DropLedger()
        self._unacked: Callable[[Lsn, Lsn], list[Run]] = lambda first, last: [(first, last)]
        self._room_freed = asyncio.Event()  # set by a trim that freed bytes (policy "hold" waits on it)
        self._holding = 0  # appends waiting for room now
        self._stats = dict.fromkeys(
            (
                "appended_records",
                "appended_bytes",
                "epochs",
                "epochs_durable",
                "rejected_records",
                "hold_waits",
                "disk_full_events",
                "buffer_waits",
                "corruptions",
                "recovered_cut_bytes",
                "trims",
                "trim_persist_failures",
                "ledger_persist_failures",
            ),
            0,
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        started = time.perf_counter()
        await self._on_admin(self._recover)
        self.recovery_s = time.perf_counter() - started
        self._writer = EpochWriter(
            self._layer,
            self.directory,
            self._writer_threads,
            self._from_writer(self._on_durable),
            self._from_writer(self._on_failed),
            self._from_writer(self._on_disk_full),
            self._from_writer(self._on_written),
            self._meta.reserve,
        )
        self._writer.start()
        self.scrub.start()

    def _recover(self) -> None:
        self._layer.makedirs(self.directory)
        self._meta.load(new_log_id=f"{self._rng.getrandbits(128):032x}")
        self.log_id, self._trimmed_lsn = self._meta.values.log_id, self._meta.values.trimmed_lsn
        tail = self.recovery = recover_tail(self._layer, self.directory, self._meta)
        for damage in tail.damage:
            self._note_damage(damage)
        self._stats["recovered_cut_bytes"] = tail.cut_bytes
        self._segments, self._unreadable = tail.segments, tail.unreadable
        self._next_seq = tail.last_seq + 1
        self._trimmed_lsn = self._durable_trim_point()  # a trim deletes segments before writing META
        self._durable_lsn = self._last_lsn = max(tail.last_lsn, self._trimmed_lsn)
        self._next_lsn = max(self._durable_lsn + 1, self._meta.values.lsn_floor)  # past damaged data
        self._epoch_no = tail.last_epoch
        self._bytes_used = sum(s.size for s in self._segments) + sum(u.size for u in self._unreadable)
        self._unlink(self._drop_trimmed_segments())
        self._load_ledger()

    def _note_damage(self, damage: Damage) -> None:
        """Count and log each damaged place once (reads and scrubs reach it again and again); a read
        that learns the first LSN lost at a place recovery found (a damaged header) fills it in."""
        known = self._damage.get((damage.segment, damage.offset))
        if known is None or (known.lsn == 0 and damage.lsn):
            self._damage[damage.segment, damage.offset] = damage
        if known is None:
            self._stats["corruptions"] += 1
            log.error("epoch log %s: corruption: %s", self.directory, damage)

    @property
    def damage(self) -> list[Damage]:
        """Every damaged place found since open and not trimmed away, in the order found."""
        return list(self._damage.values())

    async def _on_admin(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in the admin executor (META, DROPS, unlinks); a failed fsync there fails
        the log."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._admin, call, *args)
        except FsyncFailed as exc:
            self._on_failed(exc.cause)
            raise LogFailed(f"epoch log {self.directory}: {exc}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        if self._failed is None and self._open_chunks:
            try:
                async with asyncio.timeout(self.close_timeout_s):
                    await self.flush(wait=True)
            except (LogFailed, TimeoutError) as exc:
                log.error("epoch log %s: last epoch not durable at close: %s", self.directory, exc)
        self._closed = True
        await self.scrub.stop()
        if self._writer is not None:
            stopped = await asyncio.get_running_loop().run_in_executor(
                None, self._writer.stop, self.close_timeout_s
            )
            if not stopped:
                log.error(
                    "epoch log %s: writer did not stop within %.0fs", self.directory, self.close_timeout_s
                )
        self._fail_pending(LogFailed("log closed"))
        self._room_freed.set()
        self._admin.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    # -- intake ------------------------------------------------------------------------------------

    @property
    def durable_lsn(self) -> Lsn:
        return self._durable_lsn

    @property
    def trimmed_lsn(self) -> Lsn:
        return self._trimmed_lsn

    async def append(self, record: bytes) -> Lsn:
        if self._failed is not None or self._closed:
            raise LogFailed(f"epoch log {self.directory} is {'failed' if self._failed else 'closed'}")
        size = len(record) + RECORD_HEADER_BYTES
        if len(record) > self.max_record_bytes:
            self._stats["rejected_records"] += 1
            raise RecordTooLarge(
                f"a record of {len(record)} bytes is over epoch log {self.directory}'s limit of "
                f"{self.max_record_bytes} (what a read returns, and what the byte budget holds alone)"
            )
        if self._bytes_used + size > self.max_bytes or self._disk_full:
            await self._make_room(size)
        if self._buffered + size > self.buffer_bytes:
            await self._wait_for_space(size)
        if not self._open_chunks:
            self._start_epoch()
        lsn = self._last_lsn = self._next_lsn
        self._next_lsn = lsn + 1
        if type(record) is not bytes:
            record = bytes(record)  # the writer keeps a reference: it must not change under it
        header, self._chain = frame_data(record, self._epoch_no, lsn, self._chain)
        self._open_chunks += (header, record)
        self._open_bytes += size
        self._buffered += size
        self._bytes_used += size
        self._active_bytes += size
        return lsn

    def _start_epoch(self) -> None:
        self._epoch_no += 1
        self._open_first = self._next_lsn
        if self._active is None or self._active_bytes >= self.segment_bytes:
            self._new_segment()

    def _new_segment(self) -> None:
        """The next epoch goes to a new segment (called between epochs only)."""
        salt = self._rng.getrandbits(32)
        self._active = SegmentHeader(salt, self._next_seq, self._next_lsn, self._epoch_no)
        self._next_seq += 1
        self._chain = self._active.salt
        self._active_bytes = SEGMENT_HEADER_BYTES
        self._bytes_used += SEGMENT_HEADER_BYTES
        path = os.path.join(self.directory, segment_name(self._active.seq))
        self._segments.append(SegmentInfo(path, self._active, SEGMENT_HEADER_BYTES))

    async def flush(self, wait: bool = False) -> Epoch:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        epoch = Epoch(self._epoch_no, self._last_lsn, future)
        if self._failed is not None:
            self._set_failed(future, self._failed)
        else:
            self._close_epoch()
            if self._durable_lsn >= epoch.last_lsn:
                future.set_result(None)
            else:
                self._pending.append((epoch.last_lsn, future))
        if wait:
            await epoch
        return epoch

    def _close_epoch(self) -> None:
        if not self._open_chunks:
            return
        assert self._active is not None and self._writer is not None
        closed = ClosedEpoch(
            self._epoch_no,
            self._open_first,
            self._next_lsn - 1,
            self._active,
            self._segments[-1].path,
            self._open_chunks,
            self._open_bytes,
            self._chain,
        )
        self._open_chunks, self._open_bytes = [], 0
        self._active_bytes += commit_bytes(1)
        self._bytes_used += commit_bytes(1)
        self._stats["epochs"] += 1
        self._writer.submit(closed)

    # -- writer callbacks (on the loop) --------------------------------------------------------------

    def _from_writer(self, callback):
        loop = self._loop
        assert loop is not None

        def call(*args: object) -> None:
            try:
                loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:  # the loop is gone: nobody is waiting any more
                pass

        return call

    def _on_durable(self, group: DurableGroup) -> None:
        self._durable_lsn = group.last_lsn
        self._disk_full = False
        for info in reversed(self._segments):
            if info.header.seq == group.seq:
                info.end, info.size = group.end, group.end.offset
                if not info.index or group.end.offset - info.index[-1].offset >= INDEX_EVERY_BYTES:
                    info.index.append(group.end)
                break
        while self._pending and self._pending[0][0] <= group.last_lsn:
            _, future = self._pending.popleft()
            if not future.done():
                future.set_result(None)
            self._stats["epochs_durable"] += 1
        self._space.set()

    def _on_written(self, nbytes: int) -> None:
        self._buffered -= nbytes
        self._space.set()

    def _on_failed(self, exc: BaseException) -> None:
        log.error("epoch log %s failed: %s (fsync errors are never retried)", self.directory, exc)
        self._failed = exc
        self._fail_pending(LogFailed(f"epoch log {self.directory}: {exc}"))
        self._space.set()
        self._room_freed.set()

    def _on_disk_full(self) -> None:
        if not self._disk_full:
            self._stats["disk_full_events"] += 1
        self._disk_full = True

    def _fail_pending(self, exc: BaseException) -> None:
        while self._pending:
            self._set_failed(self._pending.popleft()[1], exc)

    @staticmethod
    def _set_failed(future: asyncio.Future[None], exc: BaseException) -> None:
        if not future.done():
            future.set_exception(exc if isinstance(exc, LogFailed) else LogFailed(str(exc)))
            future.exception()  # retrieved: whoever awaits still gets it

    def stats(self) -> dict[str, int]:
        writer = self._writer
        return {
            **self._stats,
            "durable_lsn": self._durable_lsn,
            "trimmed_lsn": self._trimmed_lsn,
            "next_lsn": self._next_lsn,
            "segments": len(self._segments),
            "bytes_used": self._bytes_used,
            "max_bytes": self.max_bytes,
            "buffered_bytes": self._buffered,
            "fsyncs": writer.fsyncs if writer else 0,
            "write_rounds": writer.rounds if writer else 0,
            "disk_full": int(self._disk_full),
            "dropped_records": self._ledger.dropped_records,
            "dropped_segments": self._ledger.dropped_segments,
            "gaps_pending": len(self._ledger.gaps),
            "holding": self._holding,
            "failed": int(self._failed is not None),
            **self.scrub.stats(),
        }
