"""UpdateFeed: the update records gateways uploaded, read from the dataset store after they are stored.

Why poll the store rather than hook ingest: ingest's contract ends at "durable, then acknowledged";
the store is the single source of what arrived (each record once, per (gateway, log_id, lsn)).
Reading it afterwards keeps ingest unchanged, lets cloudd restart without losing a buffered update
(the feed resumes from a persisted cursor), and never slows an acknowledgement down.

A cursor is, per gateway, ``(segment seq, byte offset)``: everything before it has been read.
Only committed bytes are read (committed lengths come from the metadata database, one snapshot per
poll), so a batch being stored is seen entirely or not at all. Lines are filtered by a byte search
for the update kind before any JSON parse: telemetry costs a scan, not a parse.

Invariant: ``poll`` returns each committed update record at most once per cursor position, in
storage order per gateway, and advances the cursor only past what it returned or skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloud.store import marker, meta, segments
from cloud.store.database import SQLITE_FILE, open_database

Position = tuple[int, int]  # (segment seq, byte offset)
_UPDATE_MARK = b'"kind":"update"'


@dataclass(frozen=True)
class FeedItem:
    gateway: str
    log_id: str
    lsn: int
    position: Position  # where the line starts (resume here to read it again)
    line_bytes: int
    record: dict[str, Any] | None  # None: the line did not parse (corruption, counted by the caller)


class UpdateFeed:
    def __init__(
        self, data_dir: Path, cursor: dict[str, Position] | None = None, max_bytes_per_poll: int = 64 << 20
    ) -> None:
        self.data_dir = Path(data_dir)
        self.datasets_dir = self.data_dir / "datasets"
        self.cursor: dict[str, Position] = dict(cursor or {})
        self.max_bytes_per_poll = max_bytes_per_poll
        self.scanned_bytes = 0

    def _committed(self) -> list[tuple[str, int, int]]:
        if not (self.data_dir / SQLITE_FILE).exists() and marker.read(self.data_dir) is None:
            return []  # no store yet
        db = open_database(None, self.data_dir, readonly=True)
        try:
            return db.read(meta.segments)
        finally:
            db.close()

    def skip_to_end(self) -> None:
        """Move the cursor past everything committed now, without reading it."""
        for gateway, seq, committed_len in self._committed():
            self.cursor[gateway] = max(self.cursor.get(gateway, (0, 0)), (seq, committed_len))

    def poll(self) -> list[FeedItem]:
        items: list[FeedItem] = []
        budget = self.max_bytes_per_poll
        for gateway, seq, committed_len in self._committed():
            start_seq, start_offset = self.cursor.get(gateway, (0, 0))
            if seq < start_seq or budget <= 0:
                continue
            offset = start_offset if seq == start_seq else 0
            if offset >= committed_len:
                continue
            path = segments.segment_path(self.datasets_dir, gateway, seq)
            end = offset
            for line_offset, line in _lines_from(path, offset, committed_len):
                end = line_offset + len(line)
                self.scanned_bytes += len(line)
                budget -= len(line)
                if _UPDATE_MARK in line:
                    items.append(_item(gateway, seq, line_offset, line))
                if budget <= 0:
                    break
            self.cursor[gateway] = (seq, end)
        return items


def _item(gateway: str, seq: int, offset: int, line: bytes) -> FeedItem:
    try:
        row = json.loads(line)
        record = row["data"]
        if not isinstance(record, dict) or record.get("kind") != "update":
            raise ValueError("not an update record")
        return FeedItem(gateway, str(row["log_id"]), int(row["lsn"]), (seq, offset), len(line), record)
    except (ValueError, KeyError, TypeError):
        return FeedItem(gateway, "", 0, (seq, offset), len(line), None)


def _lines_from(path: Path, offset: int, committed_len: int) -> Iterator[tuple[int, bytes]]:
    if not path.exists():
        return
    with open(path, "rb") as f:
        f.seek(offset)
        while offset < committed_len:
            line = f.readline(committed_len - offset)
            if not line:
                return
            yield offset, line
            offset += len(line)
