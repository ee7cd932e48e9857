"""Dataset segment files: the on-disk format of stored records, in one place.

Layout: ``<data_dir>/datasets/<gateway>/<seq:08d>.jsonl``, one series per gateway, ``seq`` from 1.
A segment is JSON lines, one stored record per line::

    segment := line*            line := {"log_id": str, "lsn": int, "data": <Record>} "\\n"

The bytes of a segment that count are those below its *committed length*, which lives in the
metadata database, not here. Invariant kept by ``append_at``: bytes are only ever written at the
committed length (anything past it is cut first), and they are fsynced before it returns, so a
committed length never points past bytes that are not on disk.

Crash damage, named (see ``recover``):
- bytes past the committed length: a crash between fsync and metadata commit. Normal; cut silently.
- a file shorter than its committed length, or a committed line that is not JSON: corruption.
  Reported (returned / counted by the caller), never silently repaired.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.files import fsync_dir

SEGMENT_SUFFIX = ".jsonl"
DEFAULT_SEGMENT_MAX_BYTES = 64 * 1024 * 1024


def segment_path(datasets_dir: Path, gateway: str, seq: int) -> Path:
    return datasets_dir / gateway / f"{seq:08d}{SEGMENT_SUFFIX}"


def encode_line(log_id: str, lsn: int, record_json: bytes) -> bytes:
    """One segment line around an already-encoded record (compact JSON, no newline inside)."""
    assert b"\n" not in record_json, "compact JSON never contains a raw newline"
    return b'{"log_id":"%s","lsn":%d,"data":%s}\n' % (log_id.encode(), lsn, record_json)


def decode_line(line: bytes) -> dict[str, Any]:
    return json.loads(line)


class SegmentCorrupt(Exception):
    """A segment lacks bytes its committed length promises (not crash damage: the disk lost data)."""


def append_at(path: Path, committed_len: int, data: bytes) -> int:
    """Write ``data`` at ``committed_len``, cutting any uncommitted tail first; fsync. Return new end.

    A new file (and its directory entry) is made durable too, so the returned length is safe to commit.
    """
    created = not path.exists()
    if created:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size < committed_len:
            raise SegmentCorrupt(f"{path}: {size} bytes on disk < committed length {committed_len}")
        if size > committed_len:
            # Left over from a write whose metadata commit failed: never acknowledged, so cut it.
            os.ftruncate(fd, committed_len)
        written = os.pwrite(fd, data, committed_len)
        if written != len(data):
            raise OSError(f"{path}: short write {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)
        fsync_dir(path.parent.parent)
    return committed_len + len(data)


@dataclass(frozen=True)
class SegmentRecovery:
    path: Path
    cut_bytes: int = 0  # uncommitted tail removed (normal crash damage)
    missing_bytes: int = 0  # committed bytes not on disk (corruption)


def recover(path: Path, committed_len: int) -> SegmentRecovery:
    """Bring a segment back to its committed length; report what was cut or missing."""
    if not path.exists():
        return SegmentRecovery(path, missing_bytes=committed_len)
    size = path.stat().st_size
    if size > committed_len:
        with open(path, "r+b") as f:
            f.truncate(committed_len)
            f.flush()
            os.fsync(f.fileno())
        return SegmentRecovery(path, cut_bytes=size - committed_len)
    return SegmentRecovery(path, missing_bytes=committed_len - size)


def check(path: Path, committed_len: int) -> SegmentRecovery:
    """Report committed bytes missing from a segment, changing nothing (a segment other cloudd
    replicas may be appending to: bytes past its committed length may be theirs, in flight)."""
    size = path.stat().st_size if path.exists() else 0
    return SegmentRecovery(path, missing_bytes=max(0, committed_len - size))


def read_lines(path: Path, committed_len: int, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, line) for each committed line from ``start`` (a line's first byte); stops at
    the committed length or at EOF."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        f.seek(start)
        offset = start
        while offset < committed_len:
            line = f.readline(committed_len - offset)
            if not line:
                return
            yield offset, line
            offset += len(line)
