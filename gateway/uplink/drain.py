"""Which log records the uplink sends next: priority classes, acknowledged ranges, the trim point.

Pure bookkeeping, no I/O. The uplink (sender.py) feeds it the LSNs it reads from the log and the
LSNs the cloud acknowledged, and asks it what to send next and how far the log may be trimmed.

Invariants:
- ``AckedRanges.trim_point()`` only ever covers a *contiguous* run of acknowledged LSNs starting
  right after the log's trim point: the log's ``trim(upto)`` is a prefix trim, so an acknowledged
  LSN past a gap stays in the log (re-sent after a restart: the cloud's LSN intervals make that a
  duplicate, never a second copy).
- ``BacklogIndex`` holds every scanned, unacknowledged LSN of the backlog exactly once, in one
  class; ``pick`` never returns an acknowledged LSN, and returns LSNs in increasing order (the
  batch format requires it) even when the class drains newest-first.

Classes, highest priority first: ``alert`` (a record of kind "event" whose body has severity
"alert"), ``summary`` (any other event: a window aggregate, a detection), ``raw`` (telemetry).
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from typing import Literal

CLASSES = ("alert", "summary", "raw")
Order = Literal["oldest", "newest"]

_EVENT = b'"kind":"event"'
_ALERT = (b'"severity":"alert"', b'"severity": "alert"')


def classify(data: bytes) -> str:
    """The drain class of one encoded record (compact JSON from protocol.records.encode_record).

    A byte search, not a parse: a million-record backlog is classified in about a second.
    """
    if _EVENT not in data:
        return "raw"
    return "alert" if any(a in data for a in _ALERT) else "summary"


class AckedRanges:
    """LSNs the cloud acknowledged above the log's trim point, as sorted disjoint intervals."""

    def __init__(self, trimmed: int = 0) -> None:
        self.trimmed = trimmed
        self._lo: list[int] = []  # run starts, sorted; runs are disjoint and not adjacent
        self._hi: list[int] = []
        self.count = 0

    def add_runs(self, runs: Iterable[tuple[int, int]]) -> None:
        for lo, hi in runs:
            self._add(lo, hi)

    def _add(self, lo: int, hi: int) -> None:
        lo = max(lo, self.trimmed + 1)
        if lo > hi:
            return
        # every run that overlaps or touches [lo, hi] merges with it: runs i..j-1
        i = bisect_left(self._hi, lo - 1)
        j = bisect_right(self._lo, hi + 1)
        if i < j:
            lo, hi = min(lo, self._lo[i]), max(hi, self._hi[j - 1])
            self.count -= sum(self._hi[k] - self._lo[k] + 1 for k in range(i, j))
        self._lo[i:j] = [lo]
        self._hi[i:j] = [hi]
        self.count += hi - lo + 1

    def trim_point(self) -> int:
        """How far the log may be trimmed: the end of the acked run that starts at trimmed + 1."""
        if self._lo and self._lo[0] == self.trimmed + 1:
            return self._hi[0]
        return self.trimmed

    def trimmed_to(self, lsn: int) -> None:
        """The log was trimmed to ``lsn``: forget the runs at or below it."""
        self.trimmed = max(self.trimmed, lsn)
        while self._lo and self._hi[0] <= self.trimmed:
            self.count -= self._hi[0] - self._lo[0] + 1
            del self._lo[0], self._hi[0]
        if self._lo and self._lo[0] <= self.trimmed:
            self.count -= self.trimmed - self._lo[0] + 1
            self._lo[0] = self.trimmed + 1

    def contains(self, lsn: int) -> bool:
        if lsn <= self.trimmed:
            return True
        i = bisect_right(self._lo, lsn) - 1
        return i >= 0 and lsn <= self._hi[i]

    @property
    def runs(self) -> list[tuple[int, int]]:
        return list(zip(self._lo, self._hi, strict=True))


def runs_of(lsns: Iterable[int]) -> list[tuple[int, int]]:
    """Increasing LSNs as runs of consecutive values: 1,2,3,7 -> (1,3),(7,7)."""
    out: list[list[int]] = []
    for lsn in lsns:
        if out and lsn == out[-1][1] + 1:
            out[-1][1] = lsn
        else:
            out.append([lsn, lsn])
    return [(lo, hi) for lo, hi in out]


class BacklogIndex:
    """Per class, the backlog's unacknowledged LSNs as runs (a deque of [lo, hi], increasing)."""

    def __init__(self) -> None:
        self._runs: dict[str, deque[list[int]]] = {c: deque() for c in CLASSES}
        self.scanned = 0  # highest LSN added
        self.upto = 0  # the backlog covers LSNs <= upto (the rest is the live tail)

    def add(self, lsn: int, cls: str) -> None:
        assert lsn > self.scanned, f"LSNs are added in increasing order ({lsn} after {self.scanned})"
        runs = self._runs[cls]
        if runs and runs[-1][1] == lsn - 1:
            runs[-1][1] = lsn
        else:
            runs.append([lsn, lsn])
        self.scanned = lsn

    def pending(self, cls: str | None = None) -> int:
        classes = CLASSES if cls is None else (cls,)
        return sum(hi - lo + 1 for c in classes for lo, hi in self._runs[c])

    def next_class(self) -> str | None:
        return next((c for c in CLASSES if self._runs[c]), None)

    def pick(self, cls: str, order: Order, max_records: int, max_span: int) -> list[int]:
        """Up to ``max_records`` LSNs of ``cls`` from its oldest or newest end, within ``max_span``
        consecutive LSNs of the log (so one sequential read fetches them), in increasing order."""
        runs = self._runs[cls]
        out: list[int] = []
        if not runs:
            return out
        if order == "oldest":
            start = runs[0][0]
            for lo, hi in runs:
                hi = min(hi, start + max_span - 1, lo + max_records - len(out) - 1)
                if lo > hi:
                    break
                out.extend(range(lo, hi + 1))
                if len(out) >= max_records:
                    break
            return out
        end = runs[-1][1]
        for lo, hi in reversed(runs):
            lo = max(lo, end - max_span + 1, hi - (max_records - len(out)) + 1)
            if lo > hi:
                break
            out[:0] = range(lo, hi + 1)
            if len(out) >= max_records:
                break
        return out

    def remove(self, cls: str, lsns: list[int]) -> None:
        """Drop acknowledged LSNs: ``lsns`` came from ``pick`` (one end of the class's runs)."""
        if not lsns:
            return
        runs, lo_l, hi_l = self._runs[cls], lsns[0], lsns[-1]
        kept: deque[list[int]] = deque()
        for lo, hi in runs:
            if hi < lo_l or lo > hi_l:
                kept.append([lo, hi])
                continue
            # the picked LSNs are every class LSN in [lo_l, hi_l]: keep what lies outside it
            if lo < lo_l:
                kept.append([lo, lo_l - 1])
            if hi > hi_l:
                kept.append([hi_l + 1, hi])
        self._runs[cls] = kept

    def clear(self) -> None:
        for runs in self._runs.values():
            runs.clear()


class TokenBucket:
    """An uplink bandwidth cap: ``rate_Bps`` sustained, ``burst_bytes`` at once; None means no cap.

    ``delay_for(n)`` charges ``n`` bytes and returns how long to wait before sending them; the
    bucket may go into debt (a batch larger than the burst is sent after the debt is slept off).
    """

    def __init__(self, rate_Bps: float | None, burst_bytes: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate_Bps is not None and rate_Bps <= 0:
            raise ValueError("rate_Bps must be > 0 or None")
        self.rate = rate_Bps
        self.burst = burst_bytes if burst_bytes is not None else (rate_Bps or 0.0)
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()

    def delay_for(self, nbytes: int) -> float:
        if self.rate is None:
            return 0.0
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate) - nbytes
        self._at = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
