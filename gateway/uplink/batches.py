"""A batch's records, read from the log within the batch limits.

Invariant: a batch's entries are in increasing LSN order, at most ``max_records`` of them, and fit
``max_bytes`` by the estimate (each record's bytes plus ``RECORD_OVERHEAD_BYTES``), except that the
first record always goes in: a record larger than the limit is sent alone, never left behind.
"""

from __future__ import annotations

from gateway.storage.interface import RecordLog

RECORD_OVERHEAD_BYTES = 32  # the batch format's bytes around one record, estimated


async def read_entries(
    record_log: RecordLog,
    first: int,
    *,
    max_records: int,
    max_bytes: int,
    wanted: list[int] | None = None,
    last: int | None = None,
) -> list[tuple[int, bytes]]:
    """Records from LSN ``first`` on until a limit is reached; only the LSNs in ``wanted`` (increasing)
    if given, and none past its last or past ``last``: the read never asks for a record beyond them
    (the log may not be readable there). A record skipped as unwanted still ends the batch if it
    would not have fitted (the batch stops where the read would overflow)."""
    want = set(wanted) if wanted is not None else None
    ends = [bound for bound in (last, wanted[-1] if wanted else None) if bound is not None]
    stop = min(ends) if ends else None
    entries: list[tuple[int, bytes]] = []
    size = 0
    if stop is not None and first > stop:
        return entries
    async for lsn, data in record_log.read(first):
        if stop is not None and lsn > stop:
            break
        if entries and (len(entries) >= max_records or size + len(data) + RECORD_OVERHEAD_BYTES > max_bytes):
            break
        if want is None or lsn in want:
            entries.append((lsn, data))
            size += len(data) + RECORD_OVERHEAD_BYTES
        if lsn == stop:
            break
    return entries
