"""The daemon's recent log lines, kept in memory for ``log.errors`` (``gatewayctl logs``): two bounded
rings, one of warnings and errors (200 lines) and one of INFO and up (500 lines), so a chatty INFO
stream never pushes out the warnings an operator looks for.

Each ring numbers the lines it takes, 1, 2, 3, ... (its ``seq``); a reader follows a ring with a
cursor, ``<run>-<ring>-<seq>``, and asks for the lines after it. ``run`` names this process's rings,
so a cursor from before a restart is recognised and reading starts again at this run's first line.

Invariant: a ring holds at most ``capacity`` lines and counts each line it pushes out (``dropped``),
so ``len(lines) + dropped`` is the number of lines it ever took; a read after a cursor returns each
kept line once, in order, and says how many lines were pushed out before they could be read
(``missed``): nothing is shown twice or skipped without a number.
"""

from __future__ import annotations

import collections
import logging
import re
import secrets
import threading
from typing import Any

from protocol.control import ControlError

WARNING_LINES = 200
INFO_LINES = 500
# the level a reader asks for -> the ring that holds its lines (ERROR reads the warning ring, filtered)
RING_OF_LEVEL = {"INFO": "info", "WARNING": "warning", "ERROR": "warning"}
_Kept = tuple[int, int, dict[str, Any]]  # (seq, levelno, line)
CURSOR = re.compile(r"(?P<run>[0-9a-f]{1,16})-(?P<ring>info|warning)-(?P<seq>[0-9]{1,18})")


class LogRing:
    def __init__(self, capacity: int, level: int) -> None:
        self.level = level
        self._lines: collections.deque[_Kept] = collections.deque(maxlen=capacity)
        self.taken = 0  # lines ever taken: the seq of the newest
        self._lock = threading.Lock()  # lines come from any thread that logs; reads from the event loop

    @property
    def dropped(self) -> int:
        return self.taken - len(self._lines)

    def push(self, levelno: int, line: dict[str, Any]) -> None:
        with self._lock:
            self.taken += 1
            self._lines.append((self.taken, levelno, line))

    def _snapshot(self) -> tuple[list[_Kept], int]:
        with self._lock:
            return list(self._lines), self.taken

    def tail(self, limit: int, level: int) -> tuple[list[dict[str, Any]], int]:
        """The last ``limit`` lines at ``level`` and up, oldest first; and the seq they read up to."""
        kept, taken = self._snapshot()
        lines = [{"seq": seq, **line} for seq, levelno, line in kept if levelno >= level]
        return lines[-limit:], taken

    def after(self, seq: int, limit: int, level: int) -> tuple[list[dict[str, Any]], int, int]:
        """The first ``limit`` lines after ``seq`` at ``level`` and up, oldest first; the seq read up
        to (a later read starts after it); and how many lines after ``seq`` were pushed out unread."""
        kept, taken = self._snapshot()
        missed = max(0, (taken - len(kept) + 1) - seq - 1)  # the first kept line's seq, less seq + 1
        lines: list[dict[str, Any]] = []
        read_to = taken
        for line_seq, levelno, line in kept:
            if line_seq <= seq or levelno < level:
                continue
            if len(lines) == limit:
                read_to = lines[-1]["seq"]  # the rest is there for the next read
                break
            lines.append({"seq": line_seq, **line})
        return lines, read_to, missed


class RecentLog(logging.Handler):
    def __init__(self, warning_lines: int = WARNING_LINES, info_lines: int = INFO_LINES) -> None:
        super().__init__(logging.INFO)
        self.run = secrets.token_hex(4)
        self.rings = {
            "warning": LogRing(warning_lines, logging.WARNING),
            "info": LogRing(info_lines, logging.INFO),
        }

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not break logging
            message = str(record.msg)
        line = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": message[:2000],
        }
        for ring in self.rings.values():
            if record.levelno >= ring.level:
                ring.push(record.levelno, line)

    def read(self, level: str, limit: int, after: str | None = None) -> dict[str, Any]:
        """The answer to ``log.errors``: the last ``limit`` lines at ``level``, or with ``after`` (a
        cursor) the first ``limit`` after it. ControlError (field ``after``) for a cursor not of this
        level's ring or from its future."""
        name = RING_OF_LEVEL[level]
        ring, levelno = self.rings[name], logging.getLevelNamesMapping()[level]
        missed, restarted = 0, False
        if after is None:
            lines, read_to = ring.tail(limit, levelno)
        else:
            seq, restarted = self._parse(after, name, ring.taken)
            lines, read_to, missed = ring.after(seq, limit, levelno)
        return {
            "lines": lines,
            "next": f"{self.run}-{name}-{read_to}",
            "missed": missed,
            "restarted": restarted,
            "dropped": ring.dropped,
        }

    def _parse(self, cursor: str, ring: str, taken: int) -> tuple[int, bool]:
        """(seq, restarted): a cursor of an earlier run reads this run from its start."""
        parts = CURSOR.fullmatch(cursor)
        if parts is None:
            raise ControlError("invalid", f"{cursor!r} is not a cursor (<run>-<ring>-<seq>)", field="after")
        if parts["run"] != self.run:
            return 0, True
        if parts["ring"] != ring:
            raise ControlError(
                "invalid",
                f"{cursor!r} is a cursor of the {parts['ring']} lines, not of the {ring} lines: "
                "follow at the level it was read at",
                field="after",
            )
        seq = int(parts["seq"])
        if seq > taken:
            raise ControlError("invalid", f"{cursor!r} is past the newest line ({taken})", field="after")
        return seq, False
