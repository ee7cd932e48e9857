"""Where cloudd's task runner is in each gateway log, persisted so a restart resumes there.

One JSON file, ``<data_dir>/tasks/cursors.json``, replaced atomically::

    {"v": 1, "logs": [{"gateway", "log_id", "next_lsn", "replay_from", "marker", "waiting"}, ...]}

- ``next_lsn``: every record below it has been processed and its results are stored;
- ``replay_from`` (<= next_lsn): the first LSN of the oldest sensor window still open or awaiting its
  edge aggregate; a restart re-reads the log from there to rebuild the windows, making no result for
  a record below ``next_lsn`` (those are stored already);
- ``marker``: the sensor PlacementMarker in force (every open window was opened under it);
- ``waiting``: the FrameForCloud records whose blob had not arrived yet (LSN, device, body, and
  ``first_seen``: when the runner first saw the record, wall-clock seconds; it gives up waiting
  ``blob_wait_s`` after it. A file written before ``first_seen`` existed counts from its loading).

Invariant: the runner saves a cursor only after the results of every record below its ``next_lsn``
are stored, so a crash at any point makes results at most twice, and the store keeps them once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.files import atomic_write

log = logging.getLogger(__name__)

CURSOR_FILE = "cursors.json"


@dataclass(frozen=True)
class WaitingFrame:
    lsn: int
    device: str
    body: dict[str, Any]  # the FrameForCloud body
    first_seen: float  # time.time() when the runner first saw the record


@dataclass
class LogCursor:
    gateway: str
    log_id: str
    next_lsn: int = 1
    replay_from: int = 1
    marker: dict[str, Any] | None = None
    waiting: list[WaitingFrame] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gateway": self.gateway,
            "log_id": self.log_id,
            "next_lsn": self.next_lsn,
            "replay_from": self.replay_from,
            "marker": self.marker,
            "waiting": [
                {"lsn": w.lsn, "device": w.device, "body": w.body, "first_seen": w.first_seen}
                for w in self.waiting
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, now: float) -> LogCursor:
        return cls(
            gateway=data["gateway"],
            log_id=data["log_id"],
            next_lsn=int(data["next_lsn"]),
            replay_from=int(data["replay_from"]),
            marker=data.get("marker"),
            waiting=[
                WaitingFrame(int(w["lsn"]), w["device"], w["body"], float(w.get("first_seen", now)))
                for w in data.get("waiting", [])
            ],
        )


def load_cursors(folder: Path, *, now: float) -> dict[tuple[str, str], LogCursor]:
    """The saved cursors; none when the file is absent. A file that does not parse is reported and
    ignored: the runner then re-reads every log from its start (results are idempotent). ``now``
    stands for a waiting frame's ``first_seen`` when the file has none."""
    path = folder / CURSOR_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_bytes())
        cursors = [LogCursor.from_dict(item, now=now) for item in data["logs"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("task cursors %s unreadable (%s): re-reading every log from its start", path, exc)
        return {}
    return {(c.gateway, c.log_id): c for c in cursors}


def save_cursors(folder: Path, cursors: list[LogCursor]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    document = {"v": 1, "logs": [c.to_dict() for c in cursors]}
    atomic_write(folder / CURSOR_FILE, json.dumps(document, separators=(",", ":")).encode())
