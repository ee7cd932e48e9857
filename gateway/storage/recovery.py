"""Recovery of a log directory after a crash: what ``EpochLog.open`` finds on disk, and a strict scan.

Owns: ``recover_tail`` (validate only the newest segment, so intake starts at once; list the
others by their headers) and ``recover_all`` (every segment, strictly: tests and the benchmark).

Invariant: recovery never deletes committed data. It removes only a newest segment that holds
nothing committed and no data (its header never became durable, or nothing after it did), and cuts
only a torn tail. Damage a crash cannot cause is reported with its segment and byte offset: a bad
record followed by a valid commit (the cut bytes are kept beside the segment first, as
``*.corrupt-<offset>``), a segment header that fails its CRC in a file that holds data (the file is
kept as it is), a segment missing between two others. Before cutting damaged committed data of
the newest segment, or passing over a damaged newer one, the LSN floor is raised (meta.py), so no
LSN that was durable is assigned again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gateway.storage.filelayer import FileLayer
from gateway.storage.interface import Damage
from gateway.storage.log_format import SEGMENT_HEADER_BYTES, SegmentHeader, decode_segment_header, segment_seq
from gateway.storage.meta import MetaFile
from gateway.storage.scanner import Position, ScanResult, scan_buffer, start_position


@dataclass
class SegmentInfo:
    """What the log knows about one segment file without (necessarily) having scanned it."""

    path: str
    header: SegmentHeader
    size: int
    end: Position | None = None  # known committed end (tail: validated; older: after a clean read)
    index: list[Position] = field(default_factory=list)


@dataclass(frozen=True)
class UnreadableSegment:
    """A segment file whose header fails its check but which holds data: kept, reported, never read."""

    path: str
    seq: int
    size: int


@dataclass
class TailRecovery:
    segments: list[SegmentInfo]  # oldest first; the last one validated, the others not yet
    last_lsn: int
    last_epoch: int
    cut_bytes: int = 0
    removed: list[str] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)  # corruption only: a torn tail is no damage
    unreadable: list[UnreadableSegment] = field(default_factory=list)
    last_seq: int = 0  # the highest segment number still on disk


def list_segments(layer: FileLayer, directory: str) -> list[tuple[int, str]]:
    names = [(segment_seq(name), name) for name in layer.listdir(directory)]
    return sorted((seq, os.path.join(directory, name)) for seq, name in names if seq is not None)


def read_header(layer: FileLayer, path: str) -> tuple[SegmentHeader | None, int]:
    fd = layer.open(path)
    try:
        return decode_segment_header(layer.pread(fd, SEGMENT_HEADER_BYTES, 0)), layer.size(fd)
    finally:
        layer.close(fd)


def _read_all(layer: FileLayer, path: str) -> bytes:
    fd = layer.open(path)
    try:
        return layer.pread(fd, layer.size(fd), 0)
    finally:
        layer.close(fd)


def recover_tail(layer: FileLayer, directory: str, meta: MetaFile) -> TailRecovery:
    """Validate the newest segment that holds a committed group; cut its torn tail; remove newer
    segments with nothing committed. Older segments are only listed (header read), not scanned."""
    entries = list_segments(layer, directory)
    out = TailRecovery([], meta.values.trimmed_lsn, 0)
    while entries:
        seq, path = entries.pop()
        header, size = read_header(layer, path)
        if header is None:
            if any(_read_all(layer, path)[SEGMENT_HEADER_BYTES:]):  # data is written after the header's fsync
                meta.raise_floor()  # the LSNs it holds are unknown
                out.unreadable.append(UnreadableSegment(path, seq, size))
                out.damage.append(Damage("corrupt", path, 0, "segment header damaged; the file holds data"))
            else:  # its header never became durable: created, never used
                _remove(layer, path, out)
            continue
        scan = _validate(layer, directory, path, header, size, meta, out)
        corrupt = scan.damage is not None and scan.damage.kind == "corrupt"
        if scan.end.offset == SEGMENT_HEADER_BYTES and not corrupt:  # nothing committed: a fresh segment
            _remove(layer, path, out)
            continue
        tail = SegmentInfo(path, header, scan.end.offset, scan.end, scan.index)
        out.segments = _list_older(layer, entries, out) + [tail]
        out.last_lsn, out.last_epoch = scan.end.next_lsn - 1, scan.end.last_epoch
        break
    if out.removed:
        layer.fsync_dir(directory)
    out.last_seq = max([u.seq for u in out.unreadable] + [s.header.seq for s in out.segments], default=0)
    _report_missing(out)
    return out


def _remove(layer: FileLayer, path: str, out: TailRecovery) -> None:
    out.removed.append(path)
    layer.unlink(path)


def _validate(
    layer: FileLayer,
    directory: str,
    path: str,
    header: SegmentHeader,
    size: int,
    meta: MetaFile,
    out: TailRecovery,
) -> ScanResult:
    """Scan the newest segment whole; cut what is past its last valid commit (corruption: only after
    raising the LSN floor and keeping the cut bytes)."""
    buf = _read_all(layer, path)
    scan = scan_buffer(buf, 0, header.salt, start_position(header), final=True, segment=path, collect=False)
    if scan.damage is not None and scan.damage.kind == "corrupt":
        out.damage.append(scan.damage)
        meta.raise_floor()
        _keep_evidence(layer, directory, path, buf, scan.end.offset)
    if scan.end.offset < size:
        out.cut_bytes += size - scan.end.offset
        fd = layer.open(path)
        try:
            layer.truncate(fd, scan.end.offset)
            layer.fsync(fd)
        finally:
            layer.close(fd)
    return scan


def _keep_evidence(layer: FileLayer, directory: str, path: str, buf: bytes, offset: int) -> None:
    """Corruption is cut like a torn tail, but its bytes are kept beside the log (durably, before
    the cut) for inspection."""
    keep = layer.open(f"{path}.corrupt-{offset}", create=True)
    try:
        layer.pwrite(keep, buf[offset:], 0)
        layer.fsync(keep)
    finally:
        layer.close(keep)
    layer.fsync_dir(directory)


def _list_older(layer: FileLayer, entries: list[tuple[int, str]], out: TailRecovery) -> list[SegmentInfo]:
    """The segments before the tail, by their headers; a header that fails its check is damage."""
    older = []
    for seq, path in entries:
        header, size = read_header(layer, path)
        if header is None:
            out.unreadable.append(UnreadableSegment(path, seq, size))
            out.damage.append(Damage("corrupt", path, 0, "segment header damaged"))
        else:
            older.append(SegmentInfo(path, header, size))
    return older


def _report_missing(out: TailRecovery) -> None:
    """Segments are removed oldest first only (trim), so a missing number between two is damage."""
    held = sorted([s.header.seq for s in out.segments] + [u.seq for u in out.unreadable])
    missing = sorted(set(range(held[0], held[-1] + 1)) - set(held)) if held else []
    if missing:
        name = out.segments[0].path if out.segments else out.unreadable[0].path
        detail = f"segments {missing} are missing between {held[0]} and {held[-1]}"
        out.damage.append(Damage("corrupt", os.path.dirname(name), 0, detail))


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
        buf = _read_all(layer, path)
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
