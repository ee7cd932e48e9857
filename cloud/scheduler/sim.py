"""The simulator backend: the same ``Scheduler`` over a trace, event by event, on simulated time.

Events are arrivals, completions and round ticks (every ``round_s`` while jobs are active); with
``rounds_on_events`` a round also runs at each arrival and completion, as cloudd does. A job
(re)started pays ``restart_overhead_s`` holding its devices before it makes progress (loading its
checkpoint, rendezvous), then runs at ``JobState.rate_on`` of its placement's generations: the
slowest of them; after its last step it holds them ``finish_overhead_s`` more (export) before it
is done. As in cloudd, ``min_run_s`` (when > 0) is a run's lease term: a preemption of a run
that has made progress for less than that (still starting up included) is not carried out
(counted ``deferred_preemptions``; a later round decides again), nor is a preemption of a job
past its last step, and a start whose devices are still held waits for a later round.
``Simulation.run`` returns the jobs and the device-time accounting (``outcomes.RunRecord``) that
``outcomes.summarize`` turns into the report.

Invariant: at every instant the devices held never exceed the cluster's (``ClusterState``
enforces it) and every job of the trace ends done or refused when ``run`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cloud.scheduler.backend import apply
from cloud.scheduler.cluster import ClusterState, Node, devices_per_node
from cloud.scheduler.jobs import JobState
from cloud.scheduler.outcomes import RunRecord
from cloud.scheduler.round import Scheduler
from cloud.scheduler.trace import TraceJob

_EPS = 1e-9


@dataclass(frozen=True)
class SimConfig:
    round_s: float = 300.0
    restart_overhead_s: float = 30.0
    rounds_on_events: bool = True
    finish_overhead_s: float = 0.0
    min_run_s: float = 0.0
    max_rounds: int = 10_000_000  # a policy that never finishes the trace is an error, not a hang

    def __post_init__(self) -> None:
        if not self.round_s > 0:
            raise ValueError(f"sim.round_s: {self.round_s}; must be > 0")
        for name in ("restart_overhead_s", "finish_overhead_s", "min_run_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"sim.{name}: {getattr(self, name)}; must be >= 0")


class Simulation:
    """One run of a trace; implements ``backend.Backend``."""

    def __init__(
        self, nodes: Sequence[Node], trace: Sequence[TraceJob], scheduler: Scheduler, config: SimConfig
    ) -> None:
        self.cluster = ClusterState(nodes)
        self.scheduler, self.config = scheduler, config
        self.pending = sorted(trace, key=lambda j: (j.submit_s, j.job_id))
        self.jobs: dict[str, JobState] = {}
        self.clock = 0.0
        self.ready_at: dict[str, float] = {}  # running job -> when its restart overhead ends
        self.speed: dict[str, tuple[float, str]] = {}  # running job -> (steps/s, generation) where placed
        self.live: dict[str, JobState] = {}  # jobs arrived and not done or refused
        self.tail_until: dict[str, float] = {}  # running job past its last step -> when it is done
        self.deferred = 0  # preemptions not carried out (lease term, or past the last step)
        self.busy = self.useful = 0.0
        self.active_area = 0.0  # integral over time of the number of active jobs
        self.marks: dict[str, tuple[float, float]] = {}
        self.busy_at_last_arrival = 0.0

    # -- Backend -----------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock

    def admit(self, job_id: str) -> None:
        self.jobs[job_id].admitted = True

    def refuse(self, job_id: str, reason: str) -> None:
        self.jobs[job_id].refuse(self.clock, reason)
        self._close_mark(job_id)
        del self.live[job_id]

    def preempt(self, job_id: str) -> None:
        young = self.config.min_run_s > 0 and self.clock - self.ready_at[job_id] < self.config.min_run_s
        if job_id in self.tail_until or young:  # as cloudd: no preemption before a run's first step
            self.deferred += 1
            return
        self.jobs[job_id].preempt(self.clock)
        self.cluster.release(job_id)
        self.ready_at.pop(job_id, None)
        self.speed.pop(job_id, None)

    def launch(self, job_id: str, nodes: tuple[str, ...]) -> None:
        job = self.jobs[job_id]
        wanted = devices_per_node(nodes).items()
        if job.status == "running" or any(self.cluster.free_on(name) < n for name, n in wanted):
            return  # its own or another's preemption was deferred: a later round decides again
        self.cluster.allocate(job_id, nodes)
        job.start(self.clock, nodes)
        self.ready_at[job_id] = self.clock + self.config.restart_overhead_s
        generations = self.cluster.generations_of(nodes)
        rate = job.rate_on(generations)
        if rate is None:
            raise ValueError(f"sim: job {job_id!r} has no throughput in the trace")
        self.speed[job_id] = (rate, generations[0])

    # -- the event loop ----------------------------------------------------------------------------
    def run(self) -> RunRecord:
        next_tick, rounds, arrivals = 0.0, 0, 0
        while arrivals < len(self.pending) or self._active():
            if rounds >= self.config.max_rounds:
                raise RuntimeError(
                    f"sim: {rounds} rounds and jobs still active (policy {self.scheduler.policy.name})"
                )
            if not self._active():  # idle: jump to the next arrival
                next_tick = max(next_tick, self.pending[arrivals].submit_s)
            upcoming = [next_tick, self._next_completion()]
            if arrivals < len(self.pending):
                upcoming.append(self.pending[arrivals].submit_s)
            t = min(upcoming)
            self._advance(t)
            event = self._complete()
            while arrivals < len(self.pending) and self.pending[arrivals].submit_s <= t + _EPS:
                self._arrive(self.pending[arrivals])
                arrivals, event = arrivals + 1, True
                self.busy_at_last_arrival = self.busy
            tick = t >= next_tick - _EPS
            if tick:
                next_tick = t + self.config.round_s
            if tick or (event and self.config.rounds_on_events):
                plan = self.scheduler.round(self.cluster, list(self.live.values()), t)
                apply(plan, self, self.cluster, self.jobs)
                rounds += 1
        return RunRecord(
            list(self.jobs.values()),
            self.cluster.capacity(),
            self.busy,
            self.useful,
            dict(self.marks),
            self.busy_at_last_arrival,
            self.pending[-1].submit_s if self.pending else 0.0,
            rounds,
            self.scheduler.metrics.snapshot() | {"deferred_preemptions": float(self.deferred)},
        )

    def _active(self) -> bool:
        return bool(self.live)

    def _running(self) -> list[JobState]:
        return [self.jobs[job_id] for job_id in self.ready_at]

    def _rate(self, job: JobState) -> float:
        return self.speed[job.job_id][0]

    def _next_completion(self) -> float:
        """The next time a running job makes its last step or ends its finishing tail."""
        ends = [
            self.tail_until[j.job_id]
            if j.job_id in self.tail_until
            else max(self.clock, self.ready_at[j.job_id]) + j.remaining_steps / self._rate(j)
            for j in self._running()
        ]
        return min(ends, default=math.inf)

    def _advance(self, t: float) -> None:
        dt = t - self.clock
        if dt < 0:
            raise AssertionError(f"sim: time went back from {self.clock} to {t}")
        self.active_area += dt * len(self.live)
        for job in self._running():
            working = (
                0.0
                if job.job_id in self.tail_until
                else max(0.0, t - max(self.clock, self.ready_at[job.job_id]))
            )
            rate, generation = self.speed[job.job_id]
            job.progress(dt, working * rate, generation)
            self.busy += dt * job.devices
            self.useful += working * job.devices
        self.clock = t

    def _complete(self) -> bool:
        # Steps are over when less than a microsecond of work is left (float steps never reach the
        # total exactly); the job is done once its finishing tail is over too.
        for job in self._running():
            over = self.clock >= self.ready_at[job.job_id] and job.remaining_steps / self._rate(job) < 1e-6
            if over and job.job_id not in self.tail_until:
                self.tail_until[job.job_id] = self.clock + self.config.finish_overhead_s
        done = [j for j in self._running() if self.tail_until.get(j.job_id, math.inf) <= self.clock + _EPS]
        for job in done:
            del self.tail_until[job.job_id]
            job.finish(self.clock)
            self.cluster.release(job.job_id)
            del self.ready_at[job.job_id], self.speed[job.job_id]
            self._close_mark(job.job_id)
            del self.live[job.job_id]
        return bool(done)

    def _arrive(self, spec: TraceJob) -> None:
        job = JobState(
            spec.job_id,
            spec.devices,
            spec.submit_s,
            spec.total_steps,
            dict(spec.throughput),
            spec.user,
            spec.kind,
        )
        self.jobs[job.job_id] = job
        self.live[job.job_id] = job
        self.marks[job.job_id] = (self.active_area, math.nan)

    def _close_mark(self, job_id: str) -> None:
        self.marks[job_id] = (self.marks[job_id][0], self.active_area)


def simulate(
    nodes: Sequence[Node], trace: Sequence[TraceJob], scheduler: Scheduler, config: SimConfig | None = None
) -> RunRecord:
    return Simulation(nodes, trace, scheduler, config or SimConfig()).run()
