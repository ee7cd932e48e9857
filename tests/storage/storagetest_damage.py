"""Damage a crash cannot cause, made on purpose: logs filled one record per epoch, and bit flips at
the byte of a chosen record or segment header, found in the files themselves.

Invariant: ``flip`` changes exactly one bit of one file and says where (the offset the log must
report); ``filled_log`` returns an open log whose every record is durable, one record per group.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gateway.storage.epoch_log import EpochLog
from gateway.storage.log_format import RECORD_HEADER_BYTES, decode_segment_header

SEGMENT_BYTES = 4096


def record(lsn: int) -> bytes:
    """The payload of record ``lsn`` (unique in the file, so it can be found there)."""
    return b'{"lsn":%d,"pad":"%s"}' % (lsn, b"x" * (lsn % 50 + 20))


def small_log(directory: Path, **options: object) -> EpochLog:
    return EpochLog(directory, segment_bytes=SEGMENT_BYTES, max_bytes=1 << 20, **options)  # type: ignore[arg-type]


async def filled_log(
    directory: Path, records: int, make: Callable[[int], bytes] = record, **options: object
) -> EpochLog:
    """An open log holding records 1..``records``, each its own epoch and group, all durable."""
    log = small_log(directory, **options)
    await log.open()
    for _ in range(records):
        lsn = log.stats()["next_lsn"]
        await log.append(make(lsn))
        await log.flush(wait=True)
    return log


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("seg-*.log"))


def first_lsn(segment: Path) -> int:
    header = decode_segment_header(segment.read_bytes()[:64])
    assert header is not None, f"{segment} has no valid header"
    return header.first_lsn


def record_offset(directory: Path, lsn: int, make: Callable[[int], bytes] = record) -> tuple[Path, int]:
    """(segment, byte offset of its record header) of record ``lsn``."""
    for segment in segments(directory):
        at = segment.read_bytes().find(make(lsn))
        if at >= 0:
            return segment, at - RECORD_HEADER_BYTES
    raise AssertionError(f"record {lsn} is in no segment of {directory}")


def flip(path: Path, offset: int, mask: int = 0x40) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def flip_payload(directory: Path, lsn: int, make: Callable[[int], bytes] = record) -> tuple[Path, int]:
    """Flip one bit in the payload of record ``lsn``; (its segment, its record's offset)."""
    segment, offset = record_offset(directory, lsn, make)
    flip(segment, offset + RECORD_HEADER_BYTES + 3)
    return segment, offset
