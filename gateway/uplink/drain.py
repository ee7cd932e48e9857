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

import heapq
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, get_args

from protocol.config import DrainOrder

DrainClass = Literal["alert", "summary", "raw"]
CLASSES: tuple[DrainClass, ...] = get_args(DrainClass)  # highest priority first

_EVENT = b'"kind":"event"'
_ALERT = (b'"severity":"alert"', b'"severity": "alert"')


def classify(data: bytes) -> DrainClass:
    """The drain class of one encoded record (compact JSON from protocol.records.encode_record).

    A byte search, not a parse: a million-record backlog is classified in about a second.
    """
    if _EVENT not in data:
        return "raw"
    return "alert" if any(a in data for a in _ALERT) else "summary"


class Runs:
    """Sorted, disjoint, non-adjacent runs [lo, hi] of LSNs with a running count.

    Two parallel lists searched with bisect. Removing from the front only advances ``_head`` (the
    dead prefix is compacted once it is half the list), removing from the back truncates, so a class
    drained from either end costs amortised O(1) per touched run plus O(log n) to find it. A change in
    the middle is one list slice assignment: a C memmove, no Python-level walk over the runs.
    """

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._head = 0  # runs before this index are dead (removed from the front)
        self.count = 0  # LSNs held

    def __len__(self) -> int:
        return len(self._lo) - self._head

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self._lo[self._head :], self._hi[self._head :], strict=True)

    def first(self) -> tuple[int, int]:
        return self._lo[self._head], self._hi[self._head]

    def last(self) -> tuple[int, int]:
        return self._lo[-1], self._hi[-1]

    def iter_from_front(self) -> Iterator[tuple[int, int]]:
        for k in range(self._head, len(self._lo)):
            yield self._lo[k], self._hi[k]

    def iter_from_back(self) -> Iterator[tuple[int, int]]:
        for k in range(len(self._lo) - 1, self._head - 1, -1):
            yield self._lo[k], self._hi[k]

    def contains(self, lsn: int) -> bool:
        k = bisect_right(self._lo, lsn, self._head) - 1
        return k >= self._head and lsn <= self._hi[k]

    def append(self, lo: int, hi: int) -> None:
        """Add [lo, hi] past the last run (merging when adjacent)."""
        if len(self) and self._hi[-1] >= lo:
            raise ValueError(f"append [{lo}, {hi}] after a run ending at {self._hi[-1]}")
        if len(self) and self._hi[-1] == lo - 1:
            self._hi[-1] = hi
        else:
            self._lo.append(lo)
            self._hi.append(hi)
        self.count += hi - lo + 1

    def add(self, runs: list[tuple[int, int]]) -> None:
        """Add runs anywhere, merging with what they overlap or touch."""
        if not runs:
            return
        runs = sorted(runs)  # already sorted when they come from runs_of: a linear check
        if len(self) == 0 or runs[0][0] > self._hi[-1] + 1:
            for lo, hi in runs:
                self._append_merging(lo, hi)
            return
        # the existing runs that overlap or touch the new ones' span: i..j-1; merge them in one pass
        i = bisect_left(self._hi, runs[0][0] - 1, self._head)
        j = bisect_right(self._lo, max(hi for _, hi in runs) + 1, self._head)
        old = list(zip(self._lo[i:j], self._hi[i:j], strict=True))
        merged: list[list[int]] = []
        for lo, hi in heapq.merge(old, runs):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.count += sum(hi - lo + 1 for lo, hi in merged) - sum(hi - lo + 1 for lo, hi in old)
        self._replace(i, j, merged)

    def _append_merging(self, lo: int, hi: int) -> None:
        if len(self) and lo <= self._hi[-1] + 1:
            self.count += max(hi, self._hi[-1]) - self._hi[-1]
            self._hi[-1] = max(hi, self._hi[-1])
        else:
            self.append(lo, hi)

    def remove_span(self, a: int, b: int) -> int:
        """Drop every held LSN in [a, b] (splitting at most the two end runs); returns how many."""
        i = bisect_left(self._hi, a, self._head)  # first run ending at or after a
        j = bisect_right(self._lo, b, self._head)  # first run starting after b
        if i >= j:
            return 0
        removed = sum(min(self._hi[k], b) - max(self._lo[k], a) + 1 for k in range(i, j))
        kept: list[list[int]] = []
        if self._lo[i] < a:
            kept.append([self._lo[i], a - 1])
        if self._hi[j - 1] > b:
            kept.append([b + 1, self._hi[j - 1]])
        self.count -= removed
        self._replace(i, j, kept)
        return removed

    def _replace(self, i: int, j: int, runs: list[list[int]]) -> None:
        if i == self._head and len(runs) <= j - i:  # at the front: overwrite the tail of the slot
            start = j - len(runs)
            for k, (lo, hi) in enumerate(runs):
                self._lo[start + k], self._hi[start + k] = lo, hi
            self._head = start
            if self._head > 1024 and 2 * self._head > len(self._lo):
                del self._lo[: self._head], self._hi[: self._head]
                self._head = 0
            return
        self._lo[i:j] = [lo for lo, _ in runs]
        self._hi[i:j] = [hi for _, hi in runs]


class AckedRanges:
    """LSNs the cloud acknowledged above the log's trim point, as sorted disjoint intervals (``Runs``)."""

    def __init__(self, trimmed: int = 0) -> None:
        self.trimmed = trimmed
        self._runs = Runs()

    @property
    def count(self) -> int:
        return self._runs.count

    def add_runs(self, runs: Iterable[tuple[int, int]]) -> None:
        """Add runs; what is at or below the trim point is already acknowledged and ignored."""
        clipped = [(max(lo, self.trimmed + 1), hi) for lo, hi in runs if hi > self.trimmed]
        self._runs.add(clipped)

    def trim_point(self) -> int:
        """How far the log may be trimmed: the end of the acked run that starts at trimmed + 1."""
        if len(self._runs) and self._runs.first()[0] == self.trimmed + 1:
            return self._runs.first()[1]
        return self.trimmed

    def trimmed_to(self, lsn: int) -> None:
        """The log was trimmed to ``lsn``: forget the runs at or below it."""
        if len(self._runs):
            self._runs.remove_span(self._runs.first()[0], lsn)
        self.trimmed = max(self.trimmed, lsn)

    def contains(self, lsn: int) -> bool:
        return lsn <= self.trimmed or self._runs.contains(lsn)

    def missing(self, first: int, last: int) -> list[tuple[int, int]]:
        """The runs of [first, last] the cloud has not acknowledged (what a drop of them loses)."""
        out: list[tuple[int, int]] = []
        at = max(first, self.trimmed + 1)
        for lo, hi in self._runs:
            if lo > last:
                break
            if hi < at:
                continue
            if lo > at:
                out.append((at, lo - 1))
            at = hi + 1
        if at <= last:
            out.append((at, last))
        return out

    @property
    def runs(self) -> list[tuple[int, int]]:
        return list(self._runs)


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
    """Per class, the backlog's unacknowledged LSNs as ``Runs``; every operation is O(log n) or
    amortised O(1) in the backlog's size (a million-record backlog costs each round what a small one does)."""

    def __init__(self) -> None:
        self._runs: dict[DrainClass, Runs] = {c: Runs() for c in CLASSES}
        self.scanned = 0  # highest LSN added
        self.upto = 0  # the backlog covers LSNs <= upto (the rest is the live tail)

    def add(self, lsn: int, cls: DrainClass) -> None:
        assert lsn > self.scanned, f"LSNs are added in increasing order ({lsn} after {self.scanned})"
        self._runs[cls].append(lsn, lsn)
        self.scanned = lsn

    def pending(self, cls: DrainClass | None = None) -> int:
        classes = CLASSES if cls is None else (cls,)
        return sum(self._runs[c].count for c in classes)

    def next_class(self) -> DrainClass | None:
        return next((c for c in CLASSES if len(self._runs[c])), None)

    def pick(self, cls: DrainClass, order: DrainOrder, max_records: int, max_span: int) -> list[int]:
        """Up to ``max_records`` LSNs of ``cls`` from its oldest or newest end, within ``max_span``
        consecutive LSNs of the log (so one sequential read fetches them), in increasing order."""
        runs = self._runs[cls]
        out: list[int] = []
        if not len(runs):
            return out
        if order == "oldest":
            start = runs.first()[0]
            for lo, hi in runs.iter_from_front():
                hi = min(hi, start + max_span - 1, lo + max_records - len(out) - 1)
                if lo > hi:
                    break
                out.extend(range(lo, hi + 1))
                if len(out) >= max_records:
                    break
            return out
        end = runs.last()[1]
        pieces: list[range] = []
        taken = 0
        for lo, hi in runs.iter_from_back():
            lo = max(lo, end - max_span + 1, hi - (max_records - taken) + 1)
            if lo > hi:
                break
            pieces.append(range(lo, hi + 1))
            taken += hi - lo + 1
            if taken >= max_records:
                break
        for piece in reversed(pieces):
            out.extend(piece)
        return out

    def take(self, cls: DrainClass, lsns: list[int]) -> None:
        """Take exactly ``lsns`` out (a batch in flight holds them); unlike ``remove``, LSNs of the
        class between them stay (they may be another batch's, put back while this one was read)."""
        runs = self._runs[cls]
        for lo, hi in runs_of(lsns):
            runs.remove_span(lo, hi)

    def restore(self, cls: DrainClass, lsns: list[int]) -> None:
        """Put back LSNs of ``cls`` that ``remove`` took out (their batch failed)."""
        self._runs[cls].add(runs_of(lsns))

    def forget(self, first: int, last: int) -> None:
        """LSNs in [first, last] are not backlog any more (the log dropped them, or cannot read them)."""
        for runs in self._runs.values():
            runs.remove_span(first, last)


class TokenBucket:
    """An uplink bandwidth cap: ``rate_Bps`` sustained, ``burst_bytes`` at once; None means no cap.

    ``delay_for(n)`` charges ``n`` bytes and returns how long to wait before sending them; the
    bucket may go into debt (a batch larger than the burst is sent after the debt is slept off).
    """

    def __init__(
        self,
        rate_Bps: float | None,
        burst_bytes: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
