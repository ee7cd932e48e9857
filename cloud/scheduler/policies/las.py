"""LAS, least attained service (Tiresias' continuous form): the job that has received the fewest
device-seconds runs first, and a newcomer preempts a running job that has received more. Needs no
knowledge of job length; short jobs finish quickly because they never accumulate service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.jobs import JobState
from cloud.scheduler.policies.base import Policy, Rank, by_arrival


class Las(Policy):
    name: ClassVar[str] = "las"
    preemptive: ClassVar[bool] = True

    def rank(self, jobs: Sequence[JobState], cluster: ClusterState, now: float) -> list[Rank]:
        ordered = sorted(jobs, key=lambda j: (j.attained_service, *by_arrival(j)))
        return [Rank(j.job_id, f"las: {j.attained_service:.0f} device-s attained") for j in ordered]
