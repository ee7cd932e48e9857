"""Predict a ``Program``'s time on a ``Topology`` (a fluid model of its messages).

The model follows the program's step semantics: a rank starts step k+1 when every message of its
step k has arrived; a message starts when both its ends are in the step that holds it, waits its
link's latency, then moves its bytes. Moving messages share capacity: at each instant a message
goes at the smallest of its link's and each of its media's bandwidth divided by the number of
messages moving on it (a lossy link delivers bandwidth * (1 - loss): the lost share is resent).
An empty chunk's message costs nothing (the executor skips it). The reduction's arithmetic is
not modelled: on the fabrics here it is far faster than the links. An emulated fabric paced over a
real transport pays that transport's copy too: ``transport_bps`` adds bytes / transport_bps to each
message's latency (bench.collectives probes it with an unpaced all-reduce).

Invariant: a prediction is deterministic, and a program with a message over a pair the topology
has no link for, or one that deadlocks, raises ``SimulationError`` rather than a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .program import Program, Send
from .topology import Topology

_DONE = 1e-9  # share of its bytes left below which a message is finished (float residue)


class SimulationError(ValueError):
    """The program cannot run on this topology (a missing link, a deadlock)."""


@dataclass
class _Message:
    src: int
    dst: int
    steps: tuple[int, int]  # the sender's step, the receiver's step
    bytes_left: float
    size: float
    resources: tuple[str, ...]
    latency: float
    ends_present: int = 0
    moving_from: float = 0.0  # when its latency is over (set once both ends are present)


def simulate(
    program: Program, topology: Topology, elem_bytes: int = 4, transport_bps: float | None = None
) -> float:
    """Seconds from every rank starting the program to the last rank finishing it.
    ``transport_bps``: a transport whose own copy adds bytes / transport_bps to every message on
    top of the link (an emulated fabric paced over a real transport; None: no such cost)."""
    return max(rank_finish_times(program, topology, elem_bytes, transport_bps), default=0.0)


def rank_finish_times(
    program: Program, topology: Topology, elem_bytes: int = 4, transport_bps: float | None = None
) -> list[float]:
    """When each rank finishes its last step."""
    if program.world != topology.world:
        raise SimulationError(f"program for {program.world} ranks, topology has {topology.world}")
    if transport_bps is not None and not transport_bps > 0:
        raise SimulationError(f"transport_bps must be positive, got {transport_bps}")
    run = _Run(program, topology, elem_bytes, transport_bps)
    run.play()
    return run.finish


class _Run:
    """One simulation: ranks' current steps, messages waiting out their latency or moving."""

    def __init__(
        self, program: Program, topology: Topology, elem_bytes: int, transport_bps: float | None
    ) -> None:
        self.messages, self.of_step = _messages(program, topology, elem_bytes)
        if transport_bps:
            for message in self.messages:
                message.latency += message.size / transport_bps
        self.capacity = {
            f"{link.src}>{link.dst}": link.bandwidth * (1.0 - link.loss) for link in topology.links
        }
        self.capacity |= {m.name: m.bandwidth for m in topology.media}
        self.current = [0] * program.world
        self.left_in_step = [[len(ids) for ids in rank_steps] for rank_steps in self.of_step]
        self.finish = [0.0] * program.world
        self.now = 0.0
        self.waiting: set[int] = set()  # both ends present, in their latency
        self.moving: set[int] = set()

    def play(self) -> None:
        for rank in range(len(self.current)):
            self._enter(rank)
        while self.waiting or self.moving:
            self._advance_time()
        stuck = [rank for rank, step in enumerate(self.current) if step < len(self.of_step[rank])]
        if stuck:
            steps = [self.current[r] for r in stuck]
            raise SimulationError(f"deadlock: ranks {stuck} never finish (stuck in steps {steps})")

    def _advance_time(self) -> None:
        """Move to the next event (a latency over, a message arrived) and apply it."""
        messages = self.messages
        rates = _rates(messages, self.moving, self.capacity)
        horizon = min((messages[m].moving_from for m in self.waiting), default=float("inf"))
        for m in self.moving:
            horizon = min(horizon, self.now + messages[m].bytes_left / rates[m])
        for m in self.moving:
            messages[m].bytes_left -= rates[m] * (horizon - self.now)
        self.now = horizon
        started = [m for m in self.waiting if messages[m].moving_from <= self.now]
        self.waiting.difference_update(started)
        self.moving.update(started)
        done = sorted(m for m in self.moving if messages[m].bytes_left <= _DONE * messages[m].size)
        self.moving.difference_update(done)
        for m in done:
            self._complete(m)

    def _complete(self, message_id: int) -> None:
        message = self.messages[message_id]
        for rank, step in ((message.src, message.steps[0]), (message.dst, message.steps[1])):
            self.left_in_step[rank][step] -= 1
            if self.left_in_step[rank][step] == 0:
                self.current[rank] += 1
                self._enter(rank)

    def _enter(self, rank: int) -> None:
        """The rank starts its current step now (or has finished its program)."""
        step = self.current[rank]
        if step == len(self.of_step[rank]):
            self.finish[rank] = self.now
            return
        if not self.of_step[rank][step]:
            self.current[rank] += 1
            self._enter(rank)
            return
        for message_id in self.of_step[rank][step]:
            message = self.messages[message_id]
            message.ends_present += 1
            if message.ends_present < 2:
                continue
            if message.size == 0:
                self._complete(message_id)
            else:
                message.moving_from = self.now + message.latency
                self.waiting.add(message_id)


def _messages(
    program: Program, topology: Topology, elem_bytes: int
) -> tuple[list[_Message], list[list[list[int]]]]:
    """Every message once, paired by per-pair order, and the ids each rank's steps wait for."""
    messages: list[_Message] = []
    of_step: list[list[list[int]]] = [[[] for _ in rank_steps] for rank_steps in program.steps]
    sends: dict[tuple[int, int], list[int]] = {}
    receives: dict[tuple[int, int], int] = {}
    for rank, index, op in program.messages():
        if not isinstance(op, Send):
            continue
        link = topology.link(rank, op.peer)
        if link is None:
            raise SimulationError(
                f"rank {rank} step {index} sends to rank {op.peer}: the topology has no such link"
            )
        size = program.chunks[op.chunk].numel * elem_bytes
        key = f"{rank}>{op.peer}"
        message = _Message(
            rank, op.peer, (index, -1), float(size), float(size), (key, *link.media), link.latency
        )
        sends.setdefault((rank, op.peer), []).append(len(messages))
        of_step[rank][index].append(len(messages))
        messages.append(message)
    for rank, index, op in program.messages():
        if isinstance(op, Send):
            continue
        nth = receives.get((op.peer, rank), 0)
        receives[(op.peer, rank)] = nth + 1
        pair_sends = sends.get((op.peer, rank), [])
        if nth >= len(pair_sends):
            raise SimulationError(
                f"rank {rank} step {index} receives from rank {op.peer} with no matching send"
            )
        message_id = pair_sends[nth]
        messages[message_id].steps = (messages[message_id].steps[0], index)
        of_step[rank][index].append(message_id)
    unmatched = [m for m in messages if m.steps[1] < 0]
    if unmatched:
        raise SimulationError(
            f"rank {unmatched[0].src} sends to rank {unmatched[0].dst} with no matching receive"
        )
    return messages, of_step


def _rates(messages: list[_Message], moving: set[int], capacity: dict[str, float]) -> dict[int, float]:
    """Bytes/s each moving message gets: the tightest equal share over its link and media."""
    users: dict[str, int] = {}
    for m in moving:
        for resource in messages[m].resources:
            users[resource] = users.get(resource, 0) + 1
    return {m: min(capacity[r] / users[r] for r in messages[m].resources) for m in moving}
