"""The segment scanner: verify the records and commit records in a byte range of one segment.

Owns: ``scan_buffer`` and the positions it resumes from. Recovery (recovery.py), reads
(segment_reader.py) and the scrub all read bytes back through it; nothing else parses records.

Invariant: a record is returned only if it belongs to a group whose commit record is valid and
matches it (chain value, epoch counts, last LSN); so what is returned is always a prefix of whole
epochs. Damage is named: bad bytes with no valid commit after them are "torn" (what a crash leaves
at the end of the newest segment), bad bytes followed by a valid commit are "corrupt" (a commit is
written only after everything before it is durable); either way with the byte offset and the first
LSN not returned. Whether "torn" is normal is the caller's call: only at the end of the newest
segment at recovery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter

import crc32c

from gateway.storage.interface import Damage
from gateway.storage.log_format import (
    COMMIT_MARK,
    KIND_COMMIT,
    KIND_DATA,
    MAX_RECORD_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    SEGMENT_HEADER_BYTES,
    Commit,
    SegmentHeader,
    check_commit,
)

# A sparse index point every this many bytes: a read starting anywhere scans at most this much
# before its first record (64 KiB: ~500 small records, a few ms; 1k points per 64 MiB segment).
INDEX_EVERY_BYTES = 64 << 10


@dataclass(frozen=True)
class Position:
    """A place to resume scanning: just after a commit record (or the segment header)."""

    offset: int
    chain: int
    next_lsn: int
    last_epoch: int


@dataclass
class ScanResult:
    end: Position  # after the last valid commit seen
    records: list[tuple[int, bytes]] = field(default_factory=list)
    damage: Damage | None = None
    complete: bool = True  # False: stopped early (record limit, or the buffer ended mid-group)
    index: list[Position] = field(default_factory=list)


def start_position(header: SegmentHeader) -> Position:
    return Position(SEGMENT_HEADER_BYTES, header.salt, header.first_lsn, header.first_epoch - 1)


def scan_buffer(
    buf: bytes,
    base: int,
    salt: int,
    start: Position,
    *,
    final: bool,
    segment: str = "",
    from_lsn: int = 0,
    max_records: int | None = None,
    collect: bool = True,
) -> ScanResult:
    """Scan ``buf`` (the file's bytes from offset ``base``) from ``start``.

    ``final``: buf reaches the end of the file, so a short record there is damage, not "read more".
    Records with lsn >= from_lsn of committed groups are collected, up to about max_records
    (the scan stops at a commit boundary once that many are held).
    """
    view = memoryview(buf)
    result = ScanResult(end=start)
    stop, problem = _scan_groups(view, base, salt, result, from_lsn if collect else None, max_records)
    if not (final and result.complete):
        result.complete = False  # stopped at max_records, or the caller reads on from result.end
        return result
    tail = result.end.offset - base
    if problem or any(view[tail:]):  # bad bytes after the last whole group (uncommitted records count)
        corrupt = _valid_commit_after(view, max(stop, tail), salt)  # a commit vouches for all before it
        where = base + stop if problem else result.end.offset
        result.damage = Damage(
            "corrupt" if corrupt else "torn",
            segment,
            where,
            problem or "uncommitted records",
            result.end.next_lsn,
        )
    return result


# The open group: its data records, verified but not yet vouched for by a commit record.
_Pending = list[tuple[int, int, int, int]]  # (lsn, epoch, payload offset, length)


def _scan_groups(
    view: memoryview, base: int, salt: int, result: ScanResult, keep_from: int | None, max_records: int | None
) -> tuple[int, str]:
    """Verify records from ``result.end`` on; each group whose commit holds moves ``result.end`` past it.
    Returns where the scan stopped (an offset into ``view``) and the problem found there ("" when it
    stopped at zeros, at the end of ``view`` or at ``max_records``).

    The data record case runs once per record, so it stays inline and on local variables."""
    n = len(view)
    start = result.end
    off, chain, next_lsn = start.offset - base, start.chain, start.next_lsn
    min_epoch = start.last_epoch + 1  # the lowest epoch the next data record may carry
    pending: _Pending = []
    while True:
        if off + RECORD_HEADER_BYTES > n:
            return off, "short header" if off < n else ""
        crc, kind, length, epoch, lsn = RECORD_HEADER.unpack_from(view, off)
        if kind == KIND_DATA:
            body = off + RECORD_HEADER_BYTES
            if length > MAX_RECORD_BYTES or body + length > n:
                return off, "record runs past the end"
            if crc32c.crc32c(view[body : body + length], crc32c.crc32c(view[off + 4 : body], chain)) != crc:
                return off, "checksum mismatch"
            if lsn != next_lsn or epoch < min_epoch:
                return off, f"out of order (lsn {lsn}, expected {next_lsn}; epoch {epoch})"
            pending.append((lsn, epoch, body, length))
            chain, next_lsn, min_epoch, off = crc, next_lsn + 1, epoch, body + length
        elif kind == KIND_COMMIT:
            commit = check_commit(view, off, salt)
            problem = _commit_problem(commit, pending, chain, next_lsn - 1)
            if commit is None or problem:
                return off, problem
            last_epoch = pending[-1][1]
            off, min_epoch = commit.end, last_epoch + 1
            end = Position(base + off, chain, next_lsn, last_epoch)
            _close_group(result, view, pending, end, keep_from, start.offset)
            if max_records is not None and len(result.records) >= max_records:
                result.complete = False
                return off, ""
        else:
            return off, "no record here" if any(view[off : off + RECORD_HEADER_BYTES]) else ""


def _commit_problem(commit: Commit | None, pending: _Pending, chain: int, last_lsn: int) -> str:
    """Why ``commit`` (the commit record found after ``pending``) does not close that group; "" if it does."""
    if commit is None:
        return "commit record damaged"
    counts = [(epoch, len(list(run))) for epoch, run in groupby(map(itemgetter(1), pending))]
    if not pending or commit.chain != chain or commit.last_lsn != last_lsn or list(commit.epochs) != counts:
        return "commit does not match the records before it"
    return ""


def _close_group(
    result: ScanResult,
    view: memoryview,
    pending: _Pending,
    end: Position,
    keep_from: int | None,
    scan_start: int,
) -> None:
    """A valid commit vouches for ``pending``: collect its records with lsn >= ``keep_from`` (none if
    None), move ``result.end`` to ``end``, and add an index point once INDEX_EVERY_BYTES have passed
    since the last one (or since ``scan_start``, the file offset the scan began at)."""
    if keep_from is not None:
        result.records.extend(
            (lsn, bytes(view[at : at + size])) for lsn, _, at, size in pending if lsn >= keep_from
        )
    pending.clear()
    result.end = end
    last_index = result.index[-1].offset if result.index else scan_start
    if end.offset - last_index >= INDEX_EVERY_BYTES:
        result.index.append(end)


def _valid_commit_after(view: memoryview, offset: int, salt: int) -> bool:
    raw = view.obj if isinstance(view.obj, bytes) else bytes(view)
    pos = raw.find(COMMIT_MARK, offset + 1)
    while pos != -1:
        if pos >= 4 and check_commit(view, pos - 4, salt) is not None:
            return True
        pos = raw.find(COMMIT_MARK, pos + 1)
    return False
