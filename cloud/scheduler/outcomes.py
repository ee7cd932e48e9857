"""What a finished run measured: pure functions over the jobs and the device-time accounting.

    jct            job completion time: finished_at - submitted_at
    queueing delay first start - submission
    waiting        JCT - time holding devices (attained service / devices): all the time a job
                   spent queued or preempted, not only before its first start
    makespan       last finish - first submission
    utilisation    device-seconds held by jobs / (devices x makespan); ``useful`` counts only the
                   time jobs made progress (restart overhead excluded); ``while_arriving`` is over
                   first to last submission only (the load the trace offers, before its tail drains)
    finish-time fairness (Themis, NSDI'20; Gavel's form): rho = JCT / T_fair, where
                   T_fair = T_alone x max(1, N x d / C): T_alone is the job's run time alone on its
                   fastest generation, N the time-averaged number of active jobs while it was in
                   the system (itself included), d its devices and C the cluster's. 1/N of the
                   cluster is its fair share, and it cannot use more than its d devices, so
                   rho <= 1 means it did at least as well as that share; lower is better.

Invariant: ``summarize`` reads only finished jobs; refused jobs are counted apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cloud.scheduler.jobs import JobState


@dataclass
class RunRecord:
    jobs: list[JobState]
    capacity: int
    busy_device_s: float  # device-seconds held by jobs (restart overhead included)
    useful_device_s: float  # device-seconds spent making progress
    active_integral: dict[str, tuple[float, float]] = field(
        default_factory=dict
    )  # job -> (at submit, at end)
    busy_until_last_arrival: float = 0.0  # busy_device_s accrued up to the last arrival
    last_arrival_s: float = 0.0
    rounds: int = 0
    counters: dict[str, float] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def finish_time_fairness(job: JobState, active_jobs: float, capacity: int) -> float:
    rate = job.best_rate()
    if rate is None or job.finished_at is None:
        return math.nan
    alone = job.total_steps / rate
    fair = alone * max(1.0, active_jobs * job.devices / capacity)
    return (job.finished_at - job.submitted_at) / fair


def summarize(record: RunRecord) -> dict[str, float]:
    jobs, capacity = record.jobs, record.capacity
    done = [j for j in jobs if j.status == "done" and j.finished_at is not None and j.started_at is not None]
    jct = [j.finished_at - j.submitted_at for j in done if j.finished_at is not None]
    queueing = [j.started_at - j.submitted_at for j in done if j.started_at is not None]
    waiting = [t - j.attained_service / j.devices for t, j in zip(jct, done, strict=True)]
    start = min((j.submitted_at for j in jobs), default=0.0)
    end = max((j.finished_at for j in done if j.finished_at is not None), default=start)
    makespan = end - start
    rho = []
    for job in done:
        at_submit, at_end = record.active_integral.get(job.job_id, (math.nan, math.nan))
        lifetime = (job.finished_at or 0.0) - job.submitted_at
        active = (at_end - at_submit) / lifetime if lifetime > 0 else 1.0
        rho.append(finish_time_fairness(job, active, capacity))
    rho = [r for r in rho if not math.isnan(r)]
    return {
        "jobs_done": float(len(done)),
        "jobs_refused": float(sum(1 for j in jobs if j.status == "refused")),
        "avg_jct_s": mean(jct),
        "p95_jct_s": percentile(jct, 95),
        "makespan_s": makespan,
        "utilisation": record.busy_device_s / (capacity * makespan) if makespan > 0 else math.nan,
        "useful_utilisation": record.useful_device_s / (capacity * makespan) if makespan > 0 else math.nan,
        "utilisation_while_arriving": (
            record.busy_until_last_arrival / (capacity * (record.last_arrival_s - start))
            if record.last_arrival_s > start
            else math.nan
        ),
        "avg_queueing_s": mean(queueing),
        "p95_queueing_s": percentile(queueing, 95),
        "avg_waiting_s": mean(waiting),
        "avg_ftf_rho": mean(rho),
        "max_ftf_rho": max(rho, default=math.nan),
        "preemptions": float(sum(j.preemptions for j in jobs)),
    }
