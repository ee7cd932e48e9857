"""Pipeline schedules as data: for each rank, the list of actions it performs in one step.

An action is ``(stage, kind, microbatch)`` and prints compactly as ``0F3`` (stage 0, forward of
microbatch 3) or ``1RECV_B2``; ``Action.parse`` reads that back, so schedules can be dumped, diffed
and reloaded. Schedules only *emit* actions; one executor (``executor.StageExecutor``) runs them.

Stage replication follows PipeDream's 1F1B-RR: microbatch ``b`` of stage ``s`` runs on replica
``b % replicas[s]``, so its forward and backward run on the same replica. Each replica's order is
the unreplicated order of its stage, filtered to its own microbatches.

Invariant: a schedule returned by ``build_schedule`` passes ``validate`` (each microbatch has one F
then one B on the right replica of every stage, every send has exactly one matching receive) and
``simulate`` finds no deadlock under non-blocking sends and blocking receives, the semantics the
runtime implements (``isend`` / waited ``irecv``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

ComputeKind = Literal["F", "B"]
CommKind = Literal["SEND_F", "RECV_F", "SEND_B", "RECV_B"]
ActionKind = Literal[ComputeKind, CommKind]
ScheduleName = Literal["gpipe", "1f1b-flush", "1f1b-stash"]
UpdateRule = Literal["flush", "per_microbatch"]  # see ``Schedule``

COMPUTE_KINDS: tuple[ComputeKind, ...] = get_args(ComputeKind)
COMM_KINDS: tuple[CommKind, ...] = get_args(CommKind)
SCHEDULE_NAMES: tuple[ScheduleName, ...] = get_args(ScheduleName)
_KIND_OF_TEXT: dict[str, ActionKind] = {kind: kind for kind in COMPUTE_KINDS + COMM_KINDS}
_ACTION_RE = re.compile(rf"^(\d+)({'|'.join(_KIND_OF_TEXT)})(\d+)$")


class ScheduleError(ValueError):
    """A schedule that is malformed or deadlocks; the message carries the step x rank grid."""


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    kind: ActionKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> Action:
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise ValueError(f"not an action: {text!r} (expected e.g. 0F3, 1RECV_B2)")
        return Action(int(match.group(1)), _KIND_OF_TEXT[match.group(2)], int(match.group(3)))


@dataclass(frozen=True)
class Topology:
    """Replica count per stage; ranks are numbered stage by stage (stage 0's replicas first)."""

    replicas: tuple[int, ...]

    @property
    def n_stages(self) -> int:
        return len(self.replicas)

    @property
    def world_size(self) -> int:
        return sum(self.replicas)

    def rank_of(self, stage: int, replica: int) -> int:
        return sum(self.replicas[:stage]) + replica

    def stage_replica_of(self, rank: int) -> tuple[int, int]:
        for stage, count in enumerate(self.replicas):
            if rank < count:
                return stage, rank
            rank -= count
        raise ValueError("rank outside the topology")

    def replica_for(self, stage: int, microbatch: int) -> int:
        return microbatch % self.replicas[stage]

    def rank_for(self, stage: int, microbatch: int) -> int:
        return self.rank_of(stage, self.replica_for(stage, microbatch))

    def stage_ranks(self, stage: int) -> list[int]:
        return [self.rank_of(stage, r) for r in range(self.replicas[stage])]


@dataclass(frozen=True)
class Schedule:
    """One step of a pipeline: per-rank action lists, lowered with sends and receives.

    ``update`` says when weights change: ``flush`` (once after the step, synchronous semantics) or
    ``per_microbatch`` (after each backward, PipeDream's asynchronous 1F1B with weight stashing).
    """

    name: ScheduleName
    topology: Topology
    n_microbatches: int
    orders: tuple[tuple[Action, ...], ...]
    update: UpdateRule
    vertical_sync: bool = False

    def text(self) -> str:
        lines = [f"# {self.name} replicas={list(self.topology.replicas)} microbatches={self.n_microbatches}"]
        lines += [f"rank{rank}: " + " ".join(str(a) for a in order) for rank, order in enumerate(self.orders)]
        return "\n".join(lines)

    def compute_order(self, rank: int) -> list[Action]:
        return [a for a in self.orders[rank] if a.kind in COMPUTE_KINDS]

    def updates_before_forward(self, rank: int) -> dict[int, int]:
        """Microbatch -> how many backwards (per-microbatch updates) ``rank`` runs before its
        forward: the weight version that forward sees under 1F1B-stash."""
        applied, versions = 0, {}
        for action in self.compute_order(rank):
            if action.kind == "F":
                versions[action.microbatch] = applied
            else:
                applied += 1
        return versions

    def stash_versions(self) -> dict[int, int]:
        """Vertical sync: microbatch -> weight version, the number of updates stage 0 had applied
        (on the microbatch's replica) when it ran the microbatch's forward."""
        versions: dict[int, int] = {}
        for rank in self.topology.stage_ranks(0):
            versions.update(self.updates_before_forward(rank))
        return versions


def _stage_compute_order(name: ScheduleName, topology: Topology, stage: int, n: int) -> list[Action]:
    if name == "gpipe":
        order = [Action(stage, "F", b) for b in range(n)] + [Action(stage, "B", b) for b in range(n)]
    else:
        # Warm-up depth in global microbatches: as many as there are workers downstream (PipeDream's
        # NOAM), so the stage has work while the first microbatch travels to the end and back.
        warmup = min(n, sum(topology.replicas[stage + 1 :]))
        order = [Action(stage, "F", b) for b in range(warmup)]
        for b in range(n - warmup):
            order += [Action(stage, "F", warmup + b), Action(stage, "B", b)]
        order += [Action(stage, "B", b) for b in range(n - warmup, n)]
    return order


def _lower(topology: Topology, stage: int, compute: Sequence[Action]) -> list[Action]:
    last = topology.n_stages - 1
    lowered: list[Action] = []
    for action in compute:
        b = action.microbatch
        if action.kind == "F":
            if stage > 0:
                lowered.append(Action(stage, "RECV_F", b))
            lowered.append(action)
            if stage < last:
                lowered.append(Action(stage, "SEND_F", b))
        else:
            if stage < last:
                lowered.append(Action(stage, "RECV_B", b))
            lowered.append(action)
            if stage > 0:
                lowered.append(Action(stage, "SEND_B", b))
    return lowered


def schedule_name(text: str) -> ScheduleName:
    """``text`` as a schedule name (from a job file or a command line); ValueError lists the valid ones."""
    for name in SCHEDULE_NAMES:
        if name == text:
            return name
    raise ValueError(f"unknown schedule {text!r}; valid: {', '.join(SCHEDULE_NAMES)}")


def build_schedule(
    name: ScheduleName, replicas: Sequence[int], n_microbatches: int, *, vertical_sync: bool = False
) -> Schedule:
    name = schedule_name(name)  # callers that are not type-checked may pass any text
    topology = Topology(tuple(int(r) for r in replicas))
    if not topology.replicas or min(topology.replicas) < 1 or n_microbatches < 1:
        raise ValueError("need at least one stage, one replica per stage and one microbatch")
    if vertical_sync and name != "1f1b-stash":
        raise ValueError("vertical_sync applies only to 1f1b-stash")
    orders = []
    for rank in range(topology.world_size):
        stage, replica = topology.stage_replica_of(rank)
        full = _stage_compute_order(name, topology, stage, n_microbatches)
        mine = [a for a in full if topology.replica_for(stage, a.microbatch) == replica]
        orders.append(tuple(_lower(topology, stage, mine)))
    update: UpdateRule = "per_microbatch" if name == "1f1b-stash" else "flush"
    schedule = Schedule(name, topology, n_microbatches, tuple(orders), update, vertical_sync)
    errors = validate(schedule)
    if errors:
        raise ScheduleError("\n".join(errors))
    return schedule


def _peer(topology: Topology, action: Action) -> tuple[int, Action]:
    """The rank and action that match a send or receive."""
    b = action.microbatch
    if action.kind == "SEND_F":
        return topology.rank_for(action.stage + 1, b), Action(action.stage + 1, "RECV_F", b)
    if action.kind == "RECV_F":
        return topology.rank_for(action.stage - 1, b), Action(action.stage - 1, "SEND_F", b)
    if action.kind == "SEND_B":
        return topology.rank_for(action.stage - 1, b), Action(action.stage - 1, "RECV_B", b)
    if action.kind == "RECV_B":
        return topology.rank_for(action.stage + 1, b), Action(action.stage + 1, "SEND_B", b)
    raise ValueError(f"{action} is not a communication action")


def validate(schedule: Schedule) -> list[str]:
    """Every problem found, as text (empty when the schedule is well formed)."""
    topo = schedule.topology
    if len(schedule.orders) != topo.world_size:
        return [f"{len(schedule.orders)} rank orders for a world of {topo.world_size}"]
    return [error for rank in range(topo.world_size) for error in _rank_errors(schedule, rank)]


@dataclass
class _RankSoFar:
    """One rank's order up to the action being checked: what the action checks read."""

    schedule: Schedule
    rank: int
    stage: int
    seen: dict[tuple[ActionKind, int], int]  # (kind, microbatch) -> the last earlier step it was at


def _rank_errors(schedule: Schedule, rank: int) -> list[str]:
    so_far = _RankSoFar(schedule, rank, schedule.topology.stage_replica_of(rank)[0], {})
    errors = []
    for i, action in enumerate(schedule.orders[rank]):
        problems = (check(so_far, action) for check in _ACTION_CHECKS)
        errors += [f"rank{rank} step {i}: {problem}" for problem in problems if problem is not None]
        so_far.seen[(action.kind, action.microbatch)] = i
    return errors + _missing_compute(so_far)


def _wrong_stage(so_far: _RankSoFar, action: Action) -> str | None:
    wrong = action.stage != so_far.stage
    return f"{action} belongs to stage {action.stage}, not {so_far.stage}" if wrong else None


def _other_replicas(so_far: _RankSoFar, action: Action) -> str | None:
    mine = so_far.schedule.topology.rank_for(so_far.stage, action.microbatch) == so_far.rank
    return None if mine else f"microbatch {action.microbatch} is another replica's"


def _repeated(so_far: _RankSoFar, action: Action) -> str | None:
    earlier = so_far.seen.get((action.kind, action.microbatch))
    return None if earlier is None else f"{action} repeated (first at step {earlier})"


def _backward_before_forward(so_far: _RankSoFar, action: Action) -> str | None:
    early = action.kind == "B" and ("F", action.microbatch) not in so_far.seen
    return f"{action} before its forward" if early else None


def _send_before_compute(so_far: _RankSoFar, action: Action) -> str | None:
    source: ComputeKind | None = "F" if action.kind == "SEND_F" else "B" if action.kind == "SEND_B" else None
    early = source is not None and (source, action.microbatch) not in so_far.seen
    return f"{action} before the {source} it sends" if early else None


def _compute_before_receive(so_far: _RankSoFar, action: Action) -> str | None:
    # F receives its input on every stage but the first, B its output gradient on all but the last
    last_stage = so_far.stage == so_far.schedule.topology.n_stages - 1
    needed: CommKind | None = None
    if action.kind == "F" and so_far.stage > 0:
        needed = "RECV_F"
    elif action.kind == "B" and not last_stage:
        needed = "RECV_B"
    early = needed is not None and (needed, action.microbatch) not in so_far.seen
    return f"{action} before {needed}" if early else None


def _unmatched(so_far: _RankSoFar, action: Action) -> str | None:
    if action.kind not in COMM_KINDS:
        return None
    peer_stage = action.stage + (1 if action.kind in ("SEND_F", "RECV_B") else -1)
    if not 0 <= peer_stage < so_far.schedule.topology.n_stages:
        return f"{action} has no peer: there is no stage {peer_stage}"
    peer_rank, peer_action = _peer(so_far.schedule.topology, action)
    matched = peer_action in so_far.schedule.orders[peer_rank]
    return None if matched else f"{action} lacks {peer_action} on rank{peer_rank}"


# Checked in this order for each action, so its problems are listed in this order.
_ACTION_CHECKS: tuple[Callable[[_RankSoFar, Action], str | None], ...] = (
    _wrong_stage,
    _other_replicas,
    _repeated,
    _backward_before_forward,
    _send_before_compute,
    _compute_before_receive,
    _unmatched,
)


def _missing_compute(so_far: _RankSoFar) -> list[str]:
    """The F and B of each of this replica's microbatches that its order lacks."""
    stage, topo = so_far.stage, so_far.schedule.topology
    return [
        f"rank{so_far.rank}: missing {stage}{kind}{b}"
        for b in range(so_far.schedule.n_microbatches)
        if topo.rank_for(stage, b) == so_far.rank
        for kind in COMPUTE_KINDS
        if (kind, b) not in so_far.seen
    ]


@dataclass(frozen=True)
class SimResult:
    makespan: float
    busy: tuple[float, ...]  # compute seconds per rank
    grid: str

    @property
    def bubble_fraction(self) -> float:
        if self.makespan <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def format_grid(rows: Sequence[Sequence[str]], error_row: int | None = None) -> str:
    n_ranks = len(rows[0]) if rows else 0
    width = max([len(cell) for row in rows for cell in row] + [6])
    lines = ["step  " + " ".join(f"rank{r}".ljust(width) for r in range(n_ranks))]
    for i, row in enumerate(rows):
        line = f"{i:<5} " + " ".join(cell.ljust(width) for cell in row)
        lines.append(line + ("  <-- ERROR HERE" if i == error_row else ""))
    return "\n".join(lines)


def simulate(
    schedule: Schedule,
    forward_s: Sequence[float] | None = None,
    backward_s: Sequence[float] | None = None,
    comm_s: float = 0.0,
) -> SimResult:
    """Dry-run all ranks in rounds; raise ``ScheduleError`` with the grid on a deadlock.

    Sends never block; a receive waits for its matching send. Time per stage is ``forward_s[s]``
    and ``backward_s[s]`` (default 1 and 2), a message takes ``comm_s``. Returns the predicted
    makespan of one step, busy time per rank and the grid of the rounds.
    """
    topo = schedule.topology
    fwd = list(forward_s) if forward_s is not None else [1.0] * topo.n_stages
    bwd = list(backward_s) if backward_s is not None else [2.0] * topo.n_stages
    pointers = [0] * topo.world_size
    clock = [0.0] * topo.world_size
    busy = [0.0] * topo.world_size
    sent: dict[tuple[int, Action], float] = {}  # (receiving rank, its RECV action) -> arrival time
    rows: list[list[str]] = []
    while any(p < len(o) for p, o in zip(pointers, schedule.orders, strict=True)):
        row, progressed = [], False
        for rank, order in enumerate(schedule.orders):
            cell = ""
            # Run everything that can run on this rank in this round, up to its next blocked receive.
            while pointers[rank] < len(order):
                action = order[pointers[rank]]
                if action.kind in ("RECV_F", "RECV_B"):
                    arrival = sent.pop((rank, action), None)
                    if arrival is None:
                        break
                    clock[rank] = max(clock[rank], arrival)
                elif action.kind in ("SEND_F", "SEND_B"):
                    peer_rank, peer_action = _peer(topo, action)
                    sent[(peer_rank, peer_action)] = clock[rank] + comm_s
                else:
                    cost = fwd[action.stage] if action.kind == "F" else bwd[action.stage]
                    clock[rank] += cost
                    busy[rank] += cost
                cell += ("" if not cell else ",") + str(action)
                pointers[rank] += 1
                progressed = True
            row.append(cell or ".")
        rows.append(row)
        if not progressed:
            stuck = [
                str(o[p]) if p < len(o) else "done" for p, o in zip(pointers, schedule.orders, strict=True)
            ]
            rows[-1] = ["waits " + s for s in stuck]
            raise ScheduleError(f"deadlock in {schedule.name}:\n{format_grid(rows, len(rows) - 1)}")
    return SimResult(max(clock), tuple(busy), format_grid(rows))


def predicted_bubble(
    name: ScheduleName, n_stages: int, n_microbatches: int, forward_s: float = 1.0, backward_s: float = 2.0
) -> float:
    """Bubble fraction of one straight pipeline step with equal stages (the simulator's estimate)."""
    schedule = build_schedule(name, [1] * n_stages, n_microbatches)
    return simulate(schedule, [forward_s] * n_stages, [backward_s] * n_stages).bubble_fraction


def parse_orders(text: str) -> list[list[Action]]:
    """Read back the ``rankN: 0F0 0SEND_F0 ...`` lines of ``Schedule.text()``."""
    orders = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        _, _, actions = line.partition(":")
        orders.append([Action.parse(token) for token in actions.split()])
    return orders
