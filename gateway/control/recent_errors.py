"""A bounded ring of the daemon's recent warning and error log lines (``log.errors``, ``gatewayctl logs``).

Invariant: at most ``capacity`` lines are kept; each line pushed out is counted in ``dropped``, so
``len(lines) + dropped`` is the number of lines ever seen.
"""

from __future__ import annotations

import collections
import logging
from typing import Any


class RecentErrors(logging.Handler):
    def __init__(self, capacity: int = 200, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self._lines: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not break logging
            message = str(record.msg)
        if len(self._lines) == self._lines.maxlen:
            self.dropped += 1
        self._lines.append(
            {
                "ts": round(record.created, 3),
                "level": record.levelname,
                "logger": record.name,
                "message": message[:2000],
            }
        )

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` lines, oldest first."""
        return list(self._lines)[-limit:] if limit > 0 else []
