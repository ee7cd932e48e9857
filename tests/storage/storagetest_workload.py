"""Self-describing records for the crash tests: each record says which epoch it is in and where.

Invariant: ``check_prefix`` accepts a list of recovered (lsn, payload) only if it is a run of
consecutive LSNs made of whole epochs (every epoch present from its first record to its last),
and every payload is exactly what ``payload`` built for its LSN.
"""

from __future__ import annotations

import random
import struct

_HEAD = struct.Struct("<QIII")  # lsn, epoch tag, records in the epoch, index in the epoch


def payload(lsn: int, tag: int, size: int, index: int, max_len: int = 700) -> bytes:
    length = 16 + (lsn * 7919) % max_len
    return _HEAD.pack(lsn, tag, size, index) + random.Random(lsn).randbytes(length)


def check_prefix(records: list[tuple[int, bytes]], max_len: int = 700) -> str | None:
    """None if the records are a clean prefix of whole epochs, else what is wrong."""
    expected_index = None
    for position, (lsn, data) in enumerate(records):
        if position and lsn != records[position - 1][0] + 1:
            return f"gap or reorder at lsn {lsn} (after {records[position - 1][0]})"
        if len(data) < _HEAD.size:
            return f"lsn {lsn}: short payload"
        own_lsn, tag, size, index = _HEAD.unpack_from(data)
        if own_lsn != lsn or data != payload(lsn, tag, size, index, max_len):
            return f"lsn {lsn}: payload is not what was written"
        if expected_index is not None and index != expected_index:
            return f"lsn {lsn}: epoch record {index}, expected {expected_index}"
        if position == 0 and index != 0:
            # the first readable record may follow a trim point, which is always an epoch boundary
            # in these workloads; anything else means a partial epoch survived
            return f"lsn {lsn}: the recovered log starts inside an epoch"
        expected_index = index + 1 if index + 1 < size else 0
    if expected_index not in (None, 0):
        return f"the last epoch is incomplete (ends at record {expected_index - 1})"
    return None
