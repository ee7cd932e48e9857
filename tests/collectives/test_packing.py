"""packing: the LP finds the known optima (a full mesh: (n-1)B for a broadcast by Edmonds'
theorem, nB/2 for an all-reduce by Nash-Williams'; a bidirectional ring: 2B using both directions,
nB/(n-1) for an all-reduce); shared media cap what their links carry; pruning keeps few trees; the
chunk size minimises the pipeline's cost model; Chu-Liu/Edmonds finds the cheapest tree."""

from __future__ import annotations

import itertools
import math

import pytest

from cloud.training.collectives import fabrics
from cloud.training.collectives.packing import chunk_elems, load, pack_trees, tree_links
from cloud.training.collectives.topology import Link, Medium, Topology
from cloud.training.collectives.trees import NoSpanningTree, Tree, min_arborescence

B = 1e9


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_full_mesh_optima(n: int) -> None:
    mesh = fabrics.full_mesh(n, B)
    assert pack_trees(mesh, 0, "broadcast", max_trees=64).rate == pytest.approx((n - 1) * B)
    assert pack_trees(mesh, n - 1, "reduce", max_trees=64).rate == pytest.approx((n - 1) * B)
    assert pack_trees(mesh, 0, "all_reduce", max_trees=64).optimum == pytest.approx(n * B / 2)


@pytest.mark.parametrize("n", [3, 4, 6])
def test_ring_uses_both_directions(n: int) -> None:
    ring = fabrics.ring(n, B)
    packing = pack_trees(ring, 0, "broadcast")
    assert packing.rate == pytest.approx(2 * B)  # one direction alone gives B
    used = {edge for tree in packing.trees for edge in tree.edges()}
    assert (0, 1) in used and (0, n - 1) in used
    assert pack_trees(ring, 0, "all_reduce", max_trees=n).rate == pytest.approx(n * B / (n - 1))


def test_packing_respects_every_capacity() -> None:
    fabric = fabrics.dgx1((0, 1, 2, 5, 6))
    packing = pack_trees(fabric, 0, "all_reduce")
    capacities = {f"{link.src}>{link.dst}": link.bandwidth for link in fabric.links}
    capacities |= {m.name: m.bandwidth for m in fabric.media}
    for name, used in load(fabric, packing).items():
        assert used <= capacities[name] * (1 + 1e-9), name
    assert len(packing.trees) <= 4 and all(w > 0 for w in packing.weights)
    assert packing.rate <= packing.optimum * (1 + 1e-9)


def test_a_shared_medium_caps_the_links_that_draw_on_it() -> None:
    # rank 0 reaches 1 and 2 over links of B each, both through its port of B: the root sends B in all
    star = Topology(
        ("r0", "r1", "r2"),
        (Link(0, 1, B, media=("port",)), Link(0, 2, B, media=("port",)), Link(1, 2, B), Link(2, 1, B)),
        media=(Medium("port", B),),
    )
    assert pack_trees(star, 0, "broadcast").rate == pytest.approx(B)
    free = star.only_links(Link(link.src, link.dst, link.bandwidth) for link in star.links)
    assert pack_trees(free, 0, "broadcast").rate == pytest.approx(2 * B)


def test_pruning_to_one_tree_keeps_the_best_single_tree() -> None:
    mesh = fabrics.full_mesh(4, B)
    single = pack_trees(mesh, 0, "broadcast", max_trees=1)
    assert len(single.trees) == 1
    assert single.rate == pytest.approx(B)  # one tree crosses each of its links once
    assert single.optimum == pytest.approx(3 * B)


def test_unreachable_rank_is_refused() -> None:
    one_way = Topology(("a", "b", "c"), (Link(0, 1, B), Link(1, 0, B), Link(2, 0, B)))
    with pytest.raises(NoSpanningTree, match=r"\[2\]"):
        pack_trees(one_way, 0, "broadcast")
    assert pack_trees(one_way, 0, "reduce").rate == pytest.approx(B)  # 2 -> 0 and 1 -> 0: both B, B


def test_tree_links_by_direction() -> None:
    chain = Tree(0, (None, 0, 1))
    assert tree_links(chain, "broadcast") == [(0, 1), (1, 2)]
    assert tree_links(chain, "reduce") == [(1, 0), (2, 1)]
    assert sorted(tree_links(chain, "all_reduce")) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert chain.depth == (0, 1, 2) and chain.height == (2, 1, 0)


def test_chunk_size_minimises_the_cost_model() -> None:
    numel, latency, bandwidth, depth = 1_000_000, 1e-5, 1e10, 4
    best = chunk_elems(numel, 4, depth, latency, bandwidth)
    assert best == round(math.sqrt(numel * 4 * latency * bandwidth / depth) / 4)

    def cost(c: int) -> float:
        return (numel / c + depth) * (latency + 4 * c / bandwidth)

    assert cost(best) <= min(cost(best // 2), cost(best * 2))
    assert chunk_elems(1, 4, depth, latency, bandwidth) == 1
    assert chunk_elems(10, 4, depth, 1.0, bandwidth) == 10  # latency-bound: one chunk


def test_min_arborescence_matches_brute_force() -> None:
    costs = {(u, v): float((3 * u + 5 * v) % 7 + 1) for u, v in itertools.permutations(range(4), 2)}
    best = min_arborescence(4, 0, costs)
    cheapest = math.inf
    for parents in itertools.product(range(4), repeat=3):
        try:
            tree = Tree(0, (None, *parents))
        except ValueError:
            continue
        cheapest = min(cheapest, sum(costs[e] for e in tree.edges()))
    assert sum(costs[e] for e in best.edges()) == cheapest
