"""The scheduling round: admission, then the policy's order, then placement (and preemption).

``Scheduler.round(cluster, jobs, now)`` is pure: it reads the state and returns a ``RoundPlan``;
the backend applies it (``backend.apply``). The walk over the policy's order:

- a running job ranked here keeps its devices, unless the policy names generations it is not on
  and room there can be had: then it migrates (preempt + start in the same plan);
- a waiting job is placed generation by generation in the policy's order of preference (any
  node when it names none): on free devices, failing that (preemptive policies) on devices of
  running jobs ranked below it, freed lowest first, giving back any it did not need (a job so
  preempted may restart later in the walk if room for it remains elsewhere); a policy without
  backfill stops starting jobs at the first that does not fit (head of line).

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
        self.position = {r.job_id: i for i, r in enumerate(ranking)}
        self.running = [r.job_id for r in ranking if jobs[r.job_id].status == "running"]  # in rank order

    def run(self) -> list[QueueEntry]:
        return [self._visit(index, rank) for index, rank in enumerate(self.ranking)]

    def _visit(self, index: int, rank: Rank) -> QueueEntry:
        job = self.jobs[rank.job_id]
        if job.status == "running" and job.job_id not in self.preempted:
            return self._keep_or_migrate(index, rank, job)
        if self.head_of_line is not None:
            return QueueEntry(job.job_id, index, "waiting", f"{rank.reason}; behind {self.head_of_line}")
        nodes = self._find_room(index, rank, job, self.trial, may_preempt=job.job_id not in self.preempted)
        if nodes is None:
            if not self.s.policy.backfill:
                self.head_of_line = job.job_id
            if job.job_id in self.preempted:
                return QueueEntry(
                    job.job_id, index, "waiting", f"{rank.reason}; preempted for {self.preempted[job.job_id]}"
                )
            where = f" on {'/'.join(rank.generations)}" if rank.generations else ""
            return QueueEntry(
                job.job_id, index, "waiting", f"{rank.reason}; no room for {job.devices}{where}"
            )
        self.trial.allocate(job.job_id, nodes)
        self.decisions.append(Start(job.job_id, nodes, rank.reason))
        return QueueEntry(job.job_id, index, "starting", rank.reason)

    def _keep_or_migrate(self, index: int, rank: Rank, job: JobState) -> QueueEntry:
        """Keep a running job where it is, unless the policy wants it on other generations and
        room there can be had (from free devices, or from running jobs ranked below it)."""
        current = self.trial.generations_of(job.placement)
        if not rank.generations or set(current) <= set(rank.generations):
            return QueueEntry(job.job_id, index, "running", rank.reason)
        moved = self.trial.copy()
        moved.release(job.job_id)
        nodes = self._find_room(index, rank, job, moved, may_preempt=True)
        if nodes is None:
            return QueueEntry(job.job_id, index, "running", f"{rank.reason}; stays on {'/'.join(current)}")
        self.trial.allocate(job.job_id, nodes)
        reason = f"migrate to {'/'.join(self.trial.generations_of(nodes))}: {rank.reason}"
        self.preempted[job.job_id] = job.job_id
        self.decisions += [Preempt(job.job_id, reason), Start(job.job_id, nodes, reason)]
        return QueueEntry(job.job_id, index, "starting", reason)

    def _find_room(
        self, index: int, rank: Rank, job: JobState, base: ClusterState, may_preempt: bool
    ) -> tuple[str, ...] | None:
        """Place ``job`` on ``base``, generation by generation in the policy's preference, each
        from free devices first and then (``may_preempt``, preemptive policy) from running jobs
        ranked below it; on success ``self.trial`` becomes the cluster after it (not yet holding
        ``job``)."""
        for generation in rank.generations or (None,):
            nodes = self._place(job, generation, base)
            if nodes is not None:
                self.trial = base
                return nodes
            if may_preempt and self.s.policy.preemptive:
                room = self._make_room(index, rank, job, generation, base)
                if room is not None:
                    nodes, self.trial = room
                    return nodes
        return None

    def _place(self, job: JobState, generation: str | None, cluster: ClusterState) -> tuple[str, ...] | None:
        return self.s.placement.place(job, cluster, self.s.allowed(job, generation))

    def _make_room(
        self, index: int, rank: Rank, job: JobState, generation: str | None, base: ClusterState
    ) -> tuple[tuple[str, ...], ClusterState] | None:
        """Preempt running jobs ranked below ``index`` (lowest first, then give back those not
        needed) until ``job`` fits on ``base``; the placement and the cluster after, or None."""
        victims = [v for v in reversed(self.running) if self.position[v] > index and v not in self.preempted]
        everything = base.copy()
        for victim in victims:
            everything.release(victim)
        if self._place(job, generation, everything) is None:
            return None  # not even with every candidate gone: spare the search
        trial, taken = base.copy(), []
        for victim in victims:
            taken.append((victim, trial.release(victim)))
            if self._place(job, generation, trial) is not None:
                break
        else:
            return None
        for victim, placement in list(reversed(taken))[1:]:  # give back what was not needed
            spare = trial.copy()
            spare.allocate(victim, placement)
            if self._place(job, generation, spare) is not None:
                trial = spare
                taken.remove((victim, placement))
        for victim, _ in taken:
            self.preempted[victim] = job.job_id
            self.decisions.append(Preempt(victim, f"{job.job_id} ranks higher: {rank.reason}"))
        nodes = self._place(job, generation, trial)
        assert nodes is not None  # it fitted with these victims gone
        return nodes, trial


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
