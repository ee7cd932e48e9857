"""Reading committed records out of one segment, a bounded chunk at a time (runs in an executor).

Owns: ``read_chunk``: from the nearest known position at or before ``lsn`` (the segment's sparse
index, or where the caller's previous chunk of the same read stopped), read a few MiB, scan them
with the scanner (scanner.py) and return the committed records and the position to resume from, so a
long sequential read scans each byte once instead of re-scanning from an index point per chunk.
With ``collect=False`` (the scrub) it verifies one window per call and returns no records.

Invariant: every chunk is verified, whoever wrote the segment and however often it is read: only
records of groups with a valid matching commit record are returned, never past the segment's known
committed end, and a segment that does not verify up to that end, or whose records stop before the
LSN it must hold (``last_lsn``), is reported as corrupt (``damage``, with the first LSN that cannot
be read), every time, never skipped over.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gateway.storage.filelayer import FileLayer
from gateway.storage.interface import Damage
from gateway.storage.recovery import SegmentInfo
from gateway.storage.scanner import Position, ScanResult, scan_buffer, start_position

CHUNK_BYTES = 4 << 20
CHUNK_RECORDS = 1024


@dataclass
class Chunk:
    records: list[tuple[int, bytes]] = field(default_factory=list)
    end: Position | None = None  # the segment's verified end, if this read reached it undamaged
    index: list[Position] = field(default_factory=list)
    damage: Damage | None = None
    vanished: bool = False  # the file was deleted (trimmed or dropped) under us
    resume: Position | None = None  # just after the last group scanned: where the next chunk starts
    scanned_bytes: int = 0


def read_chunk(
    layer: FileLayer,
    info: SegmentInfo,
    lsn: int,
    last_lsn: int,
    resume: Position | None = None,
    *,
    collect: bool = True,
) -> Chunk:
    """Committed records of ``info`` with LSN >= lsn (about CHUNK_RECORDS of them); ``last_lsn`` is
    the last LSN this segment must hold (the next segment's first LSN - 1, or the durable LSN).
    ``resume``: the previous chunk's ``resume`` in this segment (a verified commit boundary)."""
    known_end = info.end
    positions = info.index
    at = bisect.bisect_right([p.next_lsn for p in positions], lsn) - 1
    start = positions[at] if at >= 0 else start_position(info.header)
    if resume is not None and start.offset < resume.offset and resume.next_lsn <= lsn:
        start = resume
    try:
        fd = layer.open(info.path)
    except FileNotFoundError:
        return Chunk(vanished=True)
    try:
        # a segment the log holds ends at a commit: its known end, or (older, not read yet) the file's
        bound = known_end.offset if known_end is not None else layer.size(fd)
        size = CHUNK_BYTES
        out = Chunk()
        first = start.offset
        while True:
            want = min(size, bound - start.offset)
            buf = layer.pread(fd, want, start.offset) if want > 0 else b""
            final = start.offset + len(buf) >= bound
            scan = scan_buffer(
                buf,
                start.offset,
                info.header.salt,
                start,
                final=final,
                segment=info.path,
                from_lsn=lsn,
                max_records=CHUNK_RECORDS,
                collect=collect,
            )
            out.records.extend(scan.records)
            out.index.extend(scan.index)
            out.resume = scan.end
            out.scanned_bytes = scan.end.offset - first
            if final and scan.complete:
                out.damage = _damage_at_end(info.path, scan, bound, last_lsn)
                out.end = scan.end if out.damage is None else None
                return out
            if out.records or (not collect and scan.end.offset > start.offset):
                return out
            if scan.end.offset > start.offset:
                start = scan.end  # whole groups below lsn: skip on
            else:
                size *= 2  # one group larger than the chunk (or damage in a window that is not the last)
    finally:
        layer.close(fd)


def _damage_at_end(path: str, scan: ScanResult, bound: int, last_lsn: int) -> Damage | None:
    """A scan that reached ``bound``: anything that did not verify before it, or records that stop
    before ``last_lsn``, is corruption (a torn tail was cut at recovery, so none is left to excuse)."""
    end = scan.end
    missing = end.next_lsn - 1 < last_lsn
    if scan.damage is None and end.offset >= bound and not missing:
        return None
    offset = scan.damage.offset if scan.damage is not None else end.offset
    detail = scan.damage.detail if scan.damage is not None else "segment ends early"
    if missing:
        detail += f"; records {end.next_lsn}..{last_lsn} cannot be read"
    return Damage("corrupt", path, offset, detail, end.next_lsn)
