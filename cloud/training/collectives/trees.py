"""Directed spanning trees (arborescences): the shape data flows along in a tree collective.

A ``Tree`` is a parent map over ranks 0..world-1: ``parent[root] is None``, every other rank has
a parent, and following parents from any rank reaches the root. Broadcast flows down its edges
(parent -> child), reduce up them (child -> parent). ``min_arborescence`` is Chu-Liu/Edmonds:
the cheapest such tree under edge costs, which the packing's column generation prices with.

Invariant: a constructed ``Tree`` spans all its ranks and has no cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property


class NoSpanningTree(ValueError):
    """No directed spanning tree from the root exists over the allowed edges."""


@dataclass(frozen=True)
class Tree:
    root: int
    parent: tuple[int | None, ...]

    def __post_init__(self) -> None:
        world = len(self.parent)
        if not 0 <= self.root < world or self.parent[self.root] is not None:
            raise ValueError(f"tree root {self.root}: parent[root] must be None in {self.parent}")
        for rank in range(world):
            seen = {rank}
            node = self.parent[rank]
            while node is not None:
                if node in seen or not 0 <= node < world:
                    raise ValueError(f"tree {self.parent}: rank {rank} does not reach the root")
                seen.add(node)
                node = self.parent[node]
            if rank != self.root and self.root not in seen:
                raise ValueError(f"tree {self.parent}: rank {rank} has no parent")

    @property
    def world(self) -> int:
        return len(self.parent)

    def edges(self) -> list[tuple[int, int]]:
        """(parent, child) pairs, children in rank order."""
        return [(p, c) for c, p in enumerate(self.parent) if p is not None]

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in self.parent]
        for p, c in self.edges():
            kids[p].append(c)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        """Hops from the root."""
        out = [0] * self.world
        for rank in range(self.world):
            node = self.parent[rank]
            while node is not None:
                out[rank] += 1
                node = self.parent[node]
        return tuple(out)

    @cached_property
    def height(self) -> tuple[int, ...]:
        """Hops to the deepest leaf below (0 for a leaf)."""
        out = [0] * self.world
        for rank in sorted(range(self.world), key=lambda r: -self.depth[r]):
            parent = self.parent[rank]
            if parent is not None:
                out[parent] = max(out[parent], out[rank] + 1)
        return tuple(out)

    def path_to_root(self, rank: int) -> list[tuple[int, int]]:
        """The (parent, child) edges between ``rank`` and the root."""
        edges = []
        while (parent := self.parent[rank]) is not None:
            edges.append((parent, rank))
            rank = parent
        return edges


def min_arborescence(world: int, root: int, cost: Mapping[tuple[int, int], float]) -> Tree:
    """The spanning tree rooted at ``root`` of least total cost over the edges (parent, child) in
    ``cost``; raises ``NoSpanningTree`` if some rank cannot be reached."""
    pairs = [(u, v) for u, v in cost if u != v and v != root]
    chosen = _edmonds(set(range(world)), root, [(u, v, cost[(u, v)]) for u, v in pairs])
    parent: list[int | None] = [None] * world
    for index in chosen:
        u, v = pairs[index]
        parent[v] = u
    return Tree(root, tuple(parent))


_Edge = tuple[int, int, float]  # (from, to, cost)


def _edmonds(nodes: set[int], root: int, edges: list[_Edge]) -> list[int]:
    """Indices into ``edges`` of the cheapest arborescence (contract a cycle, recurse, expand)."""
    best: dict[int, int] = {}
    for index, (u, v, w) in enumerate(edges):
        if v != root and u != v and (v not in best or w < edges[best[v]][2]):
            best[v] = index
    missing = nodes - set(best) - {root}
    if missing:
        raise NoSpanningTree(f"no edge reaches rank(s) {sorted(missing)} from root {root}")
    cycle = _find_cycle(nodes, root, {v: edges[i][0] for v, i in best.items()})
    if cycle is None:
        return [best[v] for v in nodes if v != root]
    merged = max(nodes) + 1
    contracted: list[_Edge] = []
    back: list[int] = []  # contracted edge -> its edge at this level
    for index, (u, v, w) in enumerate(edges):
        if u in cycle and v in cycle:
            continue
        if v in cycle:
            contracted.append((u, merged, w - edges[best[v]][2]))
        elif u in cycle:
            contracted.append((merged, v, w))
        else:
            contracted.append((u, v, w))
        back.append(index)
    chosen = [back[j] for j in _edmonds((nodes - cycle) | {merged}, root, contracted)]
    entered = next(edges[i][1] for i in chosen if edges[i][1] in cycle)
    return chosen + [best[v] for v in cycle if v != entered]


def _find_cycle(nodes: set[int], root: int, parent: dict[int, int]) -> set[int] | None:
    state: dict[int, int] = {}  # node -> the walk that visited it
    for start in nodes:
        node, walk = start, []
        while node != root and node not in state:
            state[node] = start
            walk.append(node)
            node = parent[node]
        if node != root and state.get(node) == start:
            return set(walk[walk.index(node) :])
    return None
