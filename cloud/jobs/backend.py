"""TorchrunBackend: the real ``cloud.scheduler.backend.Backend`` of cloudd. It keeps the scheduler's
view of cloudd's jobs (``JobState`` per active job, the ``ClusterState`` of the configured nodes),
runs a round (``Scheduler.round``) and carries the plan out (``backend.apply``): a start becomes a
run (``runner.Run``, handed to the manager to own), a preemption revokes the run's lease.

A preemption costs a restart (torchrun, the plan, the resume), so a run keeps its lease for a
term: it is revoked only once its trainer has trained ``min_run_s`` since the first step line of
this run (its startup does not count); until then the plan's preemption waits (``applied: false``) and a later
round decides again. Without that, a policy that ranks by service (LAS) would preempt every job
while it starts up, and none would ever train. The cluster is what really runs, not what the plan
wishes: a job holds its devices from its launch
until its torchrun has exited, so a start whose devices a preempted job still holds (it is writing
its checkpoint) waits for a later round, as does one beyond ``max_running``; the round after that
run's end decides again. Attained service, steps and throughput are accounted at every round from
each run's progress, so a policy always sees the service up to now.

Invariant: a job is in ``runs`` exactly while its ``JobState`` is "running" and the cluster holds
its devices; what the manager persists of a job (``attained_service_s``, ``steps_done``,
``throughput``, ``preemptions``) is what its ``JobState`` says when a run ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud.jobs.runner import Run
from cloud.jobs.scheduling import SchedulerSettings
from cloud.jobs.table import JobRow
from cloud.scheduler.backend import apply
from cloud.scheduler.cluster import ClusterState, devices_per_node
from cloud.scheduler.decision import QueueEntry, RoundPlan
from cloud.scheduler.jobs import JobState

log = logging.getLogger(__name__)

UNKNOWN_TOTAL_STEPS = 1  # until the trainer's start line says (a spec with max_steps says at once)


def job_state(row: JobRow) -> JobState:
    """The scheduler's view of a queued or preempted row (at submission or a cloudd restart)."""
    spec = row.spec
    return JobState(
        job_id=row.id,
        devices=int(spec.get("nproc", 1)),
        submitted_at=row.created_ts,
        total_steps=max(int(spec.get("max_steps") or 0), row.steps_done, UNKNOWN_TOTAL_STEPS),
        throughput=dict(row.throughput),
        kind=str(spec.get("model", "")),
        steps_done=float(row.steps_done),
        attained_service=row.attained_service_s,
        status="preempted" if row.state == "preempted" else "queued",
        preemptions=row.preemptions,
        admitted=row.state == "preempted" or row.started_ts is not None,
        started_at=row.started_ts,
        waiting_since=row.created_ts,
    )


class TorchrunBackend:
    def __init__(
        self,
        settings: SchedulerSettings,
        workdir_of: Callable[[str], Path],
        own: Callable[[str, Run], None],
        refuse: Callable[[str, str], None],
        *,
        max_running: int,
        clock: Callable[[], float],
    ) -> None:
        self.settings, self.scheduler = settings, settings.scheduler()
        self.cluster = ClusterState(settings.nodes)
        self.states: dict[str, JobState] = {}
        self.runs: dict[str, Run] = {}
        self.plan: RoundPlan | None = None
        self.decisions: dict[str, dict[str, Any]] = {}  # job -> the last decision about it, and why
        self._workdir_of, self._own, self._refuse = workdir_of, own, refuse
        self.max_running, self.clock = max_running, clock
        self._accounted: dict[str, tuple[float, int]] = {}  # running job -> (time, step) accounted

    # -- the Backend protocol ----------------------------------------------------------------------
    def now(self) -> float:
        return self.clock()

    def admit(self, job_id: str) -> None:
        self.states[job_id].admitted = True

    def refuse(self, job_id: str, reason: str) -> None:
        self.states[job_id].refuse(self.now(), reason)
        self.states.pop(job_id)
        self._refuse(job_id, reason)

    def preempt(self, job_id: str) -> None:
        run = self.runs.get(job_id)
        if run is None or run.revoked:
            return
        if not run.steps or self.now() - run.steps[0][1] < self.settings.min_run_s:
            self.decisions[job_id]["applied"] = False  # within its lease term: a later round revokes
            return
        run.revoke()
        log.info("job %s: lease revoked (%s)", job_id, self.decisions[job_id]["reason"])

    def launch(self, job_id: str, nodes: tuple[str, ...]) -> None:
        state = self.states[job_id]
        if state.status == "running":  # a migration: its run still stops first
            return
        busy = any(self.cluster.free_on(name) < n for name, n in devices_per_node(nodes).items())
        if busy or len(self.runs) >= self.max_running:
            self.decisions[job_id]["applied"] = False  # waits: a preempted job still holds the devices
            return
        now = self.now()
        self.cluster.allocate(job_id, nodes)
        state.start(now, nodes)
        generation = self.cluster.generations_of(nodes)[0]  # the first: one node in practice
        run = Run(nodes, state.devices, generation, now, self._workdir_of(job_id))
        self.runs[job_id] = run
        self._accounted[job_id] = (now, int(state.steps_done))
        self._own(job_id, run)

    # -- rounds ------------------------------------------------------------------------------------
    def add(self, row: JobRow) -> None:
        self.states[row.id] = job_state(row)

    def discard(self, job_id: str) -> None:
        """A waiting job left the queue (cancelled)."""
        self.states.pop(job_id, None)

    def round(self) -> RoundPlan:
        now = self.now()
        for job_id, run in self.runs.items():
            self._account(job_id, run, now)
        plan = self.scheduler.round(self.cluster, list(self.states.values()), now)
        for decision in plan.decisions:
            self.decisions[decision.job_id] = {
                "decision": type(decision).__name__.lower(),
                "reason": decision.reason,
                "time": now,
                "applied": True,
            }
        self.plan = plan
        apply(plan, self, self.cluster, self.states)
        return plan

    def _account(self, job_id: str, run: Run, now: float) -> None:
        """Service and steps of ``run`` since the last accounting; its measured rate."""
        state = self.states[job_id]
        since, step_then = self._accounted[job_id]
        step_now = run.steps[-1][0] if run.steps else step_then
        state.total_steps = max(state.total_steps, run.total_steps or 0, step_now)
        state.progress(max(0.0, now - since), max(0, step_now - step_then), run.generation)
        self._accounted[job_id] = (now, step_now)
        rate = run.steps_per_s()
        if rate is not None:
            state.measured(run.generation, rate)

    def ended(self, job_id: str, outcome: str) -> JobState:
        """A run ended (``preempted``, ``succeeded``, ``failed``, ``cancelled``, or ``queued``: cloudd
        stops): account it, free its devices; the job's state (kept only while it waits again)."""
        run = self.runs.pop(job_id)
        state = self.states[job_id]
        now = self.now()
        self._account(job_id, run, now)
        self._accounted.pop(job_id, None)
        self.cluster.release(job_id)
        if outcome in ("preempted", "queued"):
            state.preempt(now)
            if outcome == "queued":  # a cloudd shutdown is not the policy's preemption
                state.preemptions -= 1
            return state
        if outcome == "succeeded":
            state.finish(now)
        self.states.pop(job_id)
        return state

    def queue_entry(self, job_id: str) -> QueueEntry | None:
        return self.plan.position(job_id) if self.plan is not None else None
