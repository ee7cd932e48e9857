"""The epoch log's on-disk format, in one place (described in docs/storage.md, "On-disk format").

Owns: the byte layout of segment headers, data records and commit records, and the pure
functions that build and check them. Nothing here does IO.

Invariant: a data record's CRC32C covers its header (after the CRC field) and payload and is
chained: seeded with the segment's salt, each record's CRC is the seed of the next data record's.
A commit record's CRC is seeded with the salt only (so it can be checked where it is found) and
its payload names the chain value it commits, so it vouches for every data record before it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

SEGMENT_MAGIC = b"EFEPLOG1"
FORMAT_VERSION = 1
SEGMENT_HEADER_BYTES = 64  # the header block; records start here
# magic, version, salt, segment seq, first lsn, first epoch; then crc32c of those bytes
_SEGMENT_HEADER = struct.Struct("<8sIIQQQ")
_U32 = struct.Struct("<I")

KIND_DATA = 0x31644645  # b"EFd1" little-endian
KIND_COMMIT = 0x31634645  # b"EFc1"
COMMIT_MARK = _U32.pack(KIND_COMMIT)  # what recovery searches for after damage
# crc u32 | kind u32 | length u32 | epoch u64 | lsn u64
RECORD_HEADER = struct.Struct("<IIIQQ")
RECORD_HEADER_BYTES = RECORD_HEADER.size  # 28
_RECORD_REST = struct.Struct("<IIQQ")  # the header after the crc field
_COMMIT_HEAD = struct.Struct("<II")  # chain value, number of epochs
_COMMIT_EPOCH = struct.Struct("<QI")  # epoch, record count

MAX_RECORD_BYTES = 16 * 1024 * 1024
META_FILE = "META"
SEGMENT_PREFIX, SEGMENT_SUFFIX = "seg-", ".log"


def segment_name(seq: int) -> str:
    return f"{SEGMENT_PREFIX}{seq:010d}{SEGMENT_SUFFIX}"


def segment_seq(name: str) -> int | None:
    if not (name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX)):
        return None
    stem = name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)]
    return int(stem) if stem.isdigit() else None


@dataclass(frozen=True)
class SegmentHeader:
    salt: int
    seq: int
    first_lsn: int
    first_epoch: int

    def encode(self) -> bytes:
        body = _SEGMENT_HEADER.pack(
            SEGMENT_MAGIC, FORMAT_VERSION, self.salt, self.seq, self.first_lsn, self.first_epoch
        )
        block = body + _U32.pack(crc32c.crc32c(body))
        return block + bytes(SEGMENT_HEADER_BYTES - len(block))


def decode_segment_header(block: bytes | memoryview) -> SegmentHeader | None:
    """The header, or None when the block is short, zero, or fails its magic/version/CRC."""
    if len(block) < _SEGMENT_HEADER.size + 4:
        return None
    body = bytes(block[: _SEGMENT_HEADER.size])
    (crc,) = _U32.unpack_from(block, _SEGMENT_HEADER.size)
    if crc32c.crc32c(body) != crc:
        return None
    magic, version, salt, seq, first_lsn, first_epoch = _SEGMENT_HEADER.unpack(body)
    if magic != SEGMENT_MAGIC or version != FORMAT_VERSION:
        return None
    return SegmentHeader(salt, seq, first_lsn, first_epoch)


def frame_data(payload: bytes, epoch: int, lsn: int, chain: int) -> tuple[bytes, int]:
    """(record header, new chain) for one data record; the payload follows the header on disk.
    On the append path: two C CRC calls and two packs, no copy of the payload."""
    size = len(payload)
    crc = crc32c.crc32c(payload, crc32c.crc32c(_RECORD_REST.pack(KIND_DATA, size, epoch, lsn), chain))
    return RECORD_HEADER.pack(crc, KIND_DATA, size, epoch, lsn), crc


def encode_commit(salt: int, chain: int, epochs: list[tuple[int, int]], last_lsn: int) -> bytes:
    """A commit record for a group of epochs [(epoch, record count)], all of whose data is durable."""
    payload = _COMMIT_HEAD.pack(chain, len(epochs)) + b"".join(_COMMIT_EPOCH.pack(e, n) for e, n in epochs)
    rest = _RECORD_REST.pack(KIND_COMMIT, len(payload), epochs[-1][0], last_lsn)
    crc = crc32c.crc32c(payload, crc32c.crc32c(rest, salt))
    return _U32.pack(crc) + rest + payload


@dataclass(frozen=True)
class Commit:
    chain: int
    last_epoch: int
    last_lsn: int
    epochs: tuple[tuple[int, int], ...]
    end: int  # offset just after the commit record


def check_commit(buf: bytes | memoryview, offset: int, salt: int) -> Commit | None:
    """The commit record at ``offset`` if it is whole and its salted CRC holds, else None."""
    if offset + RECORD_HEADER_BYTES > len(buf):
        return None
    crc, kind, length, epoch, lsn = RECORD_HEADER.unpack_from(buf, offset)
    if kind != KIND_COMMIT or length < _COMMIT_HEAD.size or offset + RECORD_HEADER_BYTES + length > len(buf):
        return None
    start = offset + RECORD_HEADER_BYTES
    if crc32c.crc32c(buf[start : start + length], crc32c.crc32c(buf[offset + 4 : start], salt)) != crc:
        return None
    chain, count = _COMMIT_HEAD.unpack_from(buf, start)
    if length != _COMMIT_HEAD.size + count * _COMMIT_EPOCH.size or count == 0:
        return None
    epochs = tuple(
        _COMMIT_EPOCH.unpack_from(buf, start + _COMMIT_HEAD.size + i * _COMMIT_EPOCH.size)
        for i in range(count)
    )
    return Commit(chain, epoch, lsn, epochs, start + length)


def commit_bytes(epoch_count: int) -> int:
    return RECORD_HEADER_BYTES + _COMMIT_HEAD.size + epoch_count * _COMMIT_EPOCH.size


@dataclass(frozen=True)
class MetaValues:
    """What META holds (gateway/storage/meta.py owns the file): the log id, the trim point, and the
    LSN marks: ``lsn_floor`` (the next LSN assigned is at least this) and ``lsn_limit`` (no LSN at or
    above it was ever written to a segment)."""

    log_id: str
    trimmed_lsn: int = 0
    lsn_floor: int = 1
    lsn_limit: int = 1


def encode_meta(meta: MetaValues) -> bytes:
    body = f"{meta.log_id} {meta.trimmed_lsn} {meta.lsn_floor} {meta.lsn_limit}".encode()
    return body + b" " + f"{crc32c.crc32c(body):08x}".encode()


def decode_meta(data: bytes) -> MetaValues | None:
    """The values, or None when the bytes fail their CRC or are not a META (a META written before the
    LSN marks existed holds only the id and the trim point: its marks are the trim point's)."""
    try:
        body, crc = data.rsplit(b" ", 1)
        if int(crc, 16) != crc32c.crc32c(body):
            return None
        log_id, *numbers = body.decode().split(" ")
        values = [int(n) for n in numbers]
        if len(values) == 1:
            return MetaValues(log_id, values[0], values[0] + 1, values[0] + 1)
        trimmed, floor, limit = values
        return MetaValues(log_id, trimmed, floor, limit)
    except ValueError:
        return None
