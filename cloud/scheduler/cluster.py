"""The cluster as the scheduler sees it: nodes (devices, generation) and which job holds which devices.

A placement is a tuple of node names with one entry per device, so a 4-device job on two nodes is
``("n0", "n0", "n1", "n1")``; ``devices_per_node`` turns it into counts.

Invariant: on every node, the devices held by jobs never exceed its devices (``allocate`` raises
``ValueError`` instead), and a job holds devices on at most one allocation at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    name: str
    devices: int
    generation: str  # the hardware kind ("v100", "k80", "cpu"): jobs' throughputs are keyed by it

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node.name: must not be empty")
        if self.devices < 1:
            raise ValueError(f"node.devices: {self.devices} for node {self.name!r}; must be >= 1")
        if not self.generation:
            raise ValueError(f"node.generation: must not be empty (node {self.name!r})")


def devices_per_node(placement: Iterable[str]) -> dict[str, int]:
    """``("n0", "n0", "n1")`` -> ``{"n0": 2, "n1": 1}`` (insertion order kept)."""
    return dict(Counter(placement))


class ClusterState:
    """Nodes and the devices each job holds on them (mutable; ``copy`` for what-if planning)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        names = [n.name for n in nodes]
        if not nodes:
            raise ValueError("nodes: the cluster needs at least one node")
        if len(set(names)) != len(names):
            raise ValueError(f"nodes: duplicate node names in {names}")
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self._by_name = {n.name: n for n in nodes}
        self._held: dict[str, dict[str, int]] = {}  # job id -> node name -> devices
        self._used: dict[str, int] = dict.fromkeys(names, 0)  # node name -> devices held (the sum of _held)

    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(f"node: unknown node {name!r} (known: {sorted(self._by_name)})") from None

    def generations(self) -> tuple[str, ...]:
        """Distinct generations, in node order."""
        return tuple(dict.fromkeys(n.generation for n in self.nodes))

    def used_on(self, name: str) -> int:
        self.node(name)
        return self._used[name]

    def free_on(self, name: str) -> int:
        return self.node(name).devices - self.used_on(name)

    def capacity(self, generation: str | None = None) -> int:
        return sum(n.devices for n in self.nodes if generation in (None, n.generation))

    def free(self, generation: str | None = None) -> int:
        return sum(self.free_on(n.name) for n in self.nodes if generation in (None, n.generation))

    def used(self, generation: str | None = None) -> int:
        return self.capacity(generation) - self.free(generation)

    def jobs(self) -> tuple[str, ...]:
        """Ids of the jobs holding devices."""
        return tuple(self._held)

    def placement_of(self, job_id: str) -> tuple[str, ...]:
        """The job's placement (one entry per device), () when it holds nothing."""
        return tuple(name for name, count in self._held.get(job_id, {}).items() for _ in range(count))

    def generations_of(self, placement: Iterable[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.node(name).generation for name in placement))

    def allocate(self, job_id: str, placement: Sequence[str]) -> None:
        if job_id in self._held:
            raise ValueError(f"allocate: job {job_id!r} already holds {self.placement_of(job_id)}")
        if not placement:
            raise ValueError(f"allocate: empty placement for job {job_id!r}")
        wanted = devices_per_node(placement)
        for name, count in wanted.items():
            if count > self.free_on(name):
                raise ValueError(
                    f"allocate: job {job_id!r} wants {count} devices on {name!r}, {self.free_on(name)} free"
                )
        self._held[job_id] = wanted
        for name, count in wanted.items():
            self._used[name] += count

    def release(self, job_id: str) -> tuple[str, ...]:
        """Free the job's devices; returns the placement it had (() if it held none)."""
        placement = self.placement_of(job_id)
        for name, count in self._held.pop(job_id, {}).items():
            self._used[name] -= count
        return placement

    def copy(self) -> ClusterState:
        twin = ClusterState(self.nodes)
        twin._held = {job: dict(held) for job, held in self._held.items()}
        twin._used = dict(self._used)
        return twin

    def __repr__(self) -> str:
        parts = [f"{n.name}[{n.generation}]:{self.used_on(n.name)}/{n.devices}" for n in self.nodes]
        return f"ClusterState({' '.join(parts)})"
