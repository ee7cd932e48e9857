"""A round's plan as data: what to start where, what to preempt, the queue order and why.

``RoundPlan.text()`` prints one line per decision (``start j3 on n0x2,n1x2 (las: 12 dev-s)``,
``preempt j1 (las: ...)``); ``validate`` checks a plan against the cluster and jobs before a
backend applies it.

Invariant (checked by ``validate``): a plan preempts only running jobs, starts only admitted
queued or preempted jobs (or a job it preempts: a migration) on exactly their demand, and after
its preemptions every start fits in the free devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from cloud.scheduler.cluster import ClusterState, devices_per_node
from cloud.scheduler.jobs import JobState


@dataclass(frozen=True)
class Start:
    job_id: str
    nodes: tuple[str, ...]  # one entry per device
    reason: str = ""

    def text(self) -> str:
        where = ",".join(f"{name}x{count}" for name, count in devices_per_node(self.nodes).items())
        return f"start {self.job_id} on {where}" + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Preempt:
    job_id: str
    reason: str

    def text(self) -> str:
        return f"preempt {self.job_id} ({self.reason})"


Decision = Start | Preempt

QueueState = Literal["running", "starting", "waiting", "held"]


@dataclass(frozen=True)
class QueueEntry:
    """Where an active job stands after the round: ``position`` counts from 0 over all of them in
    the policy's order (held jobs, not admitted yet, come last)."""

    job_id: str
    position: int
    state: QueueState
    reason: str


@dataclass(frozen=True)
class Refusal:
    """Admission turned the job away for good (it will never run)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class RoundPlan:
    now: float
    policy: str
    decisions: tuple[Decision, ...] = ()
    order: tuple[QueueEntry, ...] = ()
    admitted: tuple[str, ...] = ()  # jobs admission accepted in this round
    refused: tuple[Refusal, ...] = ()

    @property
    def starts(self) -> tuple[Start, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Start))

    @property
    def preempts(self) -> tuple[Preempt, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Preempt))

    def position(self, job_id: str) -> QueueEntry | None:
        return next((e for e in self.order if e.job_id == job_id), None)

    def text(self) -> str:
        lines = [f"round t={self.now:.1f} policy={self.policy}"]
        lines += [f"  refuse {r.job_id} ({r.reason})" for r in self.refused]
        lines += [f"  {d.text()}" for d in self.decisions]
        lines += [f"  #{e.position} {e.job_id} {e.state}: {e.reason}" for e in self.order]
        return "\n".join(lines)


class PlanError(ValueError):
    """A plan that must not run; the message names the decision."""


def validate(plan: RoundPlan, cluster: ClusterState, jobs: Mapping[str, JobState]) -> None:
    """Raise ``PlanError`` unless the invariant above holds (``cluster`` is not changed)."""
    trial = cluster.copy()
    admitted, preempted = set(plan.admitted), set()
    for preempt in plan.preempts:
        job = jobs.get(preempt.job_id)
        if job is None or job.status != "running":
            raise PlanError(f"{preempt.text()}: the job is not running")
        trial.release(preempt.job_id)
        preempted.add(preempt.job_id)
    for decision in plan.starts:
        job = jobs.get(decision.job_id)
        if job is None or not (job.status in ("queued", "preempted") or job.job_id in preempted):
            raise PlanError(f"{decision.text()}: the job is not queued or preempted")
        if not (job.admitted or job.job_id in admitted):
            raise PlanError(f"{decision.text()}: the job was not admitted")
        if len(decision.nodes) != job.devices:
            raise PlanError(f"{decision.text()}: {len(decision.nodes)} devices for a demand of {job.devices}")
        try:
            trial.allocate(decision.job_id, decision.nodes)
        except ValueError as exc:
            raise PlanError(f"{decision.text()}: {exc}") from None
