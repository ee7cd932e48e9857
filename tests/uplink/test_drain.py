"""The uplink's pure bookkeeping: classes, acknowledged ranges and the trim point, the backlog index,
the bandwidth cap. Checked against simple set models with hypothesis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.uplink.drain import AckedRanges, BacklogIndex, Runs, TokenBucket, classify, runs_of
from protocol.records import Record, encode_record


def _event(severity: str) -> bytes:
    return encode_record(
        Record(kind="event", device="cam-1", received_ts=1.0, body={"severity": severity, "what": "x"})
    )


def test_classify_alert_summary_raw():
    raw = encode_record(Record(kind="telemetry", device="s1", received_ts=1.0, body={"seq": 1}))
    assert classify(_event("alert")) == "alert"
    assert classify(_event("info")) == "summary"
    assert classify(raw) == "raw"
    # a telemetry body that merely mentions an alert is still raw data
    sneaky = encode_record(Record(kind="telemetry", device="s1", received_ts=1.0, body={"severity": "alert"}))
    assert classify(sneaky) == "raw"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 5)), max_size=30), st.integers(0, 10))
def test_acked_ranges_match_a_set_model(spans, trimmed):
    acked = AckedRanges(trimmed)
    model: set[int] = set()
    for lo, width in spans:
        acked.add_runs([(lo, lo + width)])
        model |= {x for x in range(lo, lo + width + 1) if x > trimmed}
        assert acked.count == len(model)
        assert all(a[1] + 1 < b[0] for a, b in zip(acked.runs, acked.runs[1:], strict=False))
        point = trimmed
        while point + 1 in model:
            point += 1
        assert acked.trim_point() == point  # only the contiguous prefix may be trimmed
        for x in range(1, 70):
            assert acked.contains(x) == (x <= trimmed or x in model)
    point = acked.trim_point()
    acked.trimmed_to(point)
    assert acked.count == len({x for x in model if x > point})


def test_trim_point_stops_at_the_first_gap():
    acked = AckedRanges(0)
    acked.add_runs([(10, 10), (20, 20)])  # alerts acknowledged first
    assert acked.trim_point() == 0
    acked.add_runs(runs_of([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert acked.trim_point() == 10
    acked.trimmed_to(10)
    assert acked.runs == [(20, 20)] and acked.count == 1


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(["alert", "summary", "raw"]), min_size=1, max_size=80),
    st.sampled_from(["oldest", "newest"]),
    st.integers(1, 7),
    st.integers(1, 30),
)
def test_backlog_index_picks_from_one_end_and_forgets_what_was_acked(classes, order, n, span):
    index = BacklogIndex()
    model = {"alert": [], "summary": [], "raw": []}
    for lsn, cls in enumerate(classes, 1):
        index.add(lsn, cls)
        model[cls].append(lsn)
    seen: list[int] = []
    while (cls := index.next_class()) is not None:
        # classes drain strictly in priority order
        higher = ("alert", "summary", "raw")[: ("alert", "summary", "raw").index(cls)]
        assert all(not model[c] for c in higher)
        picked = index.pick(cls, order, n, span)
        assert picked and picked == sorted(picked) and len(picked) <= n
        assert picked[-1] - picked[0] < span
        expected = model[cls][: len(picked)] if order == "oldest" else model[cls][-len(picked) :]
        assert picked == expected
        index.take(cls, picked)
        model[cls] = [x for x in model[cls] if x not in picked]
        assert index.pending(cls) == len(model[cls])
        seen += picked
    assert sorted(seen) == list(range(1, len(classes) + 1))


def test_token_bucket_caps_the_rate():
    now = [0.0]
    bucket = TokenBucket(1000.0, burst_bytes=1000, clock=lambda: now[0])
    assert bucket.delay_for(1000) == 0.0  # the burst
    assert bucket.delay_for(500) == 0.5  # in debt: wait it off
    now[0] = 0.5
    assert bucket.delay_for(1000) == 1.0
    assert TokenBucket(None).delay_for(10**9) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 80), st.integers(0, 6)), max_size=40))
def test_runs_match_a_set_model(ops):
    runs = Runs()
    model: set[int] = set()
    for is_add, lo, width in ops:
        if is_add:
            runs.add([(lo, lo + width)])
            model |= set(range(lo, lo + width + 1))
        else:
            assert runs.remove_span(lo, lo + width) == len(model & set(range(lo, lo + width + 1)))
            model -= set(range(lo, lo + width + 1))
        held = list(runs)
        assert all(a[1] + 1 < b[0] for a, b in zip(held, held[1:], strict=False))  # disjoint, apart
        assert [x for lo_, hi_ in held for x in range(lo_, hi_ + 1)] == sorted(model)
        assert runs.count == len(model)


def test_a_large_index_drains_from_both_ends_and_compacts():
    """200k runs (past the compaction point) drained from the front and the back: nothing is lost."""
    index = BacklogIndex()
    for lsn in range(1, 400_001):
        index.add(lsn, "summary" if lsn % 2 else "raw")
    drained = []
    while index.pending("summary"):
        picked = index.pick("summary", "oldest", 1000, 20_000)
        index.take("summary", picked)
        drained += picked
    assert drained == list(range(1, 400_001, 2))
    drained = []
    while index.pending("raw"):
        picked = index.pick("raw", "newest", 1000, 20_000)
        index.take("raw", picked)
        drained = picked + drained
    assert drained == list(range(2, 400_001, 2)) and index.next_class() is None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 5)), max_size=20), st.integers(0, 10))
def test_missing_is_the_unacknowledged_part_of_a_span(spans, trimmed):
    acked = AckedRanges(trimmed)
    for lo, width in spans:
        acked.add_runs([(lo, lo + width)])
    for first, last in ((1, 70), (5, 25), (30, 30)):
        missing = acked.missing(first, last)
        assert missing == runs_of(x for x in range(first, last + 1) if not acked.contains(x))


def test_a_backlog_forgets_what_the_log_dropped():
    index = BacklogIndex()
    for lsn in range(1, 21):
        index.add(lsn, "alert" if lsn % 5 == 0 else "raw")
    index.forget(0, 12)
    assert index.pending("alert") == 2 and index.pending("raw") == 6
    assert index.pick("raw", "oldest", 100, 100)[0] == 13
