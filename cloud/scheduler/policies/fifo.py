"""FIFO: jobs run in submission order; no preemption and no backfill (strict head of line), which
is what "first come, first served" means for a gang-scheduled job: a small job never overtakes a
large one waiting for room."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.jobs import JobState
from cloud.scheduler.policies.base import Policy, Rank, by_arrival


class Fifo(Policy):
    name: ClassVar[str] = "fifo"
    preemptive: ClassVar[bool] = False
    backfill: ClassVar[bool] = False

    def rank(self, jobs: Sequence[JobState], cluster: ClusterState, now: float) -> list[Rank]:
        ordered = sorted(jobs, key=by_arrival)
        return [Rank(j.job_id, f"fifo: submitted at {j.submitted_at:.0f}s") for j in ordered]
