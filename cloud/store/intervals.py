"""LSN interval math for idempotent ingest: pure functions, no I/O.

An interval set is a sorted list of disjoint, non-adjacent closed intervals ``(lo, hi)``.
Invariant (checked by ``is_normal``, asserted by ``merge``): for consecutive intervals a, b,
``a.hi + 1 < b.lo``, so each set of LSNs has exactly one interval-set form.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

Interval = tuple[int, int]


def is_normal(intervals: Sequence[Interval]) -> bool:
    """True when the intervals are well formed, sorted, disjoint and not adjacent."""
    if any(lo > hi for lo, hi in intervals):
        return False
    return all(a[1] + 1 < b[0] for a, b in zip(intervals, intervals[1:], strict=False))


def runs(lsns: Iterable[int]) -> list[Interval]:
    """Collapse strictly increasing LSNs into the intervals of consecutive runs: 1,2,3,7 -> (1,3),(7,7)."""
    out: list[Interval] = []
    for lsn in lsns:
        if out and lsn == out[-1][1] + 1:
            out[-1] = (out[-1][0], lsn)
        else:
            if out and lsn <= out[-1][1]:
                raise ValueError(f"lsns must be strictly increasing, got {lsn} after {out[-1][1]}")
            out.append((lsn, lsn))
    return out


def contains(intervals: Sequence[Interval], lsn: int) -> bool:
    """Whether ``lsn`` lies in a normal interval set (binary search)."""
    i = bisect_right(intervals, (lsn, float("inf"))) - 1
    return i >= 0 and intervals[i][0] <= lsn <= intervals[i][1]


def split_new(intervals: Sequence[Interval], lsns: Iterable[int]) -> tuple[list[int], int]:
    """Return (the LSNs not yet in ``intervals``, how many were already there)."""
    new: list[int] = []
    duplicates = 0
    for lsn in lsns:
        if contains(intervals, lsn):
            duplicates += 1
        else:
            new.append(lsn)
    return new, duplicates


def merge(intervals: Iterable[Interval], more: Iterable[Interval]) -> list[Interval]:
    """The normal interval set covering the union of both inputs (adjacent intervals join)."""
    out: list[Interval] = []
    for lo, hi in sorted([*intervals, *more]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    assert is_normal(out), out
    return out
