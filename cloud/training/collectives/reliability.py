"""Reliability classes over a fabric of mixed links (RAIL, NSDI'17).

A path's loss is 1 - prod(1 - loss) over its links. A ``ReliabilityClass`` bounds the loss of any
path a job's data crosses (``max_path_loss``) for collectives routed over at most ``max_hops``
links; from the two follows the loss a link may have to be usable by that class at all
(``link_budget``). A job declares the class it needs; it may use only the *admissible
sub-topology* of its class (the links within the class's link budget; ``admissible_topology``),
the packing runs on that (``pack_for_class``), and the trees it returns are checked path by path
against the class's bound (``worst_path_loss``).

For the cluster scheduler's placement (an allowed-node predicate): ``admissible_nodes(topology,
job_class)`` is the set of host names a multi-host job of that class may be placed on: the hosts
of the largest group of ranks joined both ways by admissible links (``admissible_groups``; ties:
the group whose first host name sorts first). A job inside one host crosses no network link and
needs no predicate. ``cost_by_class`` accounts a fabric's link cost by the strictest class each
link serves.

Invariant: every path a ``pack_for_class`` packing routes data over has loss within the class's
``max_path_loss``, or it raises ``ClassViolation`` rather than return the packing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .packing import Direction, Packing, pack_trees
from .topology import Link, Topology


class ClassViolation(ValueError):
    """A plan whose paths lose more than its reliability class allows."""


@dataclass(frozen=True)
class ReliabilityClass:
    name: str
    max_path_loss: float
    max_hops: int = 4

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_path_loss < 1.0:
            raise ValueError(f"class {self.name}: max_path_loss must be in [0, 1), got {self.max_path_loss}")
        if self.max_hops < 1:
            raise ValueError(f"class {self.name}: max_hops must be at least 1, got {self.max_hops}")

    @property
    def link_budget(self) -> float:
        """The largest loss a link may have so that max_hops of them stay within max_path_loss."""
        return 1.0 - (1.0 - self.max_path_loss) ** (1.0 / self.max_hops)


# strictest first: A for loss-sensitive jobs (all-reduce that stalls on every retransmission),
# C for jobs whose transport absorbs loss
CLASSES = (
    ReliabilityClass("A", 1e-6),
    ReliabilityClass("B", 1e-4),
    ReliabilityClass("C", 1e-2),
)


def path_loss(topology: Topology, path: Sequence[int]) -> float:
    """Loss along consecutive ranks ``path`` (each hop must be a link)."""
    return _edges_loss(topology, list(zip(path, path[1:], strict=False)))


def link_class(link: Link, classes: Sequence[ReliabilityClass] = CLASSES) -> str | None:
    """The strictest class whose link budget the link meets (None: no class)."""
    return next((c.name for c in classes if link.loss <= c.link_budget), None)


def admissible_topology(topology: Topology, job_class: ReliabilityClass) -> Topology:
    """The same ranks with only the links a job of ``job_class`` may use."""
    return topology.only_links(link for link in topology.links if link.loss <= job_class.link_budget)


def admissible_groups(topology: Topology, job_class: ReliabilityClass) -> list[set[int]]:
    """Ranks joined both ways by admissible links (strongly connected components), largest first."""
    allowed = admissible_topology(topology, job_class)
    groups: list[set[int]] = []
    unseen = set(range(topology.world))
    while unseen:
        start = min(unseen)
        group = _reach(allowed, start, forward=True) & _reach(allowed, start, forward=False)
        groups.append(group)
        unseen -= group
    return sorted(
        groups, key=lambda g: (-len({topology.hosts[r] for r in g}), min(topology.hosts[r] for r in g))
    )


def admissible_nodes(topology: Topology, job_class: ReliabilityClass) -> set[str]:
    """Host names a multi-host job of ``job_class`` may be placed on (see the module docstring)."""
    groups = admissible_groups(topology, job_class)
    return {topology.hosts[r] for r in groups[0]} if groups else set()


def worst_path_loss(topology: Topology, packing: Packing) -> float:
    """The largest loss of any path the packing's data crosses: up a tree to its root for a
    reduce, down for a broadcast, up from one rank and down to another for an all-reduce (a rank's
    own input included: it goes up and comes back down)."""
    worst = 0.0
    for tree in packing.trees:
        up = [_edges_loss(topology, [(c, p) for p, c in tree.path_to_root(r)]) for r in range(tree.world)]
        down = [_edges_loss(topology, tree.path_to_root(r)) for r in range(tree.world)]
        if packing.direction == "reduce":
            worst = max(worst, *up)
        elif packing.direction == "broadcast":
            worst = max(worst, *down)
        else:
            worst = max(worst, 1.0 - (1.0 - max(up)) * (1.0 - max(down)))
    return worst


def _edges_loss(topology: Topology, hops: list[tuple[int, int]]) -> float:
    """Loss over the directed links (src, dst) in ``hops``."""
    delivered = 1.0
    for src, dst in hops:
        link = topology.link(src, dst)
        if link is None:
            raise ValueError(f"no link from {src} to {dst}")
        delivered *= 1.0 - link.loss
    return 1.0 - delivered


def pack_for_class(
    topology: Topology,
    job_class: ReliabilityClass,
    root: int = 0,
    direction: Direction = "all_reduce",
    max_trees: int = 4,
) -> Packing:
    """``pack_trees`` on the class's admissible sub-topology, its paths checked against the class."""
    packing = pack_trees(admissible_topology(topology, job_class), root, direction, max_trees)
    worst = worst_path_loss(topology, packing)
    if worst > job_class.max_path_loss:
        raise ClassViolation(
            f"class {job_class.name}: a path of the packing loses {worst:.3g} > {job_class.max_path_loss:.3g}"
            f" (trees deeper than max_hops={job_class.max_hops})"
        )
    return packing


def cost_by_class(topology: Topology, classes: Sequence[ReliabilityClass] = CLASSES) -> dict[str, float]:
    """The fabric's link cost per strictest class its links serve ("none": links no class may use)."""
    costs = {c.name: 0.0 for c in classes} | {"none": 0.0}
    for link in topology.links:
        costs[link_class(link, classes) or "none"] += link.cost
    return costs


def _reach(topology: Topology, start: int, forward: bool) -> set[int]:
    seen, frontier = {start}, [start]
    while frontier:
        node = frontier.pop()
        for link in topology.links:
            near, far = (link.src, link.dst) if forward else (link.dst, link.src)
            if near == node and far not in seen:
                seen.add(far)
                frontier.append(far)
    return seen
