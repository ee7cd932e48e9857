"""simulate: the ring all-reduce takes 2(P-1)/P * N / B (plus 2(P-1) latencies); links and
media shared by concurrent messages divide their bandwidth; a pipelined chain takes (K + 1) chunk
times; loss costs its share of bandwidth; programs a topology cannot carry are refused."""

from __future__ import annotations

import pytest

from cloud.training.collectives import fabrics, plans
from cloud.training.collectives.program import Chunk, Program, Recv, Send
from cloud.training.collectives.simulate import SimulationError, rank_finish_times, simulate
from cloud.training.collectives.topology import Link, Medium, Topology
from cloud.training.collectives.trees import Tree

B = 1e9


@pytest.mark.parametrize("world", range(2, 9))
def test_ring_law(world: int) -> None:
    numel = world * 1000
    predicted = simulate(plans.ring_all_reduce(world, numel), fabrics.ring(world, B))
    assert predicted == pytest.approx(2 * (world - 1) / world * numel * 4 / B)
    latency = 1e-5
    with_latency = simulate(plans.ring_all_reduce(world, numel), fabrics.ring(world, B, latency))
    assert with_latency == pytest.approx(predicted + 2 * (world - 1) * latency)


def one_step(*pairs: tuple[int, int]) -> Program:
    """Every (src, dst) sends its own 1000-element chunk in one step."""
    world = 1 + max(max(pair) for pair in pairs)
    steps: list[list] = [[] for _ in range(world)]
    for i, (src, dst) in enumerate(pairs):
        steps[src].append(Send(dst, i))
        steps[dst].append(Recv(src, i, False))
    chunks = tuple(Chunk(1000 * i, 1000 * (i + 1)) for i in range(len(pairs)))
    return Program("all_reduce", world, None, chunks, tuple((tuple(s),) if s else () for s in steps))


def test_concurrent_messages_share_a_link() -> None:
    two = Topology(("a", "b"), (Link(0, 1, B), Link(1, 0, B)))
    assert simulate(one_step((0, 1)), two) == pytest.approx(4000 / B)
    assert simulate(one_step((0, 1), (0, 1)), two) == pytest.approx(8000 / B)
    assert simulate(one_step((0, 1), (1, 0)), two) == pytest.approx(4000 / B)  # full duplex


def test_a_medium_is_shared_by_its_links() -> None:
    port = Topology(
        ("a", "b", "c"),
        (Link(0, 1, B, media=("port",)), Link(0, 2, B, media=("port",))),
        media=(Medium("port", B),),
    )
    assert simulate(one_step((0, 1), (0, 2)), port) == pytest.approx(8000 / B)
    free = port.only_links([Link(0, 1, B), Link(0, 2, B)])
    assert simulate(one_step((0, 1), (0, 2)), free) == pytest.approx(4000 / B)


def test_unequal_shares_finish_at_their_own_times() -> None:
    # a 1000- and a 3000-element message start together on one link: the short one ends at 2x its
    # alone time, then the long one has the link to itself
    two = Topology(("a", "b"), (Link(0, 1, B),))
    program = Program(
        "all_reduce",
        2,
        None,
        (Chunk(0, 1000), Chunk(1000, 4000)),
        (((Send(1, 0), Send(1, 1)),), ((Recv(0, 0, False), Recv(0, 1, False)),)),
    )
    assert simulate(program, two) == pytest.approx(16000 / B)


def test_pipelined_chain_broadcast() -> None:
    chain = Tree(0, (None, 0, 1))
    chunks, size = 8, 1000
    program = plans.tree_program("broadcast", [chain], [1.0], chunks * size, chunk=size)
    finish = rank_finish_times(program, fabrics.ring(3, B))
    assert max(finish) == pytest.approx((chunks + 1) * size * 4 / B)
    assert finish[0] == pytest.approx(chunks * size * 4 / B)


def test_loss_costs_its_share_of_bandwidth() -> None:
    lossy = Topology(("a", "b"), (Link(0, 1, B, loss=0.2),))
    assert simulate(one_step((0, 1)), lossy) == pytest.approx(4000 / (0.8 * B))


def test_empty_chunks_cost_nothing() -> None:
    assert simulate(plans.ring_all_reduce(4, 0), fabrics.ring(4, B, 1e-3)) == 0.0


def test_missing_link_and_world_mismatch_are_refused() -> None:
    ring = fabrics.ring(4, B)
    with pytest.raises(SimulationError, match="no such link"):
        simulate(one_step((0, 2)), Topology(("a", "b", "c"), (Link(0, 1, B),)))
    with pytest.raises(SimulationError, match="ranks"):
        simulate(plans.ring_all_reduce(3, 9), ring)
    # each rank first waits for what the other sends only in its second step
    waits = (((Recv(1, 0, False),), (Send(1, 1),)), ((Recv(0, 1, False),), (Send(0, 0),)))
    deadlock = Program("all_reduce", 2, None, (Chunk(0, 1), Chunk(1, 2)), waits)
    with pytest.raises(SimulationError, match="deadlock"):
        simulate(deadlock, fabrics.ring(2, B))


def test_trees_beat_the_ring_on_a_fragmented_dgx1() -> None:
    # GPUs 0-4: NVLink cannot close a ring through GPU 4 (its only NVLink here is to 0), so the ring
    # falls back to PCIe; the trees use NVLink and PCIe at once
    fabric = fabrics.dgx1((0, 1, 2, 3, 4))
    numel = 1 << 22
    ring = simulate(plans.ring_all_reduce(5, numel, plans.best_ring(fabric)), fabric)
    trees = simulate(plans.packed_program(fabric, "all_reduce", numel), fabric)
    assert trees < ring
