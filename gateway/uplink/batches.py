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
) -> list[tuple[int, bytes]]:
    """Records from LSN ``first`` on until a limit is reached; only the LSNs in ``wanted`` (increasing)
    if given, and then none past its last. A record skipped as unwanted still ends the batch if it
    would not have fitted (the batch stops where the read would overflow)."""
    want = set(wanted) if wanted is not None else None
    last = wanted[-1] if wanted is not None else None
    entries: list[tuple[int, bytes]] = []
    size = 0
    async for lsn, data in record_log.read(first):
        if last is not None and lsn > last:
            break
        if entries and (len(entries) >= max_records or size + len(data) + RECORD_OVERHEAD_BYTES > max_bytes):
            break
        if want is None or lsn in want:
            entries.append((lsn, data))
            size += len(data) + RECORD_OVERHEAD_BYTES
    return entries
