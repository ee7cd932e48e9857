"""EpochLog's ``read`` and ``verify``: the log's records in LSN order, across segments, a chunk at a time.

Part of ``EpochLog`` (a mixin: the state is the log's, listed below). Each chunk is read in the
reader executor by ``segment_reader.read_chunk``; a long read resumes each chunk where the previous
one stopped, and a segment trimmed or dropped under it makes it start again from the trim point.
``verify`` walks every segment the same way without returning records (``collect=False``), paced
by its caller (the scrub, scrub.py), and reports every damage instead of stopping at the first.

Invariant: ``read`` yields durable, not-trimmed records in increasing LSN order, never past
``durable_lsn``, each verified by this read; where it reaches damage (a chunk that does not verify,
a segment that stops short of the LSN the next one starts at, LSNs above the trim point that no
readable segment holds) it raises ``LogCorrupted`` after the records before it, every time it gets
there, and the log counts each damage once (``_note_damage``). A segment that vanishes while the log
still holds it is ``LogFailed``.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

from gateway.storage.filelayer import FileLayer
from gateway.storage.interface import Damage, LogCorrupted, LogFailed, Lsn, VerifyReport
from gateway.storage.recovery import SegmentInfo, UnreadableSegment
from gateway.storage.scanner import Position
from gateway.storage.segment_reader import read_chunk


class LogReading:
    # The log's state ``read`` uses (it also extends a segment's index as it reads).
    directory: str
    _layer: FileLayer
    _reader: ThreadPoolExecutor
    _segments: list[SegmentInfo]
    _unreadable: list[UnreadableSegment]
    _durable_lsn: Lsn
    _trimmed_lsn: Lsn

    if TYPE_CHECKING:  # EpochLog's, used here

        def _note_damage(self, damage: Damage) -> None: ...

    async def read(self, from_lsn: Lsn) -> AsyncIterator[tuple[Lsn, bytes]]:
        loop = asyncio.get_running_loop()
        lsn = from_lsn
        resume: tuple[SegmentInfo, Position] | None = None  # where the last chunk stopped, in which segment
        while True:
            lsn = max(lsn, self._trimmed_lsn + 1)
            if lsn > self._durable_lsn:
                return
            self._raise_if_hole(lsn)
            firsts = [s.header.first_lsn for s in self._segments]
            at = bisect.bisect_right(firsts, lsn) - 1
            info = self._segments[at]
            last = _must_hold_upto(at, firsts, self._durable_lsn)
            start = resume[1] if resume is not None and resume[0] is info else None
            chunk = await loop.run_in_executor(self._reader, read_chunk, self._layer, info, lsn, last, start)
            resume = (info, chunk.resume) if chunk.resume is not None else None
            if chunk.vanished:
                if info in self._segments:
                    raise LogFailed(f"segment {info.path} is gone but the log still holds it")
                continue  # trimmed or dropped meanwhile: start again from the trim point
            if chunk.end is not None and info.end is None:
                info.end = chunk.end
            info.index.extend(p for p in chunk.index if not info.index or p.offset > info.index[-1].offset)
            for record in chunk.records:
                if record[0] > self._durable_lsn:
                    return
                yield record
            if chunk.damage is not None:
                self._note_damage(chunk.damage)
                raise LogCorrupted(chunk.damage)
            if chunk.records:
                lsn = chunk.records[-1][0] + 1
            elif at + 1 < len(firsts):
                lsn = firsts[at + 1]  # nothing at or after lsn here (it verified up to last): next one
            else:
                return

    def _hole_before_segments(self, lsn: Lsn) -> Damage | None:
        """Damage if ``lsn`` (above the trim point, durable) is before the first readable segment:
        its segment's header is damaged, or the file is gone (a trim never leaves this)."""
        first = self._segments[0].header.first_lsn if self._segments else self._durable_lsn + 1
        if lsn >= first:
            return None
        where = self._unreadable[0].path if self._unreadable else self.directory
        return Damage("corrupt", where, 0, f"records {lsn}..{first - 1} are in no readable segment", lsn)

    def _raise_if_hole(self, lsn: Lsn) -> None:
        hole = self._hole_before_segments(lsn)
        if hole is not None:
            self._note_damage(hole)
            raise LogCorrupted(hole)

    async def verify(self, pace: Callable[[int], Awaitable[None]] | None = None) -> VerifyReport:
        """Read every record from the trim point to ``durable_lsn`` with the checks ``read`` makes,
        and report all damage (each counted once by the log). ``pace(nbytes)`` is awaited after
        each window read (the scrub's I/O rate)."""
        report = VerifyReport(time.time())
        started = time.perf_counter()
        durable = self._durable_lsn
        found = [Damage("corrupt", u.path, 0, "segment header damaged") for u in self._unreadable]
        hole = self._hole_before_segments(self._trimmed_lsn + 1) if self._trimmed_lsn < durable else None
        segments = list(self._segments)
        firsts = [s.header.first_lsn for s in segments]
        for at, info in enumerate(segments):
            if info.header.first_lsn > durable:
                break
            last = _must_hold_upto(at, firsts, durable)
            verified, damage = await self._verify_segment(info, last, pace, report)
            report.segments += 1
            report.records += verified
            found += [damage] if damage is not None else []
        report.damage = found + ([hole] if hole is not None else [])
        for damage in report.damage:
            self._note_damage(damage)
        report.seconds = time.perf_counter() - started
        return report

    async def _verify_segment(
        self,
        info: SegmentInfo,
        last: Lsn,
        pace: Callable[[int], Awaitable[None]] | None,
        report: VerifyReport,
    ) -> tuple[int, Damage | None]:
        """(records verified, the damage that stopped the scan or None) for one segment."""
        loop = asyncio.get_running_loop()
        resume: Position | None = None
        while True:
            lsn = resume.next_lsn if resume is not None else info.header.first_lsn
            read = partial(read_chunk, self._layer, info, lsn, last, resume, collect=False)
            chunk = await loop.run_in_executor(self._reader, read)
            if chunk.vanished:  # trimmed meanwhile: nothing left to verify
                return 0, None
            report.bytes += chunk.scanned_bytes
            if pace is not None:
                await pace(chunk.scanned_bytes)
            resume = chunk.resume
            if chunk.damage is not None or chunk.end is not None:
                verified = resume.next_lsn - info.header.first_lsn if resume is not None else 0
                return verified, chunk.damage


def _must_hold_upto(at: int, firsts: list[Lsn], durable: Lsn) -> Lsn:
    """The last LSN segment ``at`` must hold: up to the next one's first, never past ``durable``."""
    return min(firsts[at + 1] - 1, durable) if at + 1 < len(firsts) else durable
