"""Admission verdicts and placement choices on hand-made clusters."""

from __future__ import annotations

from cloud.scheduler.admission import LoadBased, UserQuota
from cloud.scheduler.placement import Consolidated, FirstFit
from cloud.scheduler.round import Scheduler
from tests.scheduler.helpers import cluster, job


def test_user_quota_refuses_an_oversized_job_and_holds_one_over_the_users_share() -> None:
    c = cluster(("a", 8, "g"))
    jobs = [
        job("fits", devices=2, at=0.0, user="ann"),
        job("over", devices=1, at=1.0, user="ann"),
        job("huge", devices=4, at=2.0, user="bob"),
        job("other", devices=1, at=3.0, user="bob"),
    ]
    s = Scheduler(
        UserQuota(max_devices=2, per_user={"bob": 3}), Scheduler.from_names().policy, Consolidated()
    )
    plan = s.round(c, jobs, now=5.0)
    assert [(r.job_id, r.reason) for r in plan.refused] == [
        ("huge", "user_quota: job asks 4 devices, user 'bob' may hold 3")
    ]
    assert plan.admitted == ("fits", "other")
    held = plan.position("over")
    assert held is not None and held.state == "held" and "user 'ann' holds 2 of 2 devices" in held.reason
    assert {d.job_id for d in plan.starts} == {"fits", "other"}


def test_load_based_holds_jobs_beyond_the_load_limit() -> None:
    c = cluster(("a", 2, "g"))
    s = Scheduler(LoadBased(max_load=1.5), Scheduler.from_names().policy, Consolidated())
    plan = s.round(c, [job("one", devices=2, at=0.0), job("two", devices=2, at=1.0)], now=1.0)
    assert plan.admitted == ("one",)
    entry = plan.position("two")
    assert entry is not None and entry.state == "held" and "load would be 2.00 > max_load 1.5" in entry.reason


def test_consolidated_keeps_a_job_on_one_node_where_first_fit_spreads_it() -> None:
    c = cluster(("a", 4, "g"), ("b", 4, "g"))
    c.allocate("x", ("a", "a"))
    three = job("three", devices=3)
    assert FirstFit().place(three, c) == ("a", "a", "b")
    assert Consolidated().place(three, c) == ("b", "b", "b")
    # Best fit: a 2-device job fills a's hole and leaves b whole.
    assert Consolidated().place(job("two", devices=2), c) == ("a", "a")
    # Larger than any node: whole free nodes only; a partly used node does not count.
    assert Consolidated().place(job("eight", devices=8), c) is None
    c.release("x")
    assert Consolidated().place(job("eight", devices=8), c) == ("a",) * 4 + ("b",) * 4


def test_consolidated_waits_rather_than_spread_a_job_one_node_could_hold() -> None:
    c = cluster(("a", 4, "g"), ("b", 4, "g"))
    c.allocate("x", ("a", "a", "a"))
    c.allocate("y", ("b", "b", "b"))
    assert Consolidated().place(job("two", devices=2), c) is None
    assert FirstFit().place(job("two", devices=2), c) == ("a", "b")


def test_node_filter_hook_keeps_a_job_off_excluded_nodes() -> None:
    c = cluster(("flaky", 4, "g"), ("solid", 2, "g"))
    s = Scheduler.from_names(policy="fifo", node_filter=lambda j, n: n.name != "flaky" or j.user != "careful")
    plan = s.round(c, [job("a", devices=2, user="careful"), job("b", devices=4, user="careful")], now=0.0)
    assert [(d.job_id, d.nodes) for d in plan.starts] == [("a", ("solid", "solid"))]
    entry = plan.position("b")
    assert entry is not None and "no room for 4" in entry.reason
