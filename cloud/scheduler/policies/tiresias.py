"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19).

Attained service is device-seconds (time x devices: the second dimension). ``thresholds`` cut it
into queues: a job starts in queue 0 and is demoted to queue k once its service reaches
``thresholds[k-1]``. Queues are served in order, first-come-first-served inside a queue (so jobs
of one queue do not preempt each other, unlike continuous LAS), and a job of a higher queue
preempts a running job of a lower one. Starvation guard: a waiting job that has waited at least
``starve_factor`` x its executed time (service / devices) goes back to queue 0.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.jobs import JobState
from cloud.scheduler.policies.base import Policy, Rank, by_arrival


class Tiresias(Policy):
    name: ClassVar[str] = "tiresias"
    preemptive: ClassVar[bool] = True

    def __init__(self, thresholds: Sequence[float] = (3600.0, 36000.0), starve_factor: float = 8.0) -> None:
        if not thresholds or any(t <= 0 for t in thresholds) or list(thresholds) != sorted(set(thresholds)):
            raise ValueError(f"tiresias.thresholds: {list(thresholds)}; must be positive and increasing")
        if not starve_factor > 0:
            raise ValueError(f"tiresias.starve_factor: {starve_factor}; must be > 0")
        self.thresholds = tuple(float(t) for t in thresholds)
        self.starve_factor = starve_factor

    def queue_of(self, job: JobState, now: float) -> tuple[int, str]:
        """The job's queue and why (service against the thresholds, or the starvation guard)."""
        queue = bisect.bisect_right(self.thresholds, job.attained_service)
        executed = job.attained_service / job.devices
        waited = now - job.waiting_since
        if queue > 0 and job.status != "running" and waited >= self.starve_factor * executed:
            why = f"waited {waited:.0f}s >= {self.starve_factor:g} x ran {executed:.0f}s"
            return 0, f"tiresias: q0 (promoted: {why})"
        return queue, f"tiresias: q{queue} ({job.attained_service:.0f} device-s)"

    def rank(self, jobs: Sequence[JobState], cluster: ClusterState, now: float) -> list[Rank]:
        queued = [(self.queue_of(j, now), j) for j in jobs]
        queued.sort(key=lambda qj: (qj[0][0], *by_arrival(qj[1])))
        return [Rank(j.job_id, reason) for (_, reason), j in queued]
