"""Rate-limited logging: at most one line per key per interval, saying how many were suppressed.

Invariant: every call is counted; a suppressed call is reported (as a count) on the next line
for its key, so nothing disappears without a number.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    def __init__(
        self, logger: logging.Logger, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> bool:
        """Log ``message`` unless ``key`` was logged in the last interval; True if it was logged."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        suppressed = self._suppressed.pop(key, 0)
        self._last[key] = now
        if suppressed:
            message += f" ({suppressed} more like this suppressed in the last {self._interval_s:g}s)"
        self._logger.warning(message, *args)
        return True
