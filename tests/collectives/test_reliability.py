"""reliability: path loss composes, a class's link budget follows from its bound and hops, the
admissible sub-topology drops what a class may not use, the placement predicate returns the
reliable island's hosts, packings of a class never route over lossier links, costs add up."""

from __future__ import annotations

import pytest

from cloud.training.collectives import fabrics
from cloud.training.collectives.packing import pack_trees
from cloud.training.collectives.reliability import (
    CLASSES,
    ClassViolation,
    ReliabilityClass,
    admissible_groups,
    admissible_nodes,
    admissible_topology,
    cost_by_class,
    link_class,
    pack_for_class,
    path_loss,
    worst_path_loss,
)
from cloud.training.collectives.topology import Link, Topology

A, B_, C = CLASSES


def chain(losses: list[float]) -> Topology:
    """Ranks 0..n linked both ways in a line, hop i losing losses[i]."""
    links = []
    for i, loss in enumerate(losses):
        links += [Link(i, i + 1, 1e9, loss=loss), Link(i + 1, i, 1e9, loss=loss)]
    return Topology(tuple(f"r{i}" for i in range(len(losses) + 1)), tuple(links))


def test_path_loss_composes() -> None:
    line = chain([0.1, 0.1, 0.5])
    assert path_loss(line, [0, 1, 2]) == pytest.approx(0.19)
    assert path_loss(line, [0, 1, 2, 3]) == pytest.approx(1 - 0.81 * 0.5)
    assert path_loss(line, [2]) == 0.0
    with pytest.raises(ValueError, match="no link from 0 to 2"):
        path_loss(line, [0, 2])


def test_link_budget_and_link_class() -> None:
    two_hops = ReliabilityClass("X", 0.19, max_hops=2)
    assert two_hops.link_budget == pytest.approx(0.1)
    assert A.link_budget == pytest.approx(1 - (1 - 1e-6) ** 0.25)
    assert link_class(Link(0, 1, 1.0, loss=fabrics.RELIABLE_LOSS)) == "A"
    assert link_class(Link(0, 1, 1.0, loss=fabrics.CHEAP_LOSS)) == "C"
    assert link_class(Link(0, 1, 1.0, loss=0.5)) is None
    with pytest.raises(ValueError, match="max_path_loss"):
        ReliabilityClass("bad", 1.0)


def test_admissible_topology_and_nodes_on_a_mixed_fabric() -> None:
    fabric = fabrics.mixed_reliability(4, 2, reliable_machines=[1, 2])
    strict = admissible_topology(fabric, A)
    assert all(link.loss <= A.link_budget for link in strict.links)
    assert strict.link(2, 4) is not None  # m1 -> m2: reliable optics
    assert strict.link(0, 2) is None  # m0 -> m1: cheap optics
    assert admissible_nodes(fabric, A) == {"m1", "m2"}
    assert admissible_nodes(fabric, C) == {"m0", "m1", "m2", "m3"}
    groups = admissible_groups(fabric, A)
    assert groups[0] == {2, 3, 4, 5} and {0, 1} in groups and {6, 7} in groups


def test_packing_of_a_class_uses_only_its_links() -> None:
    fabric = fabrics.mixed_reliability(3, 2, reliable_machines=[0, 1])
    island = fabric.subset([0, 1, 2, 3])  # m0 and m1
    packing = pack_for_class(island, A)
    assert worst_path_loss(island, packing) <= A.max_path_loss
    whole = fabric.subset([0, 1, 4, 5])  # m0 and m2: only cheap optics between them
    with pytest.raises(ValueError, match="cannot be reached"):
        pack_for_class(whole, A)
    assert worst_path_loss(whole, pack_for_class(whole, C)) <= C.max_path_loss


def test_worst_path_loss_by_direction() -> None:
    line = chain([0.1, 0.2])
    up = pack_trees(line, 0, "reduce")
    assert worst_path_loss(line, up) == pytest.approx(1 - 0.9 * 0.8)
    both = pack_trees(line, 1, "all_reduce")
    # the all-reduce result at rank 2 holds rank 2's own input after its trip up and back down
    assert worst_path_loss(line, both) == pytest.approx(1 - 0.8 * 0.8)
    assert worst_path_loss(line, pack_trees(line, 0, "all_reduce")) == pytest.approx(1 - (0.9 * 0.8) ** 2)


def test_a_deep_tree_beyond_max_hops_is_a_violation() -> None:
    # every link within the budget of a 1-hop class, but the only tree is a 3-hop chain
    tight = ReliabilityClass("T", 0.01, max_hops=1)
    line = chain([0.009, 0.009, 0.009])
    with pytest.raises(ClassViolation, match="class T"):
        pack_for_class(line, tight, root=0, direction="broadcast")


def test_cost_by_class() -> None:
    fabric = fabrics.mixed_reliability(3, 1, reliable_machines=[0, 1])
    costs = cost_by_class(fabric)
    assert costs["A"] == pytest.approx(2 * fabrics.RELIABLE_COST)
    assert costs["C"] == pytest.approx(4 * fabrics.CHEAP_COST)
    assert costs["B"] == 0.0 and costs["none"] == 0.0
    everything = cost_by_class(fabrics.mixed_reliability(3, 1, [], all_reliable=True))
    assert everything["A"] == pytest.approx(6 * fabrics.RELIABLE_COST)
