"""Collective programs as data: per-rank steps of chunk sends and receives, and their validator.

A ``Program`` is built for one tensor size (``numel``): ``chunks`` tile the flat tensor's element
range [0, numel) in order (a chunk may be empty; its messages carry nothing and the executor skips
them on both ends), and ``steps[rank]`` is that rank's list of steps. In a step a rank posts every
``Recv`` into a scratch buffer and every ``Send`` of its values *as they were at the step's start*,
waits for all of them, then applies the receives: ``reduce=True`` adds into the local chunk,
``False`` overwrites it. A value received in step k can therefore be forwarded in step k+1, not in
step k. Messages between one ordered pair of ranks match by order: the n-th ``Send`` from a to b is
the n-th ``Recv`` at b from a (the executor tags them with per-pair sequence numbers), and both must
name the same chunk.

``validate`` refuses, with a ``ProgramError`` naming the rank and step, a program whose chunks do
not tile, whose sends and receives do not pair up, that deadlocks under those semantics (a step
ends only once every message in it has been posted by both ends), or whose result is not the
collective: it runs the program symbolically, each chunk's value being the count of every rank's
contribution in it. all_reduce: every rank ends with every chunk holding each rank's contribution
exactly once; reduce: the root does; broadcast: every rank ends with the root's value only.

Invariant: a program ``validate`` accepted computes its collective on every input and cannot
deadlock; the executor and the simulator follow the step semantics above and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

Kind = Literal["all_reduce", "broadcast", "reduce"]
KINDS: tuple[Kind, ...] = ("all_reduce", "broadcast", "reduce")


@dataclass(frozen=True)
class Chunk:
    """Element range [start, stop) of the flat tensor."""

    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Send:
    """Send this rank's value of ``chunks[chunk]`` (as at the step's start) to ``peer``."""

    peer: int
    chunk: int


@dataclass(frozen=True)
class Recv:
    """Receive ``chunks[chunk]`` from ``peer``; add it into the local value, or overwrite it."""

    peer: int
    chunk: int
    reduce: bool


Op = Send | Recv
Step = tuple[Op, ...]


@dataclass(frozen=True)
class Program:
    kind: Kind
    world: int
    root: int | None
    chunks: tuple[Chunk, ...]
    steps: tuple[tuple[Step, ...], ...]

    @property
    def numel(self) -> int:
        return self.chunks[-1].stop if self.chunks else 0

    def messages(self) -> Iterator[tuple[int, int, Op]]:
        """Every (rank, step index, op) in rank order, then step order."""
        for rank, rank_steps in enumerate(self.steps):
            for index, step in enumerate(rank_steps):
                for op in step:
                    yield rank, index, op


class ProgramError(ValueError):
    """A program that is not the collective it claims; ``rank``/``step`` locate it (None: global)."""

    def __init__(self, message: str, rank: int | None = None, step: int | None = None) -> None:
        where = "" if rank is None else f"rank {rank}" + ("" if step is None else f", step {step}")
        super().__init__(f"{where}: {message}" if where else message)
        self.rank = rank
        self.step = step


def validate(program: Program, numel: int) -> None:
    """Raise ``ProgramError`` unless ``program`` computes its collective on ``numel`` elements."""
    _check_shape(program, numel)
    pairing = _pair_messages(program)
    _run_symbolically(program, pairing)


def _check_shape(program: Program, numel: int) -> None:
    if program.kind not in KINDS:
        raise ProgramError(f"kind {program.kind!r} is not one of {', '.join(KINDS)}")
    if program.world < 1:
        raise ProgramError(f"world {program.world} must be at least 1")
    if program.kind == "all_reduce":
        if program.root is not None:
            raise ProgramError(f"root must be None for all_reduce, got {program.root}")
    elif program.root is None or not 0 <= program.root < program.world:
        raise ProgramError(f"root {program.root} of a {program.kind} is not a rank of {program.world}")
    if numel < 0:
        raise ProgramError(f"numel {numel} is negative")
    _check_chunks(program, numel)
    _check_ops(program)


def _check_chunks(program: Program, numel: int) -> None:
    position = 0
    for index, chunk in enumerate(program.chunks):
        if chunk.start != position or chunk.stop < chunk.start:
            raise ProgramError(
                f"chunks do not tile [0, {numel}): chunk {index} is [{chunk.start}, {chunk.stop}),"
                f" expected to start at {position}"
            )
        position = chunk.stop
    if position != numel:
        raise ProgramError(f"chunks cover [0, {position}), not [0, {numel})")


def _check_ops(program: Program) -> None:
    if len(program.steps) != program.world:
        raise ProgramError(f"steps has {len(program.steps)} ranks, world is {program.world}")
    for rank, index, op in program.messages():
        if not 0 <= op.peer < program.world or op.peer == rank:
            raise ProgramError(f"{op} names peer {op.peer}, not another rank", rank, index)
        if not 0 <= op.chunk < len(program.chunks):
            raise ProgramError(f"{op} names chunk {op.chunk} of {len(program.chunks)}", rank, index)
    for rank, rank_steps in enumerate(program.steps):
        for index, step in enumerate(rank_steps):
            written: dict[int, bool] = {}
            for op in step:
                if isinstance(op, Recv):
                    if written.get(op.chunk) is False or (op.chunk in written and not op.reduce):
                        raise ProgramError(
                            f"chunk {op.chunk} is overwritten and also received again in one step"
                            " (the order of the two is undefined)",
                            rank,
                            index,
                        )
                    written[op.chunk] = op.reduce


@dataclass(frozen=True)
class _Where:
    """The step of the other end of a message."""

    rank: int
    step: int
    position: int


def _pair_messages(program: Program) -> dict[tuple[int, int, int], _Where]:
    """For each (rank, step, op index): where its counterpart is; refuses unpaired messages."""
    sends: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    for rank, rank_steps in enumerate(program.steps):
        for index, step in enumerate(rank_steps):
            for position, op in enumerate(step):
                if isinstance(op, Send):
                    sends.setdefault((rank, op.peer), []).append((rank, index, position, op.chunk))
                else:
                    recvs.setdefault((op.peer, rank), []).append((rank, index, position, op.chunk))
    pairing: dict[tuple[int, int, int], _Where] = {}
    for pair in sorted(set(sends) | set(recvs)):
        pair_sends, pair_recvs = sends.get(pair, []), recvs.get(pair, [])
        for nth, (sent, received) in enumerate(zip(pair_sends, pair_recvs, strict=False)):
            if sent[3] != received[3]:
                raise ProgramError(
                    f"message {nth} from rank {pair[0]} to rank {pair[1]} sends chunk {sent[3]}"
                    f" but rank {pair[1]} step {received[1]} receives it as chunk {received[3]}",
                    sent[0],
                    sent[1],
                )
            pairing[sent[:3]] = _Where(*received[:3])
            pairing[received[:3]] = _Where(*sent[:3])
        if len(pair_sends) > len(pair_recvs):
            extra = pair_sends[len(pair_recvs)]
            raise ProgramError(
                f"send of chunk {extra[3]} to rank {pair[1]} has no matching receive", extra[0], extra[1]
            )
        if len(pair_recvs) > len(pair_sends):
            extra = pair_recvs[len(pair_sends)]
            raise ProgramError(
                f"receive of chunk {extra[3]} from rank {pair[0]} has no matching send", extra[0], extra[1]
            )
    return pairing


Contribution = tuple[int, ...]  # per rank: how many times its input is summed into a value


def _run_symbolically(program: Program, pairing: dict[tuple[int, int, int], _Where]) -> None:
    """Advance every rank whose current step's messages are all posted by their other ends;
    values are contribution counts, a send's value taken when its step began."""
    world, nchunks = program.world, len(program.chunks)
    values: list[list[Contribution]] = [
        [tuple(1 if r == rank else 0 for r in range(world))] * nchunks for rank in range(world)
    ]
    sent_values: dict[tuple[int, int, int], Contribution] = {}
    current = [0] * world

    def enter(rank: int) -> None:
        if current[rank] < len(program.steps[rank]):
            for position, op in enumerate(program.steps[rank][current[rank]]):
                if isinstance(op, Send):
                    sent_values[(rank, current[rank], position)] = values[rank][op.chunk]

    for rank in range(world):
        enter(rank)
    progressed = True
    while progressed:
        progressed = False
        for rank in range(world):
            index = current[rank]
            if index == len(program.steps[rank]):
                continue
            step = program.steps[rank][index]
            other_ends = [pairing[(rank, index, position)] for position in range(len(step))]
            if any(where.step > current[where.rank] for where in other_ends):
                continue
            for op, where in zip(step, other_ends, strict=True):
                if isinstance(op, Recv):
                    incoming = sent_values[(where.rank, where.step, where.position)]
                    local = values[rank][op.chunk]
                    values[rank][op.chunk] = (
                        tuple(a + b for a, b in zip(local, incoming, strict=True)) if op.reduce else incoming
                    )
            current[rank] += 1
            enter(rank)
            progressed = True
    stuck = [rank for rank in range(world) if current[rank] < len(program.steps[rank])]
    if stuck:
        rank = stuck[0]
        waiting = ", ".join(
            f"rank {where.rank} step {where.step}"
            for position in range(len(program.steps[rank][current[rank]]))
            for where in [pairing[(rank, current[rank], position)]]
            if where.step > current[where.rank]
        )
        raise ProgramError(f"deadlock: waits for {waiting} (ranks stuck: {stuck})", rank, current[rank])
    _check_result(program, values)


def _check_result(program: Program, values: list[list[Contribution]]) -> None:
    world = program.world
    everyone = tuple([1] * world)
    if program.kind == "all_reduce":
        expected = {rank: everyone for rank in range(world)}
    elif program.kind == "reduce":
        assert program.root is not None
        expected = {program.root: everyone}
    else:
        assert program.root is not None
        expected = {rank: tuple(1 if r == program.root else 0 for r in range(world)) for rank in range(world)}
    for rank, want in expected.items():
        for chunk, have in enumerate(values[rank]):
            if have != want:
                raise ProgramError(
                    f"ends with chunk {chunk} holding contributions {_describe(have)},"
                    f" a {program.kind} needs {_describe(want)}",
                    rank,
                    len(program.steps[rank]),
                )


def _describe(counts: Contribution) -> str:
    parts = [f"rank {r}" + ("" if n == 1 else f" x{n}") for r, n in enumerate(counts) if n]
    return "{" + ", ".join(parts) + "}" if parts else "nothing"
