"""SRTF, shortest remaining time first: the job with the least time left runs first and preempts a
running job with more. Time left = remaining steps / the job's throughput on its fastest measured
generation (what it would need alone). Jobs with no throughput measured yet cannot be estimated:
they come after the estimated ones, fewest remaining steps first."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.jobs import JobState
from cloud.scheduler.policies.base import Policy, Rank, by_arrival


class Srtf(Policy):
    name: ClassVar[str] = "srtf"
    preemptive: ClassVar[bool] = True

    def rank(self, jobs: Sequence[JobState], cluster: ClusterState, now: float) -> list[Rank]:
        def key(job: JobState) -> tuple[float, float, float, str]:
            left = job.remaining_time()
            return (math.inf if left is None else left, job.remaining_steps, *by_arrival(job))

        return [Rank(j.job_id, _reason(j)) for j in sorted(jobs, key=key)]


def _reason(job: JobState) -> str:
    left = job.remaining_time()
    if left is None:
        return f"srtf: no throughput measured, {job.remaining_steps:.0f} steps left"
    return f"srtf: {left:.0f}s left"
