"""Round metrics: what the scheduler counts as it plans, one class per collector, and their registry.

``Counters`` (the default) counts rounds, starts, preemptions, migrations, refusals and holds, and
keeps the last plan's queue; cloudd exports them, the simulator reports them. The figures over
finished jobs (JCT, makespan, fairness) are pure functions in ``outcomes.py``.

Invariant: counters only grow.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.decision import RoundPlan
from cloud.scheduler.jobs import JobState


class Metrics(ABC):
    name: ClassVar[str]

    @abstractmethod
    def record(self, plan: RoundPlan, cluster: ClusterState, jobs: Sequence[JobState]) -> None:
        """Called with every plan the scheduler returns, before any backend applies it."""

    @abstractmethod
    def snapshot(self) -> dict[str, float]:
        """The figures so far, by name."""


class Counters(Metrics):
    name: ClassVar[str] = "counters"

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.last_plan: RoundPlan | None = None

    def record(self, plan: RoundPlan, cluster: ClusterState, jobs: Sequence[JobState]) -> None:
        started = {d.job_id for d in plan.starts}
        self.counts["rounds"] += 1
        self.counts["starts"] += len(plan.starts)
        self.counts["preemptions"] += len(plan.preempts)
        self.counts["migrations"] += sum(1 for d in plan.preempts if d.job_id in started)
        self.counts["admitted"] += len(plan.admitted)
        self.counts["refused"] += len(plan.refused)
        self.counts["held_rounds"] += sum(1 for e in plan.order if e.state == "held")
        self.last_plan = plan

    def snapshot(self) -> dict[str, float]:
        return {k: float(v) for k, v in sorted(self.counts.items())}


METRICS: dict[str, type[Metrics]] = {cls.name: cls for cls in (Counters,)}
