"""Reading committed records out of one segment, a bounded chunk at a time (runs in an executor).

Owns: ``read_chunk``: from the nearest known position at or before ``lsn`` (the segment's sparse
index, or where the caller's previous chunk of the same read stopped), read a few MiB, scan them
with the recovery scanner and return the committed records and the position to resume from, so a
long sequential read scans each byte once instead of re-scanning from an index point per chunk.
Older segments that recovery did not scan (tail-first recovery) are verified here, lazily, the
first time they are read.

Invariant: only records of groups with a valid matching commit record are returned, and never
past the segment's known committed end; a segment that ends before the LSN the next segment starts
at is reported as corrupt (``damage``), never skipped over.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gateway.storage.filelayer import FileLayer
from gateway.storage.recovery import Damage, Position, SegmentInfo, scan_buffer, start_position

CHUNK_BYTES = 4 << 20
CHUNK_RECORDS = 1024


@dataclass
class Chunk:
    records: list[tuple[int, bytes]] = field(default_factory=list)
    end: Position | None = None  # the segment's committed end, if this read reached it
    index: list[Position] = field(default_factory=list)
    damage: Damage | None = None
    vanished: bool = False  # the file was deleted (trimmed or dropped) under us
    resume: Position | None = None  # just after the last group scanned: where the next chunk starts


def read_chunk(
    layer: FileLayer, info: SegmentInfo, lsn: int, last_lsn: int, resume: Position | None = None
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
        bound = known_end.offset if known_end is not None else layer.size(fd)
        size = CHUNK_BYTES
        out = Chunk()
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
            )
            out.records.extend(scan.records)
            out.index.extend(scan.index)
            out.resume = scan.end
            if final and scan.complete:
                out.end = scan.end
                missing = scan.end.next_lsn - 1 < last_lsn
                if known_end is None and (missing or (scan.damage and scan.damage.kind == "corrupt")):
                    found = scan.damage or Damage("corrupt", info.path, scan.end.offset, "segment ends early")
                    detail = found.detail + (f"; records up to lsn {last_lsn} are missing" if missing else "")
                    out.damage = Damage("corrupt", info.path, found.offset, detail)
                return out
            if out.records:
                return out
            if scan.end.offset > start.offset:
                start = scan.end  # whole groups below lsn: skip on
            else:
                size *= 2  # one group larger than the chunk
    finally:
        layer.close(fd)
