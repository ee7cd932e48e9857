"""The LSN interval math: the normal form and set semantics, checked against plain Python sets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cloud.store.intervals import contains, is_normal, merge, runs, split_new


def as_set(intervals):
    return {x for lo, hi in intervals for x in range(lo, hi + 1)}


def test_runs_and_merge_examples():
    assert runs([1, 2, 3, 7, 8, 10]) == [(1, 3), (7, 8), (10, 10)]
    assert merge([(1, 3)], [(4, 6)]) == [(1, 6)]  # adjacent intervals join
    assert merge([(10, 12)], [(1, 2), (5, 5)]) == [(1, 2), (5, 5), (10, 12)]
    assert merge([(1, 2), (5, 6)], [(3, 4)]) == [(1, 6)]


def test_split_new_counts_duplicates():
    new, dup = split_new([(1, 5), (9, 9)], [4, 5, 6, 9, 10])
    assert new == [6, 10]
    assert dup == 3


lsn_sets = st.sets(st.integers(min_value=1, max_value=200), max_size=60)


@given(lsn_sets, lsn_sets)
def test_merge_is_union_in_normal_form(a, b):
    merged = merge(runs(sorted(a)), runs(sorted(b)))
    assert is_normal(merged)
    assert as_set(merged) == a | b
    for x in range(0, 202):
        assert contains(merged, x) == (x in a | b)


@given(lsn_sets, lsn_sets)
def test_split_new_is_set_difference(stored, incoming):
    new, dup = split_new(runs(sorted(stored)), sorted(incoming))
    assert set(new) == incoming - stored
    assert dup == len(incoming & stored)
