"""A heterogeneity-aware LAS in the spirit of Gavel (Narayanan et al., OSDI'20), round-based.

Who runs is LAS's answer: jobs by least attained service, taken while their demand fits in the
cluster's devices (the round's run set). Where they run is the heterogeneity-aware part: each
generation, fastest first, goes to the run-set jobs with the highest relative speedup there
(``assign_generations``: a greedy allocation matrix with one generation per job per round; with
two generations and equal demands it maximises the sum of throughputs normalised to each job's
slowest generation). Speeds are the jobs' measured throughputs per generation
(``JobState.throughput``); a job with none measured has no preference. A running job's current
generation scores ``stay_bonus`` x higher and it moves to a faster one only for at least that
speedup, so that it migrates (restart cost) for a clear gain. Waiting jobs fall back to other
generations, fastest for them first, rather than wait for their assigned one; running jobs
migrate to it when it has room.

What it leaves out of Gavel: the allocation is not an LP over time fractions (no solver here),
and there is no space sharing; one generation per job per round, the round mechanism doing the
time sharing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.jobs import JobState
from cloud.scheduler.policies.base import Policy, Rank, by_arrival


def relative_speeds(job: JobState, generations: Sequence[str]) -> dict[str, float]:
    """Speed on each generation over the job's slowest one (all 1.0 when nothing is measured)."""
    rates = {g: job.rate_on([g]) or 1.0 for g in generations}
    slowest = min(rates.values())
    return {g: rate / slowest for g, rate in rates.items()}


def assign_generations(
    jobs: Sequence[JobState],
    capacity: Mapping[str, int],
    current: Mapping[str, str],
    stay_bonus: float = 1.25,
) -> dict[str, str]:
    """Job id -> generation. Generations are filled fastest first (mean relative speed over
    ``jobs``); each takes, while its devices last, the jobs whose speed there over their best
    speed on the generations still to come is highest. The slowest takes the rest. A running job
    (``current``: its generation) scores ``stay_bonus`` x higher where it is, and moves to a
    faster generation only for a speedup of at least ``stay_bonus``."""
    speeds = {j.job_id: relative_speeds(j, list(capacity)) for j in jobs}
    order = sorted(capacity, key=lambda g: -sum(s[g] for s in speeds.values()))
    assigned: dict[str, str] = {}
    for index, generation in enumerate(order[:-1]):
        later = order[index + 1 :]

        def advantage(job: JobState, g: str = generation, later: list[str] = later) -> float:
            bonus = stay_bonus if current.get(job.job_id) == g else 1.0
            return bonus * speeds[job.job_id][g] / max(speeds[job.job_id][h] for h in later)

        def worth_moving(job: JobState, g: str = generation) -> bool:
            now_on = current.get(job.job_id, g)
            return now_on == g or speeds[job.job_id][g] >= stay_bonus * speeds[job.job_id][now_on]

        free = capacity[generation]
        for job in sorted((j for j in jobs if j.job_id not in assigned), key=advantage, reverse=True):
            if job.devices <= free and worth_moving(job):
                assigned[job.job_id] = generation
                free -= job.devices
    return assigned | {j.job_id: order[-1] for j in jobs if j.job_id not in assigned}


class Hetero(Policy):
    name: ClassVar[str] = "hetero"
    preemptive: ClassVar[bool] = True

    def __init__(self, stay_bonus: float = 1.25) -> None:
        if not stay_bonus >= 1:
            raise ValueError(f"hetero.stay_bonus: {stay_bonus}; must be >= 1")
        self.stay_bonus = stay_bonus

    def rank(self, jobs: Sequence[JobState], cluster: ClusterState, now: float) -> list[Rank]:
        ordered = sorted(jobs, key=lambda j: (j.attained_service, *by_arrival(j)))
        run_set, room = [], cluster.capacity()
        for job in ordered:
            if job.devices <= room:
                run_set.append(job)
                room -= job.devices
        generations = cluster.generations()
        current = {j.job_id: cluster.generations_of(j.placement)[0] for j in run_set if j.status == "running"}
        capacity = {g: cluster.capacity(g) for g in generations}
        assigned = assign_generations(run_set, capacity, current, self.stay_bonus)
        ranks = []
        for job in ordered:
            speeds = relative_speeds(job, generations)
            fastest_first = tuple(sorted(generations, key=lambda g: -speeds[g]))
            las = f"{job.attained_service:.0f} device-s"
            if job.job_id not in assigned:
                ranks.append(Rank(job.job_id, f"hetero: {las}, not in this round's run set", fastest_first))
                continue
            g = assigned[job.job_id]
            wanted = (g,) if job.status == "running" else (g, *(h for h in fastest_first if h != g))
            ranks.append(Rank(job.job_id, f"hetero: {las}, {speeds[g]:.2f}x on {g}", wanted))
        return ranks
