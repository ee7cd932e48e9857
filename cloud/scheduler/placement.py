"""Placement: which devices a job gets, one class per rule, and their registry.

    consolidated  all devices on one node when a node can hold the job (best fit: the fullest node
                  that still has room, to keep large holes for large jobs); a job larger than
                  every node takes whole free nodes, largest first; otherwise it waits
    first_fit     nodes in cluster order, taking free devices until the demand is met (may spread
                  a job over nodes and generations)

``allowed`` restricts the nodes (the round passes the generations a policy asked for, and the
scheduler's ``node_filter`` hook: e.g. the collectives' reliability classes).

Invariant: a placement has exactly ``job.devices`` entries, all on allowed nodes with room, or is
None; ``cluster`` is not changed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState, Node
from cloud.scheduler.jobs import JobState

NodeFilter = Callable[[Node], bool]


def _anywhere(node: Node) -> bool:
    return True


class Placement(ABC):
    name: ClassVar[str]

    @abstractmethod
    def place(
        self, job: JobState, cluster: ClusterState, allowed: NodeFilter = _anywhere
    ) -> tuple[str, ...] | None:
        """The job's devices (one node name per device), or None when it does not fit now."""


class Consolidated(Placement):
    name: ClassVar[str] = "consolidated"

    def place(
        self, job: JobState, cluster: ClusterState, allowed: NodeFilter = _anywhere
    ) -> tuple[str, ...] | None:
        nodes = [n for n in cluster.nodes if allowed(n)]
        fitting = [n for n in nodes if cluster.free_on(n.name) >= job.devices]
        if fitting:
            best = min(fitting, key=lambda n: cluster.free_on(n.name))
            return (best.name,) * job.devices
        if any(n.devices >= job.devices for n in nodes):
            return None  # one node could hold it: wait for it rather than spread
        whole = sorted((n for n in nodes if cluster.free_on(n.name) == n.devices), key=lambda n: -n.devices)
        return _take(job.devices, [(n.name, n.devices) for n in whole])


class FirstFit(Placement):
    name: ClassVar[str] = "first_fit"

    def place(
        self, job: JobState, cluster: ClusterState, allowed: NodeFilter = _anywhere
    ) -> tuple[str, ...] | None:
        return _take(job.devices, [(n.name, cluster.free_on(n.name)) for n in cluster.nodes if allowed(n)])


def _take(demand: int, free: list[tuple[str, int]]) -> tuple[str, ...] | None:
    """Take devices from ``free`` in order until ``demand`` is met; None if they run out."""
    placement: list[str] = []
    for name, count in free:
        take = min(count, demand - len(placement))
        placement += [name] * take
        if len(placement) == demand:
            return tuple(placement)
    return None


PLACEMENTS: dict[str, type[Placement]] = {cls.name: cls for cls in (Consolidated, FirstFit)}
