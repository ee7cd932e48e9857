"""Maximum fractional packing of directed spanning trees into a fabric (Blink's tree packing).

The LP: maximise the total rate sum(w_t) over spanning trees t rooted at ``root``, each carrying
w_t bytes/s, such that every link and every shared medium carries no more than its bandwidth. A
tree uses its edges parent->child for a broadcast, child->parent for a reduce, and both for an
all-reduce (reduce up, then broadcast down, pipelined so both run at once). The trees are not
enumerated: column generation adds, while one exists, the tree whose cost under the LP's dual
prices is below 1 (``min_arborescence``), and HiGHS re-solves; at the end no tree improves the
rate, so it is the optimum over all trees. Then the packing is pruned to the ``max_trees``
heaviest trees and their rates re-solved (``rate`` after, ``optimum`` before).

``chunk_elems`` is the cost model for the pipeline's chunk: a tree of depth D moving n bytes in
chunks of c bytes takes about (n/c + D) * (latency + c/bandwidth); its minimum is at
c = sqrt(n * latency * bandwidth / D).

Invariant: a ``Packing``'s weights are positive, its trees span the topology, and no link or
medium is loaded past its bandwidth by the weights (``load``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import linprog

from .topology import Topology
from .trees import NoSpanningTree, Tree, min_arborescence

Direction = Literal["broadcast", "reduce", "all_reduce"]
_IMPROVES = 1e-7  # a tree enters when its dual cost is below 1 - this
_MAX_ROUNDS = 500


@dataclass(frozen=True)
class Packing:
    direction: Direction
    root: int
    trees: tuple[Tree, ...]
    weights: tuple[float, ...]  # bytes/s each tree carries
    optimum: float  # the LP's rate over all trees, before pruning

    @property
    def rate(self) -> float:
        return sum(self.weights)


def tree_links(tree: Tree, direction: Direction) -> list[tuple[int, int]]:
    """The directed links (src, dst) a tree's data crosses in this direction."""
    down = tree.edges()
    if direction == "broadcast":
        return down
    up = [(c, p) for p, c in down]
    return up if direction == "reduce" else down + up


def pack_trees(
    topology: Topology, root: int = 0, direction: Direction = "all_reduce", max_trees: int = 4
) -> Packing:
    """The maximum fractional packing rooted at ``root`` (see the module docstring)."""
    if not 0 <= root < topology.world:
        raise ValueError(f"root {root} is not a rank of {topology.world}")
    if max_trees < 1:
        raise ValueError(f"max_trees must be at least 1, got {max_trees}")
    if topology.world == 1:
        return Packing(direction, root, (Tree(root, (None,)),), (math.inf,), math.inf)
    resources = _Resources(topology, direction)
    trees = [_first_tree(topology, root, resources)]
    weights, duals = resources.solve(trees)
    for _ in range(_MAX_ROUNDS):
        candidate = min_arborescence(topology.world, root, resources.edge_prices(duals))
        if resources.price(candidate, duals) >= 1.0 - _IMPROVES or candidate in trees:
            break
        trees.append(candidate)
        weights, duals = resources.solve(trees)
    optimum = float(weights.sum())
    order = sorted(range(len(trees)), key=lambda t: -weights[t])
    kept = [trees[t] for t in order[:max_trees] if weights[t] > 0]
    kept_weights, _ = resources.solve(kept)
    pairs = [(t, float(w)) for t, w in zip(kept, kept_weights, strict=True) if w > optimum * 1e-9]
    return Packing(
        direction,
        root,
        tuple(t for t, _ in pairs),
        tuple(w * resources.scale for _, w in pairs),
        optimum * resources.scale,
    )


def best_root(topology: Topology, direction: Direction = "all_reduce", max_trees: int = 4) -> Packing:
    """The packing of the root with the highest rate (ties: the lowest rank)."""
    packings = [pack_trees(topology, r, direction, max_trees) for r in range(topology.world)]
    return max(packings, key=lambda p: (p.rate, -p.root))


def load(topology: Topology, packing: Packing) -> dict[str, float]:
    """Bytes/s the packing puts on each link (``"src>dst"``) and medium, at its weights."""
    loads: dict[str, float] = {}
    for tree, weight in zip(packing.trees, packing.weights, strict=True):
        for src, dst in tree_links(tree, packing.direction):
            link = topology.link(src, dst)
            assert link is not None
            for name in (f"{src}>{dst}", *link.media):
                loads[name] = loads.get(name, 0.0) + weight
    return loads


def chunk_elems(numel: int, elem_bytes: int, depth: int, latency: float, bandwidth: float) -> int:
    """Elements per pipeline chunk minimising (n/c + depth) * (latency + c/bandwidth)."""
    if numel <= 1 or depth <= 0:
        return max(numel, 1)
    best_bytes = math.sqrt(numel * elem_bytes * latency * bandwidth / depth)
    return int(min(numel, max(1, round(best_bytes / elem_bytes))))


class _Resources:
    """The LP's rows: one per link, one per medium; capacities scaled so the largest is 1."""

    def __init__(self, topology: Topology, direction: Direction) -> None:
        self.direction = direction
        self.scale = max(link.bandwidth for link in topology.links) if topology.links else 1.0
        self.row: dict[str, int] = {}
        capacity: list[float] = []
        for link in topology.links:
            self.row[f"{link.src}>{link.dst}"] = len(capacity)
            capacity.append(link.bandwidth / self.scale)
        for medium in topology.media:
            self.row[medium.name] = len(capacity)
            capacity.append(medium.bandwidth / self.scale)
        self.capacity = np.array(capacity)
        self.rows_of_link = {
            (link.src, link.dst): [self.row[f"{link.src}>{link.dst}"]] + [self.row[m] for m in link.media]
            for link in topology.links
        }

    def usable(self, parent: int, child: int) -> bool:
        if self.direction == "broadcast":
            return (parent, child) in self.rows_of_link
        if self.direction == "reduce":
            return (child, parent) in self.rows_of_link
        return (parent, child) in self.rows_of_link and (child, parent) in self.rows_of_link

    def column(self, tree: Tree) -> np.ndarray:
        column = np.zeros(len(self.capacity))
        for pair in tree_links(tree, self.direction):
            for row in self.rows_of_link[pair]:
                column[row] += 1.0
        return column

    def solve(self, trees: list[Tree]) -> tuple[np.ndarray, np.ndarray]:
        """Tree weights maximising their sum, and the rows' dual prices (>= 0)."""
        matrix = np.column_stack([self.column(t) for t in trees])
        result = linprog(
            -np.ones(len(trees)), A_ub=matrix, b_ub=self.capacity, bounds=(0, None), method="highs"
        )
        if result.status != 0:
            raise RuntimeError(f"tree packing LP failed: {result.message}")
        return np.asarray(result.x), -np.asarray(result.ineqlin.marginals)

    def edge_prices(self, duals: np.ndarray) -> dict[tuple[int, int], float]:
        prices = {}
        for parent, child in self.rows_of_link:
            for pair in ((parent, child), (child, parent)):
                if self.usable(*pair) and pair not in prices:
                    prices[pair] = self._edge_price(pair, duals)
        return prices

    def _edge_price(self, pair: tuple[int, int], duals: np.ndarray) -> float:
        parent, child = pair
        crossed = {"broadcast": [pair], "reduce": [(child, parent)], "all_reduce": [pair, (child, parent)]}
        return float(sum(duals[row] for link in crossed[self.direction] for row in self.rows_of_link[link]))

    def price(self, tree: Tree, duals: np.ndarray) -> float:
        return float(self.column(tree) @ duals)


def _first_tree(topology: Topology, root: int, resources: _Resources) -> Tree:
    """A breadth-first tree over usable edges, or ``NoSpanningTree``."""
    parent: list[int | None] = [None] * topology.world
    reached, frontier = {root}, [root]
    while frontier:
        nxt = []
        for u in frontier:
            for v in range(topology.world):
                if v not in reached and resources.usable(u, v):
                    parent[v] = u
                    reached.add(v)
                    nxt.append(v)
        frontier = nxt
    if len(reached) < topology.world:
        missing = sorted(set(range(topology.world)) - reached)
        raise NoSpanningTree(
            f"rank(s) {missing} cannot be reached from root {root} for a {resources.direction}"
        )
    return Tree(root, tuple(parent))
