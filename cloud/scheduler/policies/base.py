"""The ``Policy`` interface: rank the admitted active jobs; the round does the rest.

A policy is policy only: it orders jobs (highest priority first) and may name the generations a
job should run on; ``round.Scheduler`` walks that order, places, and preempts lower-ranked running
jobs when the policy is preemptive. Policies keep no state between rounds: everything they need
is in ``JobState`` (attained service, service per generation, waiting time, throughput), so the
same round gives the same plan in the simulator and in cloudd.

Invariant: ``rank`` returns every job it was given exactly once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.jobs import JobState


@dataclass(frozen=True)
class Rank:
    job_id: str
    reason: str  # why it sits here (shown in the queue: "las: 120 device-s attained")
    generations: tuple[str, ...] = ()  # where it may run, preferred first; () = anywhere


class Policy(ABC):
    name: ClassVar[str]
    preemptive: ClassVar[bool] = False  # may a higher-ranked job take a lower-ranked one's devices
    backfill: ClassVar[bool] = True  # may a job start while one ranked above it waits for room

    @abstractmethod
    def rank(self, jobs: Sequence[JobState], cluster: ClusterState, now: float) -> list[Rank]:
        """``jobs``: the admitted active ones (queued, preempted, running). Highest priority first."""


def by_arrival(job: JobState) -> tuple[float, str]:
    """The tie-break every policy uses: earlier submission first, then the id."""
    return (job.submitted_at, job.job_id)
