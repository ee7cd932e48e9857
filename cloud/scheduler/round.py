"""The scheduling round: admission, then the policy's order, then placement (and preemption).

``Scheduler.round(cluster, jobs, now)`` is pure: it reads the state and returns a ``RoundPlan``;
the backend applies it (``backend.apply``). The walk over the policy's order:

- a running job ranked here keeps its devices, unless the policy names generations it is not on
  and room there exists: then it migrates (preempt + start in the same plan);
- a waiting job is placed on free devices (on the generations the policy names, in its order of
  preference); failing that, a preemptive policy frees devices of running jobs ranked below it,
  lowest first, and gives back any it did not need; a policy without backfill stops starting jobs
  at the first that does not fit (head of line).

Invariant: the plan passes ``decision.validate`` and never preempts a job ranked above one it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cloud.scheduler.admission import ADMISSIONS, Admission
from cloud.scheduler.cluster import ClusterState, Node
from cloud.scheduler.decision import Decision, Preempt, QueueEntry, Refusal, RoundPlan, Start
from cloud.scheduler.jobs import JobState
from cloud.scheduler.metrics import METRICS, Metrics
from cloud.scheduler.placement import PLACEMENTS, NodeFilter, Placement
from cloud.scheduler.policies import POLICIES, Policy, Rank
from cloud.scheduler.policies.base import by_arrival

JobNodeFilter = Callable[[JobState, Node], bool]  # the hook for topology/reliability classes


def _pick(kind: str, registry: Mapping[str, type[Any]], name: str, options: Mapping[str, Any] | None) -> Any:
    if name not in registry:
        raise ValueError(f"scheduler.{kind}: unknown {name!r} (known: {', '.join(sorted(registry))})")
    try:
        return registry[name](**(options or {}))
    except TypeError as exc:
        raise ValueError(f"scheduler.{kind}_options: {exc}") from None


class Scheduler:
    def __init__(
        self,
        admission: Admission,
        policy: Policy,
        placement: Placement,
        metrics: Metrics | None = None,
        node_filter: JobNodeFilter | None = None,
    ) -> None:
        self.admission, self.policy, self.placement = admission, policy, placement
        self.metrics: Metrics = metrics if metrics is not None else METRICS["counters"]()
        self.node_filter = node_filter

    @classmethod
    def from_names(
        cls,
        policy: str = "fifo",
        placement: str = "consolidated",
        admission: str = "accept_all",
        metrics: str = "counters",
        *,
        policy_options: Mapping[str, Any] | None = None,
        admission_options: Mapping[str, Any] | None = None,
        node_filter: JobNodeFilter | None = None,
    ) -> Scheduler:
        """Compose by registry names; an unknown name raises ``ValueError`` listing the known ones."""
        return cls(
            _pick("admission", ADMISSIONS, admission, admission_options),
            _pick("policy", POLICIES, policy, policy_options),
            _pick("placement", PLACEMENTS, placement, None),
            _pick("metrics", METRICS, metrics, None),
            node_filter,
        )

    def round(self, cluster: ClusterState, jobs: Sequence[JobState], now: float) -> RoundPlan:
        _check_consistent(cluster, jobs)
        admitted, refused, held = self._admit(cluster, jobs)
        candidates = [j for j in jobs if j.active and (j.admitted or j.job_id in admitted)]
        ranking = self.policy.rank(candidates, cluster, now)
        _check_ranking(self.policy.name, ranking, candidates)
        walk = _Walk(self, cluster, {j.job_id: j for j in candidates}, ranking)
        order = walk.run()
        order += [
            QueueEntry(job_id, len(order) + i, "held", reason) for i, (job_id, reason) in enumerate(held)
        ]
        plan = RoundPlan(now, self.policy.name, tuple(walk.decisions), tuple(order), tuple(admitted), refused)
        self.metrics.record(plan, cluster, jobs)
        return plan

    def _admit(
        self, cluster: ClusterState, jobs: Sequence[JobState]
    ) -> tuple[list[str], tuple[Refusal, ...], list[tuple[str, str]]]:
        inside = [j for j in jobs if j.active and j.admitted]
        admitted: list[str] = []
        refused: list[Refusal] = []
        held: list[tuple[str, str]] = []
        for job in sorted((j for j in jobs if j.status == "queued" and not j.admitted), key=by_arrival):
            verdict = self.admission.admit(job, inside, cluster)
            if verdict.accept:
                admitted.append(job.job_id)
                inside.append(job)
            elif verdict.final:
                refused.append(Refusal(job.job_id, verdict.reason))
            else:
                held.append((job.job_id, verdict.reason))
        return admitted, tuple(refused), held

    def allowed(self, job: JobState, generation: str | None) -> NodeFilter:
        hook = self.node_filter

        def allowed(node: Node) -> bool:
            on_generation = generation is None or node.generation == generation
            return on_generation and (hook is None or hook(job, node))

        return allowed


class _Walk:
    """One pass over the policy's order on a trial copy of the cluster."""

    def __init__(
        self, scheduler: Scheduler, cluster: ClusterState, jobs: Mapping[str, JobState], ranking: list[Rank]
    ) -> None:
        self.s, self.trial, self.jobs, self.ranking = scheduler, cluster.copy(), jobs, ranking
        self.decisions: list[Decision] = []
        self.preempted: dict[str, str] = {}  # victim -> the job it made room for
        self.head_of_line: str | None = None

    def run(self) -> list[QueueEntry]:
        return [self._visit(index, rank) for index, rank in enumerate(self.ranking)]

    def _visit(self, index: int, rank: Rank) -> QueueEntry:
        job = self.jobs[rank.job_id]
        if job.job_id in self.preempted:
            return QueueEntry(
                job.job_id, index, "waiting", f"{rank.reason}; preempted for {self.preempted[job.job_id]}"
            )
        if job.status == "running":
            return self._keep_or_migrate(index, rank, job)
        if self.head_of_line is not None:
            return QueueEntry(job.job_id, index, "waiting", f"{rank.reason}; behind {self.head_of_line}")
        nodes = self._place(job, rank, self.trial)
        if nodes is None and self.s.policy.preemptive:
            nodes = self._make_room(index, rank, job)
        if nodes is None:
            if not self.s.policy.backfill:
                self.head_of_line = job.job_id
            where = f" on {'/'.join(rank.generations)}" if rank.generations else ""
            return QueueEntry(
                job.job_id, index, "waiting", f"{rank.reason}; no room for {job.devices}{where}"
            )
        self.trial.allocate(job.job_id, nodes)
        self.decisions.append(Start(job.job_id, nodes, rank.reason))
        return QueueEntry(job.job_id, index, "starting", rank.reason)

    def _keep_or_migrate(self, index: int, rank: Rank, job: JobState) -> QueueEntry:
        current = self.trial.generations_of(job.placement)
        if not rank.generations or set(current) <= set(rank.generations):
            return QueueEntry(job.job_id, index, "running", rank.reason)
        moved = self.trial.copy()
        moved.release(job.job_id)
        nodes = self._place(job, rank, moved)
        if nodes is None:
            return QueueEntry(job.job_id, index, "running", f"{rank.reason}; stays on {'/'.join(current)}")
        moved.allocate(job.job_id, nodes)
        self.trial = moved
        reason = f"migrate to {'/'.join(self.trial.generations_of(nodes))}: {rank.reason}"
        self.decisions += [Preempt(job.job_id, reason), Start(job.job_id, nodes, reason)]
        return QueueEntry(job.job_id, index, "starting", reason)

    def _place(self, job: JobState, rank: Rank, cluster: ClusterState) -> tuple[str, ...] | None:
        for generation in rank.generations or (None,):
            nodes = self.s.placement.place(job, cluster, self.s.allowed(job, generation))
            if nodes is not None:
                return nodes
        return None

    def _make_room(self, index: int, rank: Rank, job: JobState) -> tuple[str, ...] | None:
        below = [r.job_id for r in self.ranking[index + 1 :]]
        victims = [v for v in reversed(below) if self.jobs[v].status == "running" and v not in self.preempted]
        trial, taken = self.trial.copy(), []
        for victim in victims:
            taken.append((victim, trial.release(victim)))
            if self._place(job, rank, trial) is not None:
                break
        else:
            return None
        for victim, placement in list(reversed(taken))[1:]:  # give back what was not needed
            spare = trial.copy()
            spare.allocate(victim, placement)
            if self._place(job, rank, spare) is not None:
                trial = spare
                taken.remove((victim, placement))
        self.trial = trial
        for victim, _ in taken:
            self.preempted[victim] = job.job_id
            self.decisions.append(
                Preempt(victim, f"{self.s.policy.name}: {job.job_id} ranks higher ({rank.reason})")
            )
        return self._place(job, rank, trial)


def _check_consistent(cluster: ClusterState, jobs: Sequence[JobState]) -> None:
    for job in jobs:
        if job.status == "running" and sorted(cluster.placement_of(job.job_id)) != sorted(job.placement):
            raise ValueError(
                f"round: job {job.job_id!r} runs on {job.placement} but the cluster gives it "
                f"{cluster.placement_of(job.job_id)}"
            )


def _check_ranking(policy: str, ranking: list[Rank], candidates: list[JobState]) -> None:
    ranked = [r.job_id for r in ranking]
    if sorted(ranked) != sorted(j.job_id for j in candidates):
        raise ValueError(f"policy {policy!r}: rank must return every job it was given exactly once")
