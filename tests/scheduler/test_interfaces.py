"""The scheduler's data and interfaces: cluster accounting, job transitions, plans, composition."""

from __future__ import annotations

import pytest

from cloud.scheduler.backend import apply
from cloud.scheduler.cluster import ClusterState, Node, devices_per_node
from cloud.scheduler.decision import PlanError, Preempt, RoundPlan, Start, validate
from cloud.scheduler.round import Scheduler
from tests.scheduler.helpers import cluster, job, running


def test_cluster_allocates_within_capacity_and_releases() -> None:
    c = cluster(("a", 4, "old"), ("b", 4, "new"))
    c.allocate("j1", ("a", "a", "b"))
    assert (c.free(), c.free("old"), c.free("new"), c.used()) == (5, 2, 3, 3)
    assert devices_per_node(c.placement_of("j1")) == {"a": 2, "b": 1}
    with pytest.raises(ValueError, match="wants 3 devices on 'a', 2 free"):
        c.allocate("j2", ("a", "a", "a"))
    assert c.release("j1") == ("a", "a", "b")
    assert c.free() == 8


def test_cluster_refuses_bad_nodes_naming_the_field() -> None:
    with pytest.raises(ValueError, match="node.devices"):
        Node("a", 0, "g")
    with pytest.raises(ValueError, match="duplicate"):
        ClusterState([Node("a", 1, "g"), Node("a", 2, "g")])


def test_job_transitions_and_accounting() -> None:
    j = job("j", devices=2, steps=10, throughput={"old": 1.0, "new": 2.0})
    assert j.remaining_time("new") == 5.0 and j.rate_on(["old", "new"]) == 1.0
    j.start(1.0, ("a", "a"))
    j.progress(3.0, 4.0, "new")
    assert (j.attained_service, j.steps_done) == (6.0, 4.0)
    j.preempt(4.0)
    assert (j.status, j.preemptions, j.waiting_since, j.placement) == ("preempted", 1, 4.0, ())
    with pytest.raises(ValueError, match="preempt"):
        j.preempt(5.0)
    j.start(5.0, ("b", "b"))
    j.finish(9.0)
    assert (j.status, j.started_at, j.finished_at, j.steps_done) == ("done", 1.0, 9.0, 10.0)
    with pytest.raises(ValueError, match="throughput"):
        job("k", throughput={"g": 0.0})


def test_validate_rejects_a_start_that_does_not_fit() -> None:
    c = cluster(("a", 2, "g"))
    r = running(job("r"), c, ("a",))
    q = job("q", devices=2, admitted=True)
    jobs = {"r": r, "q": q}
    with pytest.raises(PlanError, match="start q on ax2"):
        validate(RoundPlan(0.0, "x", (Start("q", ("a", "a")),)), c, jobs)
    validate(RoundPlan(0.0, "x", (Preempt("r", "why"), Start("q", ("a", "a")))), c, jobs)
    with pytest.raises(PlanError, match="not running"):
        validate(RoundPlan(0.0, "x", (Preempt("q", "why"),)), c, jobs)


def test_from_names_composes_and_rejects_unknown_names() -> None:
    s = Scheduler.from_names(policy="las", placement="first_fit", admission="user_quota")
    assert (s.policy.name, s.placement.name, s.admission.name) == ("las", "first_fit", "user_quota")
    with pytest.raises(ValueError, match=r"scheduler.policy: unknown 'nope' \(known: .*fifo"):
        Scheduler.from_names(policy="nope")
    with pytest.raises(ValueError, match="scheduler.admission_options"):
        Scheduler.from_names(admission="accept_all", admission_options={"x": 1})


class RecordingBackend:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def now(self) -> float:
        return 0.0

    def admit(self, job_id: str) -> None:
        self.calls.append(("admit", job_id))

    def refuse(self, job_id: str, reason: str) -> None:
        self.calls.append(("refuse", job_id))

    def preempt(self, job_id: str) -> None:
        self.calls.append(("preempt", job_id))

    def launch(self, job_id: str, nodes: tuple[str, ...]) -> None:
        self.calls.append(("launch", job_id, *nodes))


def test_fifo_round_starts_in_order_and_backend_applies_it() -> None:
    c = cluster(("a", 2, "g"))
    jobs = [job("j1", devices=2, at=0.0), job("j2", devices=1, at=1.0)]
    plan = Scheduler.from_names(policy="fifo").round(c, jobs, now=2.0)
    assert [d.job_id for d in plan.starts] == ["j1"]
    assert [(e.job_id, e.state) for e in plan.order] == [("j1", "starting"), ("j2", "waiting")]
    backend = RecordingBackend()
    apply(plan, backend, c, {j.job_id: j for j in jobs})
    assert backend.calls == [("admit", "j1"), ("admit", "j2"), ("launch", "j1", "a", "a")]
    assert "start j1 on ax2" in plan.text()
