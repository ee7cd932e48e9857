"""Small hand-made clusters and jobs for the scheduler's tests."""

from __future__ import annotations

from cloud.scheduler.cluster import ClusterState, Node
from cloud.scheduler.jobs import JobState


def cluster(*spec: tuple[str, int, str]) -> ClusterState:
    return ClusterState([Node(name, devices, generation) for name, devices, generation in spec])


def job(job_id: str, devices: int = 1, at: float = 0.0, steps: int = 100, **kw: object) -> JobState:
    throughput = kw.pop("throughput", {"g": 1.0})
    return JobState(job_id, devices, at, steps, throughput=throughput, **kw)  # type: ignore[arg-type]


def running(j: JobState, c: ClusterState, nodes: tuple[str, ...], now: float = 0.0) -> JobState:
    j.admitted = True
    j.start(now, nodes)
    c.allocate(j.job_id, nodes)
    return j
