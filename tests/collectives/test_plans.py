"""plans: every builder's program passes ``validate`` for world sizes 2-8 and sizes from 0 and 1
element to odd and large ones; the ring follows its order; tree programs pipeline in chunks."""

from __future__ import annotations

import pytest

from cloud.training.collectives import fabrics, plans
from cloud.training.collectives.packing import pack_trees
from cloud.training.collectives.program import Recv, Send, validate
from cloud.training.collectives.trees import Tree

SIZES = [0, 1, 2, 3, 7, 8, 13, 64, 1001, 4099]


@pytest.mark.parametrize("world", range(1, 9))
def test_ring_and_double_binary_tree_are_valid(world: int) -> None:
    for numel in SIZES:
        validate(plans.ring_all_reduce(world, numel), numel)
        validate(plans.ring_all_reduce(world, numel, list(reversed(range(world)))), numel)
        for chunk in (None, 1, 5, 256) if numel <= 64 else (None, 256):
            validate(plans.double_binary_tree_all_reduce(world, numel, chunk), numel)


@pytest.mark.parametrize("world", range(2, 9))
def test_packed_programs_on_a_full_mesh_are_valid(world: int) -> None:
    mesh = fabrics.full_mesh(world, 1e9, 1e-6)
    packings = {
        "all_reduce": pack_trees(mesh, 0, "all_reduce"),
        "broadcast": pack_trees(mesh, world - 1, "broadcast"),
        "reduce": pack_trees(mesh, world // 2, "reduce"),
    }
    for numel in SIZES:
        for kind, packing in packings.items():
            for chunk in (None, 7):
                program = plans.packed_program(mesh, kind, numel, chunk=chunk, packing=packing)
                validate(program, numel)


@pytest.mark.parametrize("gpus", [(0, 1, 2), (0, 5, 6), (1, 2, 4, 7), (0, 1, 2, 3, 4), tuple(range(8))])
def test_packed_programs_on_dgx1_allocations_are_valid(gpus: tuple[int, ...]) -> None:
    fabric = fabrics.dgx1(gpus)
    packings = {
        "all_reduce": pack_trees(fabric, 0, "all_reduce"),
        "broadcast": pack_trees(fabric, 1, "broadcast"),
        "reduce": pack_trees(fabric, len(gpus) - 1, "reduce"),
    }
    for numel in (1, 3, 1001, 30_011):
        for kind, packing in packings.items():
            validate(plans.packed_program(fabric, kind, numel, packing=packing), numel)


def test_ring_follows_its_order() -> None:
    program = plans.ring_all_reduce(3, 6, order=[0, 2, 1])
    assert all(op.peer == 2 for step in program.steps[0] for op in step if isinstance(op, Send))
    assert all(op.peer == 1 for step in program.steps[0] for op in step if isinstance(op, Recv))
    assert len(program.steps[0]) == 4  # 2 (P-1) steps
    with pytest.raises(ValueError, match="permutation"):
        plans.ring_all_reduce(3, 6, order=[0, 0, 1])


def test_chain_broadcast_pipelines_its_chunks() -> None:
    chain = Tree(0, (None, 0, 1))
    program = plans.tree_program("broadcast", [chain], [1.0], 10, chunk=4)
    assert [(c.start, c.stop) for c in program.chunks] == [(0, 4), (4, 8), (8, 10)]
    # the middle rank receives chunk i and forwards it a step later: K + 1 steps for K chunks
    assert program.steps[1] == (
        (Recv(0, 0, False),),
        (Send(2, 0), Recv(0, 1, False)),
        (Send(2, 1), Recv(0, 2, False)),
        (Send(2, 2),),
    )


def test_data_splits_over_trees_by_weight() -> None:
    first, second = Tree(0, (None, 0, 1)), Tree(0, (None, 2, 0))
    program = plans.tree_program("broadcast", [first, second], [3.0, 1.0], 100)
    assert [c.numel for c in program.chunks] == [75, 25]
    validate(program, 100)


def test_bad_tree_sets_are_refused() -> None:
    with pytest.raises(ValueError, match="positive weights"):
        plans.tree_program("all_reduce", [Tree(0, (None, 0))], [0.0], 4)
    with pytest.raises(ValueError, match="share the root"):
        plans.tree_program("broadcast", [Tree(0, (None, 0)), Tree(1, (1, None))], [1.0, 1.0], 4)


def test_best_ring_avoids_pcie_when_nvlink_allows() -> None:
    fabric = fabrics.dgx1()
    order = plans.best_ring(fabric)
    hops = [fabric.link(a, b) for a, b in zip(order, order[1:] + order[:1], strict=True)]
    assert all(hop is not None and hop.bandwidth == 2 * fabrics.NVLINK_BW for hop in hops)
