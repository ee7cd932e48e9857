"""EpochLog's ``read``: the log's records in LSN order, across segments, a chunk at a time.

Part of ``EpochLog`` (a mixin: the state is the log's, listed below). Each chunk is read in the
reader executor by ``segment_reader.read_chunk``; a long read resumes each chunk where the previous
one stopped, and a segment trimmed or dropped under it makes it start again from the trim point.

Invariant: ``read`` yields durable, not-trimmed records in increasing LSN order, never past
``durable_lsn``; corruption found in an older segment raises ``LogCorrupted`` (and is counted),
never skipped; a segment that vanishes while the log still holds it is ``LogFailed``.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from gateway.storage.filelayer import FileLayer
from gateway.storage.interface import LogFailed, Lsn
from gateway.storage.recovery import Damage, Position, SegmentInfo
from gateway.storage.segment_reader import read_chunk


class LogCorrupted(Exception):
    """A lazily scanned older segment holds corrupt bytes; ``damage`` says where. Not a crash artefact."""

    def __init__(self, damage: Damage) -> None:
        super().__init__(str(damage))
        self.damage = damage


class LogReading:
    # The log's state ``read`` uses (it also extends a segment's index as it reads).
    _layer: FileLayer
    _reader: ThreadPoolExecutor
    _segments: list[SegmentInfo]
    _durable_lsn: Lsn
    _trimmed_lsn: Lsn
    _stats: dict[str, int]

    async def read(self, from_lsn: Lsn) -> AsyncIterator[tuple[Lsn, bytes]]:
        loop = asyncio.get_running_loop()
        lsn = from_lsn
        resume: tuple[SegmentInfo, Position] | None = None  # where the last chunk stopped, in which segment
        while True:
            lsn = max(lsn, self._trimmed_lsn + 1)
            if lsn > self._durable_lsn or not self._segments:
                return
            firsts = [s.header.first_lsn for s in self._segments]
            at = max(0, bisect.bisect_right(firsts, lsn) - 1)
            info = self._segments[at]
            lsn = max(lsn, info.header.first_lsn)
            last = firsts[at + 1] - 1 if at + 1 < len(firsts) else self._durable_lsn
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
                self._stats["corruptions"] += 1
                raise LogCorrupted(chunk.damage)
            if chunk.records:
                lsn = chunk.records[-1][0] + 1
            elif at + 1 < len(self._segments) and lsn <= last:
                lsn = last + 1
            elif at + 1 < len(firsts):
                lsn = firsts[at + 1]
            else:
                return
