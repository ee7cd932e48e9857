"""Reading the epoch log back: the segment scanner, and recovery of a log directory after a crash.

Owns: ``scan_buffer`` (verify records and commits in a byte range, yield committed records),
``recover_tail`` (what ``EpochLog.open`` does: validate only the newest segment, so intake starts
at once) and ``recover_all`` (a full, strict scan: tests and the benchmark).

Invariant: a record is returned only if it belongs to a group whose commit record is valid and
matches it (chain value, epoch counts, last LSN); so what is returned is always a prefix of whole
epochs. Damage is named: bad bytes with no valid commit after them are a torn tail (normal after a
crash, cut silently); bad bytes followed by a valid commit are corruption (a commit is written only
after everything before it is durable), reported with the file and byte offset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter

import crc32c

from gateway.storage.filelayer import FileLayer
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
    decode_segment_header,
    segment_seq,
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


@dataclass(frozen=True)
class Damage:
    kind: str  # "torn" (crash damage, silent) or "corrupt" (reported)
    segment: str
    offset: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.segment} byte {self.offset}: {self.detail}"


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
            "corrupt" if corrupt else "torn", segment, where, problem or "uncommitted records"
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


@dataclass
class SegmentInfo:
    """What the log knows about one segment file without (necessarily) having scanned it."""

    path: str
    header: SegmentHeader
    size: int
    end: Position | None = None  # known committed end (tail: validated; older: after a lazy scan)
    index: list[Position] = field(default_factory=list)


@dataclass
class TailRecovery:
    segments: list[SegmentInfo]  # oldest first; the last one validated, the others not yet
    last_lsn: int
    last_epoch: int
    cut_bytes: int = 0
    removed: list[str] = field(default_factory=list)
    damage: Damage | None = None
    headers_unreadable: list[str] = field(default_factory=list)


def list_segments(layer: FileLayer, directory: str) -> list[tuple[int, str]]:
    names = [(segment_seq(name), name) for name in layer.listdir(directory)]
    return sorted((seq, os.path.join(directory, name)) for seq, name in names if seq is not None)


def read_header(layer: FileLayer, path: str) -> tuple[SegmentHeader | None, int]:
    fd = layer.open(path)
    try:
        return decode_segment_header(layer.pread(fd, SEGMENT_HEADER_BYTES, 0)), layer.size(fd)
    finally:
        layer.close(fd)


def recover_tail(layer: FileLayer, directory: str, floor_lsn: int) -> TailRecovery:
    """Validate the newest segment that holds a committed group; cut its torn tail; remove newer
    segments with nothing committed. Older segments are only listed (header read), not scanned."""
    entries = list_segments(layer, directory)
    out = TailRecovery([], floor_lsn, 0)
    while entries:
        _, path = entries[-1]
        header, size = read_header(layer, path)
        if header is None:  # a segment whose header never became durable: created, never used
            out.removed.append(path)
            layer.unlink(path)
            entries.pop()
            continue
        fd = layer.open(path)
        try:
            buf = layer.pread(fd, size, 0)
            scan = scan_buffer(
                buf, 0, header.salt, start_position(header), final=True, segment=path, collect=False
            )
            if scan.damage is not None and scan.damage.kind == "corrupt":
                out.damage = out.damage or scan.damage
                _keep_evidence(layer, path, buf, scan.end.offset)
            if scan.end.offset < size:
                out.cut_bytes += size - scan.end.offset
                layer.truncate(fd, scan.end.offset)
                layer.fsync(fd)
        finally:
            layer.close(fd)
        if scan.end.offset == SEGMENT_HEADER_BYTES:  # nothing committed here: a fresh segment
            out.removed.append(path)
            layer.unlink(path)
            entries.pop()
            continue
        if out.removed:
            layer.fsync_dir(directory)
        older = [(p, _info(layer, p)) for _, p in entries[:-1]]
        out.headers_unreadable = [p for p, info in older if info is None]
        tail = SegmentInfo(path, header, scan.end.offset, scan.end, scan.index)
        out.segments = [info for _, info in older if info is not None] + [tail]
        out.last_lsn, out.last_epoch = scan.end.next_lsn - 1, scan.end.last_epoch
        return out
    if out.removed:
        layer.fsync_dir(directory)
    return out


def _keep_evidence(layer: FileLayer, path: str, buf: bytes, offset: int) -> None:
    """Corruption is cut like a torn tail, but its bytes are kept beside the log for inspection."""
    keep = layer.open(f"{path}.corrupt-{offset}", create=True)
    try:
        layer.pwrite(keep, buf[offset:], 0)
        layer.fsync(keep)
    finally:
        layer.close(keep)


def _info(layer: FileLayer, path: str) -> SegmentInfo | None:
    header, size = read_header(layer, path)
    return SegmentInfo(path, header, size) if header is not None else None


@dataclass
class FullRecovery:
    records: list[tuple[int, bytes]]
    last_lsn: int
    last_epoch: int
    damage: Damage | None
    segments: int


def recover_all(layer: FileLayer, directory: str, collect: bool = True) -> FullRecovery:
    """Scan every segment strictly, oldest first, stopping at the first damage or gap."""
    records: list[tuple[int, bytes]] = []
    last_lsn = last_epoch = 0
    damage: Damage | None = None
    entries = list_segments(layer, directory)
    for index, (_, path) in enumerate(entries):
        header, size = read_header(layer, path)
        if header is None:
            if index < len(entries) - 1:
                damage = Damage("corrupt", path, 0, "segment header unreadable")
            break
        if last_lsn and header.first_lsn != last_lsn + 1:
            damage = Damage(
                "corrupt", path, 0, f"segment starts at lsn {header.first_lsn}, expected {last_lsn + 1}"
            )
            break
        fd = layer.open(path)
        try:
            buf = layer.pread(fd, size, 0)
        finally:
            layer.close(fd)
        scan = scan_buffer(
            buf, 0, header.salt, start_position(header), final=True, segment=path, collect=collect
        )
        records.extend(scan.records)
        if scan.end.next_lsn > header.first_lsn:
            last_lsn, last_epoch = scan.end.next_lsn - 1, scan.end.last_epoch
        if scan.damage is not None:
            following = read_header(layer, entries[index + 1][1])[0] if index + 1 < len(entries) else None
            if following is None or following.first_lsn != last_lsn + 1 or scan.damage.kind == "corrupt":
                damage = scan.damage
                break
    return FullRecovery(records, last_lsn, last_epoch, damage, len(entries))
