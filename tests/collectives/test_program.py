"""program.validate: hand-written ring all-reduces (2 and 3 ranks), a broadcast and a reduce are
accepted; broken programs are refused with the rank and step that break them."""

from __future__ import annotations

import dataclasses

import pytest

from cloud.training.collectives.program import Chunk, Program, ProgramError, Recv, Send, Step, validate


def ring_all_reduce(world: int, numel: int) -> Program:
    """Reduce-scatter then all-gather around 0 -> 1 -> ... -> 0, one chunk per rank (test-only)."""
    bounds = [numel * i // world for i in range(world + 1)]
    chunks = tuple(Chunk(bounds[i], bounds[i + 1]) for i in range(world))
    steps: list[tuple[Step, ...]] = []
    for rank in range(world):
        right, left = (rank + 1) % world, (rank - 1) % world
        rank_steps: list[Step] = []
        for s in range(world - 1):
            rank_steps.append((Send(right, (rank - s) % world), Recv(left, (rank - s - 1) % world, True)))
        for s in range(world - 1):
            rank_steps.append((Send(right, (rank + 1 - s) % world), Recv(left, (rank - s) % world, False)))
        steps.append(tuple(rank_steps))
    return Program("all_reduce", world, None, chunks, tuple(steps))


def test_ring_all_reduce_of_two_and_three_ranks_is_valid() -> None:
    validate(ring_all_reduce(2, 10), 10)
    validate(ring_all_reduce(3, 7), 7)
    validate(ring_all_reduce(4, 2), 2)  # empty chunks tile too


def test_two_rank_ring_written_out_by_hand() -> None:
    chunks = (Chunk(0, 3), Chunk(3, 5))
    program = Program(
        "all_reduce",
        2,
        None,
        chunks,
        (
            ((Send(1, 0), Recv(1, 1, True)), (Send(1, 1), Recv(1, 0, False))),
            ((Send(0, 1), Recv(0, 0, True)), (Send(0, 0), Recv(0, 1, False))),
        ),
    )
    validate(program, 5)


def test_chain_broadcast_and_reduce_are_valid() -> None:
    chunks = (Chunk(0, 4),)
    broadcast = Program(
        "broadcast",
        3,
        1,
        chunks,
        (((Recv(1, 0, False),), (Send(2, 0),)), ((Send(0, 0),),), ((Recv(0, 0, False),),)),
    )
    validate(broadcast, 4)
    reduce = Program(
        "reduce",
        3,
        0,
        chunks,
        (((Recv(1, 0, True),),), ((Recv(2, 0, True),), (Send(0, 0),)), ((Send(1, 0),),)),
    )
    validate(reduce, 4)


def test_forwarding_in_the_same_step_is_refused_as_a_wrong_result() -> None:
    """Sends carry the value at the step's start: rank 1 relaying in the step it receives sends
    its own input, so rank 2 never gets the root's."""
    program = Program(
        "broadcast",
        3,
        0,
        (Chunk(0, 1),),
        (((Send(1, 0),),), ((Recv(0, 0, False), Send(2, 0)),), ((Recv(1, 0, False),),)),
    )
    with pytest.raises(ProgramError, match=r"rank 2, step 1: .*chunk 0 .*rank 1") as caught:
        validate(program, 1)
    assert (caught.value.rank, caught.value.step) == (2, 1)


def _replace_step(program: Program, rank: int, index: int, step: Step) -> Program:
    rank_steps = list(program.steps[rank])
    rank_steps[index] = step
    steps = list(program.steps)
    steps[rank] = tuple(rank_steps)
    return dataclasses.replace(program, steps=tuple(steps))


def test_a_send_without_a_receive_names_its_rank_and_step() -> None:
    ring = ring_all_reduce(3, 9)
    broken = _replace_step(ring, 2, 3, (ring.steps[2][3][0],))  # rank 2 drops its receive from rank 1
    with pytest.raises(
        ProgramError, match=r"rank 1, step 3: send of chunk \d to rank 2 has no matching receive"
    ):
        validate(broken, 9)
    broken = _replace_step(ring, 0, 3, (ring.steps[0][3][1],))  # rank 0 drops its last send to rank 1
    with pytest.raises(ProgramError, match=r"rank 1, step 3: receive .* from rank 0 has no matching send"):
        validate(broken, 9)


def test_mismatched_chunk_is_refused() -> None:
    ring = ring_all_reduce(3, 9)
    broken = _replace_step(ring, 1, 0, (Send(2, 2), Recv(0, 0, True)))
    with pytest.raises(ProgramError, match=r"rank 1, step 0: message 0 from rank 1 to rank 2 sends chunk 2"):
        validate(broken, 9)


def test_deadlock_is_found_and_located() -> None:
    chunks = (Chunk(0, 2),)
    # both wait to receive before they send: each rank's recv step comes before its send step
    program = Program(
        "all_reduce",
        2,
        None,
        chunks,
        (
            ((Recv(1, 0, True),), (Send(1, 0),)),
            ((Recv(0, 0, True),), (Send(0, 0),)),
        ),
    )
    with pytest.raises(ProgramError, match=r"rank 0, step 0: deadlock: waits for rank 1 step 1"):
        validate(program, 2)


def test_reduce_counted_twice_or_not_at_all_is_refused() -> None:
    ring = ring_all_reduce(3, 9)
    # rank 1 overwrites instead of adding in the reduce-scatter: rank 1's contribution to that chunk is lost
    step = ring.steps[1][0]
    lossy = _replace_step(ring, 1, 0, (step[0], Recv(step[1].peer, step[1].chunk, False)))
    with pytest.raises(ProgramError, match=r"holding contributions .*, a all_reduce needs"):
        validate(lossy, 9)
    # rank 2 adds in the all-gather's last step: the chunk it receives is counted twice
    step = ring.steps[2][3]
    twice = _replace_step(ring, 2, 3, (step[0], Recv(step[1].peer, step[1].chunk, True)))
    with pytest.raises(ProgramError, match=r"rank 2, step 4: .*x2"):
        validate(twice, 9)


def test_bad_shapes_name_the_field() -> None:
    ring = ring_all_reduce(2, 4)
    with pytest.raises(ProgramError, match=r"chunks do not tile \[0, 4\): chunk 1 is \[3, 4\)"):
        validate(dataclasses.replace(ring, chunks=(Chunk(0, 2), Chunk(3, 4))), 4)
    with pytest.raises(ProgramError, match=r"chunks cover \[0, 4\), not \[0, 5\)"):
        validate(ring, 5)
    with pytest.raises(ProgramError, match="rank 0, step 0: .*names peer 0"):
        validate(_replace_step(ring, 0, 0, (Send(0, 0), Recv(1, 1, True))), 4)
    with pytest.raises(ProgramError, match="rank 1, step 1: .*names chunk 7"):
        validate(_replace_step(ring, 1, 1, (Send(0, 7), Recv(0, 1, False))), 4)
    with pytest.raises(ProgramError, match="root must be None"):
        validate(dataclasses.replace(ring, root=0), 4)
    with pytest.raises(ProgramError, match="root 5 of a broadcast"):
        validate(dataclasses.replace(ring, kind="broadcast", root=5), 4)
    with pytest.raises(ProgramError, match="steps has 2 ranks, world is 3"):
        validate(dataclasses.replace(ring, world=3), 4)
    with pytest.raises(ProgramError, match="rank 0, step 1: chunk 0 is overwritten and also received"):
        validate(_replace_step(ring, 0, 1, (Recv(1, 0, False), Recv(1, 0, True))), 4)
