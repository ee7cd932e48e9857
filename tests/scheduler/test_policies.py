"""Each policy on small hand-made cases whose right answer can be derived by hand."""

from __future__ import annotations

import pytest

from cloud.scheduler.decision import Preempt, Start
from cloud.scheduler.policies.hetero import assign_generations
from cloud.scheduler.policies.tiresias import Tiresias
from cloud.scheduler.round import Scheduler
from tests.scheduler.helpers import cluster, job, running


def starts(plan: object) -> list[tuple[str, tuple[str, ...]]]:
    return [(d.job_id, d.nodes) for d in plan.decisions if isinstance(d, Start)]  # type: ignore[attr-defined]


def preempts(plan: object) -> list[str]:
    return [d.job_id for d in plan.decisions if isinstance(d, Preempt)]  # type: ignore[attr-defined]


def test_las_preempts_the_long_job_when_a_short_one_arrives_and_fifo_does_not() -> None:
    for policy, expect_preempt in (("las", ["long"]), ("fifo", [])):
        c = cluster(("a", 2, "g"))
        long = running(job("long", devices=2, at=0.0), c, ("a", "a"))
        long.progress(100.0, 100.0, "g")  # 200 device-s attained
        short = job("short", devices=2, at=100.0)
        plan = Scheduler.from_names(policy=policy).round(c, [long, short], now=100.0)
        assert preempts(plan) == expect_preempt, policy
        assert starts(plan) == ([("short", ("a", "a"))] if expect_preempt else []), policy
        if expect_preempt:
            assert "short ranks higher" in plan.preempts[0].reason


def test_las_orders_by_attained_service_and_preempts_only_what_it_needs() -> None:
    c = cluster(("a", 2, "g"))
    big = running(job("big", at=0.0), c, ("a",))
    big.progress(50.0, 50.0, "g")
    small = running(job("small", at=1.0), c, ("a",))
    small.progress(10.0, 10.0, "g")
    new = job("new", at=2.0)
    plan = Scheduler.from_names(policy="las").round(c, [big, small, new], now=60.0)
    assert [e.job_id for e in plan.order] == ["new", "small", "big"]
    assert preempts(plan) == ["big"] and starts(plan) == [("new", ("a",))]


def test_srtf_orders_by_remaining_time_and_puts_unmeasured_jobs_last() -> None:
    c = cluster(("a", 1, "g"))
    jobs = [
        job("thirty", at=0.0, steps=30),
        job("ten", at=1.0, steps=20, throughput={"g": 2.0}),
        job("unknown", at=2.0, steps=1, throughput={}),
        job("twenty", at=3.0, steps=40, throughput={"g": 2.0}),
    ]
    plan = Scheduler.from_names(policy="srtf").round(c, jobs, now=5.0)
    assert [e.job_id for e in plan.order] == ["ten", "twenty", "thirty", "unknown"]
    assert starts(plan) == [("ten", ("a",))]


def test_srtf_preempts_a_running_job_with_more_time_left() -> None:
    c = cluster(("a", 1, "g"))
    long = running(job("long", steps=100), c, ("a",))
    long.progress(10.0, 10.0, "g")  # 90 s left
    short = job("short", at=10.0, steps=50)  # 50 s left
    plan = Scheduler.from_names(policy="srtf").round(c, [long, short], now=10.0)
    assert preempts(plan) == ["long"] and starts(plan) == [("short", ("a",))]


def test_tiresias_demotes_past_a_threshold_and_is_fifo_inside_a_queue() -> None:
    c = cluster(("a", 1, "g"))
    demoted = running(job("demoted", at=0.0), c, ("a",))
    demoted.progress(150.0, 150.0, "g")  # 150 device-s >= threshold 100: queue 1
    early = job("early", at=1.0)
    early.progress(90.0, 1.0, "g")  # queue 0 although it has more service than "late"
    early.status, early.waiting_since, early.admitted = "preempted", 100.0, True
    late = job("late", at=2.0)
    policy = Tiresias(thresholds=(100.0,), starve_factor=10.0)
    assert policy.queue_of(demoted, 200.0)[0] == 1 and policy.queue_of(early, 200.0)[0] == 0
    plan = Scheduler(Scheduler.from_names().admission, policy, Scheduler.from_names().placement).round(
        c, [demoted, early, late], now=200.0
    )
    assert [e.job_id for e in plan.order] == ["early", "late", "demoted"]
    assert preempts(plan) == ["demoted"] and starts(plan) == [("early", ("a",))]
    # Continuous LAS would pick "late" (0 device-s) over "early" (90).
    las = Scheduler.from_names(policy="las").round(c, [demoted, early, late], now=200.0)
    assert starts(las) == [("late", ("a",))]


def test_tiresias_starvation_guard_promotes_a_long_waiting_job() -> None:
    policy = Tiresias(thresholds=(100.0,), starve_factor=2.0)
    waiting = job("w", at=0.0)
    waiting.progress(150.0, 1.0, "g")
    waiting.status, waiting.waiting_since = "preempted", 150.0
    assert policy.queue_of(waiting, 200.0)[0] == 1  # waited 50 s < 2 x 150 s
    queue, reason = policy.queue_of(waiting, 450.0)  # waited 300 s >= 2 x 150 s
    assert queue == 0 and "promoted" in reason
    with pytest.raises(ValueError, match="tiresias.thresholds"):
        Tiresias(thresholds=(10.0, 5.0))


def test_hetero_puts_the_job_with_the_larger_speedup_on_the_fast_generation() -> None:
    c = cluster(("new0", 1, "new"), ("old0", 1, "old"))
    # "modest" comes first in every other order; its speedup is only 1.2x against 3x.
    modest = job("modest", at=0.0, throughput={"old": 1.0, "new": 1.2})
    keen = job("keen", at=1.0, throughput={"old": 1.0, "new": 3.0})
    plan = Scheduler.from_names(policy="hetero").round(c, [modest, keen], now=1.0)
    assert sorted(starts(plan)) == [("keen", ("new0",)), ("modest", ("old0",))]
    # Tiresias, blind to speed, gives the first job the first node that fits.
    plain = Scheduler.from_names(policy="tiresias").round(c, [modest, keen], now=1.0)
    assert sorted(starts(plain)) == [("keen", ("old0",)), ("modest", ("new0",))]


def test_hetero_swaps_two_running_jobs_to_their_better_generations() -> None:
    c = cluster(("old0", 1, "old"), ("new0", 1, "new"))
    keen = running(job("keen", at=0.0, throughput={"old": 1.0, "new": 3.0}), c, ("old0",))
    modest = running(job("modest", at=1.0, throughput={"old": 1.0, "new": 1.2}), c, ("new0",))
    plan = Scheduler.from_names(policy="hetero").round(c, [keen, modest], now=2.0)
    assert sorted(preempts(plan)) == ["keen", "modest"]
    assert sorted(starts(plan)) == [("keen", ("new0",)), ("modest", ("old0",))]


def test_assign_generations_fills_the_fast_generation_by_speedup_within_its_devices() -> None:
    jobs = [
        job("a", throughput={"old": 1.0, "new": 1.5}),
        job("b", devices=2, throughput={"old": 1.0, "new": 2.0}),
        job("c", throughput={"old": 1.0, "new": 3.0}),
    ]
    assigned = assign_generations(jobs, {"old": 4, "new": 2}, current={})
    assert assigned == {"c": "new", "a": "new", "b": "old"}  # b (2 devices) no longer fits after c
    # A running job moves to a faster generation only for a speedup of at least stay_bonus.
    assert assign_generations(jobs[:1], {"old": 1, "new": 1}, current={"a": "old"}, stay_bonus=2.0) == {
        "a": "old"
    }
    assert assign_generations(jobs[:1], {"old": 1, "new": 1}, current={"a": "old"}, stay_bonus=1.4) == {
        "a": "new"
    }


def test_hetero_takes_the_fast_generation_from_a_lower_ranked_job_rather_than_settle() -> None:
    c = cluster(("old0", 4, "old"), ("new0", 4, "new"))
    long = running(
        job("long", devices=4, steps=10_000, throughput={"old": 1.0, "new": 2.0}), c, ("new0",) * 4
    )
    long.progress(600.0, 1200.0, "new")
    short = job("short", devices=4, at=500.0, throughput={"old": 1.0, "new": 3.0})
    mid = job("mid", devices=2, at=550.0, throughput={"old": 1.0, "new": 1.2})
    plan = Scheduler.from_names(policy="hetero").round(c, [long, short, mid], now=600.0)
    assert preempts(plan) == ["long"]
    assert sorted(starts(plan)) == [("mid", ("old0", "old0")), ("short", ("new0",) * 4)]
    # LAS, blind to speed, puts the 3x job on the old generation.
    las = Scheduler.from_names(policy="las").round(c, [long, short, mid], now=600.0)
    assert ("short", ("old0",) * 4) in starts(las)
