"""The ``Backend`` protocol: what runs a round's plan. The simulator (``sim.py``) implements it over
a trace; cloudd's ``JobManager`` implements it with torchrun jobs.

``apply`` is the one order in which every backend carries out a plan: refusals and admissions,
then preemptions (so that their devices are free), then starts. A job both preempted and started
in one plan is migrating between generations.

Invariant: ``apply`` calls ``launch`` only for plans that ``decision.validate`` accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.decision import RoundPlan, validate
from cloud.scheduler.jobs import JobState


class Backend(Protocol):
    def now(self) -> float:
        """Seconds on the backend's clock (simulated or wall)."""
        ...

    def admit(self, job_id: str) -> None:
        """The job passed admission (mark it, e.g. ``JobState.admitted = True``)."""
        ...

    def refuse(self, job_id: str, reason: str) -> None:
        """Admission turned the job away for good (``JobState.refuse``)."""
        ...

    def preempt(self, job_id: str) -> None:
        """Stop the job at its next step boundary, keeping its progress (checkpoint)."""
        ...

    def launch(self, job_id: str, nodes: tuple[str, ...]) -> None:
        """Start (or resume) the job on ``nodes`` (one entry per device)."""
        ...


def apply(plan: RoundPlan, backend: Backend, cluster: ClusterState, jobs: Mapping[str, JobState]) -> None:
    validate(plan, cluster, jobs)
    for refusal in plan.refused:
        backend.refuse(refusal.job_id, refusal.reason)
    for job_id in plan.admitted:
        backend.admit(job_id)
    for preempt in plan.preempts:
        backend.preempt(preempt.job_id)
    for start in plan.starts:
        backend.launch(start.job_id, start.nodes)
