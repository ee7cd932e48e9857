"""Builders of collective ``Program``s: ring, double binary tree, and trees packed into a fabric.

Every builder makes a program for one ``numel`` that ``validate`` accepts (tests check world
sizes 2-8 and many sizes, 1 and odd ones included). Tree programs are scheduled in global rounds
and each rank's steps are its rounds that carry a message, in order; both ends of a pair list
their messages in a round in the same order, so per-pair order matches. In a tree, with chunk i of
that tree's share and a node v of height h(v) and depth d(v):
- reduce: v sends chunk i to its parent in round i + h(v) (its children's chunk i arrived by the
  round before, added in: every input is summed exactly once on the way up);
- broadcast: v sends chunk i to each child in round i + d(v) (the overwrite arrived the round before);
- all-reduce: the reduce, then the broadcast shifted by the root's height H, so the root forwards
  chunk i in round H + i, right after its sum is complete. Reduce and broadcast of different
  chunks overlap: up and down use opposite link directions.
A packing's trees split the data by their weights, and run their rounds together.

Invariant: builders are pure functions of their arguments; every program they return is valid.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from .packing import Direction, Packing, best_root, chunk_elems, pack_trees
from .program import Chunk, Kind, Op, Program, Recv, Send
from .topology import Topology
from .trees import Tree

ELEM_BYTES = 4  # float32


def ring_all_reduce(world: int, numel: int, order: Sequence[int] | None = None) -> Program:
    """Reduce-scatter then all-gather around ``order`` (default 0..world-1): numel in world chunks;
    in step s the rank at position i sends chunk (i - s) to the next rank and adds chunk (i - s - 1)
    from the previous one, then (all-gather) forwards the completed chunks the same way."""
    order = list(range(world)) if order is None else list(order)
    if sorted(order) != list(range(world)):
        raise ValueError(f"ring order {order} is not a permutation of ranks 0..{world - 1}")
    chunks = _split(numel, [1] * world)
    steps: list[list[tuple[Op, ...]]] = [[] for _ in range(world)]
    for phase, reduce in ((0, True), (1, False)):
        for s in range(world - 1):
            for i, rank in enumerate(order):
                send = (i - s + phase) % world
                steps[rank].append(
                    (
                        Send(order[(i + 1) % world], send),
                        Recv(order[(i - 1) % world], (send - 1) % world, reduce),
                    )
                )
    return Program("all_reduce", world, None, chunks, _freeze(steps))


def binary_tree(ranks: Sequence[int], world: int) -> Tree:
    """The in-order binary tree over ``ranks`` (root in the middle, halves below)."""
    parent: list[int | None] = [None] * world

    def build(lo: int, hi: int, up: int | None) -> None:
        if lo >= hi:
            return
        mid = (lo + hi) // 2
        parent[ranks[mid]] = up
        build(lo, mid, ranks[mid])
        build(mid + 1, hi, ranks[mid])

    build(0, len(ranks), None)
    return Tree(ranks[len(ranks) // 2], tuple(parent))


def double_binary_tree_all_reduce(world: int, numel: int, chunk: int | None = None) -> Program:
    """NCCL's double binary tree: half the data on an in-order binary tree, half on the same tree
    over ranks shifted by one (most leaves of one are inner nodes of the other)."""
    first = binary_tree(list(range(world)), world)
    second = binary_tree([(r + 1) % world for r in range(world)], world)
    trees = (first, second) if world > 1 else (first,)
    return tree_program("all_reduce", trees, [1.0] * len(trees), numel, chunk)


def tree_program(
    kind: Kind, trees: Sequence[Tree], weights: Sequence[float], numel: int, chunk: int | None = None
) -> Program:
    """Split ``numel`` over ``trees`` by ``weights``, each share in chunks of ``chunk`` elements
    (None: the share in one chunk), and schedule reduce/broadcast/all-reduce rounds on them."""
    if not trees or len(trees) != len(weights) or any(w <= 0 for w in weights):
        raise ValueError(f"need trees with positive weights, got {len(trees)} trees, weights {list(weights)}")
    world = trees[0].world
    roots = {t.root for t in trees}
    if any(t.world != world for t in trees) or (kind != "all_reduce" and len(roots) > 1):
        raise ValueError("trees must span the same ranks and, for a broadcast or reduce, share the root")
    shares = _split(numel, weights)
    chunks: list[Chunk] = []
    rounds: dict[int, list[list[tuple[tuple[int, int], Op]]]] = {}

    def post(rnd: int, sender: int, receiver: int, index: int, reduce: bool) -> None:
        per_rank = rounds.setdefault(rnd, [[] for _ in range(world)])
        per_rank[sender].append(((index, sender), Send(receiver, index)))
        per_rank[receiver].append(((index, sender), Recv(sender, index, reduce)))

    for tree, share in zip(trees, shares, strict=True):
        if share.numel == 0 and numel > 0:
            continue
        size = share.numel if chunk is None else max(1, chunk)
        first = len(chunks)
        chunks.extend(_pieces(share, size))
        top = tree.height[tree.root]
        for i, index in enumerate(range(first, len(chunks))):
            for parent, child in tree.edges():
                if kind in ("reduce", "all_reduce"):
                    post(i + tree.height[child], child, parent, index, True)
                if kind in ("broadcast", "all_reduce"):
                    shift = top if kind == "all_reduce" else 0
                    post(shift + i + tree.depth[parent], parent, child, index, False)
    steps: list[list[tuple[Op, ...]]] = [[] for _ in range(world)]
    for rnd in sorted(rounds):
        for rank, ops in enumerate(rounds[rnd]):
            if ops:
                steps[rank].append(tuple(op for _, op in sorted(ops, key=lambda item: item[0])))
    root = None if kind == "all_reduce" else trees[0].root
    return Program(kind, world, root, tuple(chunks), _freeze(steps))


def packed_program(
    topology: Topology,
    kind: Kind,
    numel: int,
    root: int | None = None,
    chunk: int | None = None,
    max_trees: int = 4,
    packing: Packing | None = None,
) -> Program:
    """Blink: pack trees into ``topology`` (all-reduce: the best root unless given), split the data
    by the trees' rates, chunk size from ``chunk_elems`` unless given. ``packing`` reuses one."""
    if packing is None:
        direction: Direction = kind
        if kind == "all_reduce" and root is None:
            packing = best_root(topology, direction, max_trees)
        else:
            packing = pack_trees(topology, 0 if root is None else root, direction, max_trees)
    if packing.direction != kind:
        raise ValueError(f"a {packing.direction} packing cannot make a {kind} program")
    if topology.world == 1:
        return Program(kind, 1, None if kind == "all_reduce" else 0, _split(numel, [1]), ((),))
    if chunk is None:
        chunk = packing_chunk(topology, packing, numel)
    return tree_program(kind, packing.trees, packing.weights, numel, chunk)


def packing_chunk(topology: Topology, packing: Packing, numel: int, elem_bytes: int = ELEM_BYTES) -> int:
    """``chunk_elems`` for the packing's heaviest tree: its share, its pipeline depth, the slowest
    link latency, and its rate."""
    heaviest = max(range(len(packing.trees)), key=lambda t: packing.weights[t])
    tree = packing.trees[heaviest]
    share = round(numel * packing.weights[heaviest] / packing.rate)
    depth = tree.height[tree.root] * (2 if packing.direction == "all_reduce" else 1)
    latency = max(
        (
            link.latency
            for p, c in tree.edges()
            for link in (topology.link(p, c), topology.link(c, p))
            if link
        ),
        default=0.0,
    )
    return chunk_elems(share, elem_bytes, depth, latency, packing.weights[heaviest])


def best_ring(topology: Topology) -> list[int]:
    """The ring order whose slowest hop is fastest (NCCL's search for one ring; rank 0 first)."""
    if topology.world <= 2:
        return list(range(topology.world))
    best, best_bw = list(range(topology.world)), -1.0
    for rest in itertools.permutations(range(1, topology.world)):
        order = [0, *rest]
        hops = [topology.link(a, b) for a, b in zip(order, order[1:] + order[:1], strict=True)]
        bottleneck = min((h.bandwidth if h else 0.0) for h in hops)
        if bottleneck > best_bw:
            best, best_bw = order, bottleneck
    return best


def _split(numel: int, weights: Sequence[float]) -> tuple[Chunk, ...]:
    """``numel`` in consecutive ranges proportional to ``weights`` (largest remainder)."""
    total = sum(weights)
    exact = [numel * w / total for w in weights]
    sizes = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: sizes[i] - exact[i])[: numel - sum(sizes)]:
        sizes[i] += 1
    starts = list(itertools.accumulate([0, *sizes]))
    return tuple(Chunk(a, b) for a, b in itertools.pairwise(starts))


def _pieces(share: Chunk, size: int) -> list[Chunk]:
    if share.numel == 0:
        return [share]
    return [Chunk(a, min(a + size, share.stop)) for a in range(share.start, share.stop, size)]


def _freeze(steps: list[list[tuple[Op, ...]]]) -> tuple[tuple[tuple[Op, ...], ...], ...]:
    return tuple(tuple(rank_steps) for rank_steps in steps)
