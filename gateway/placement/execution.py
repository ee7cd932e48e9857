"""Executing the plan: which side each placed task of a service runs on, and who is told when it changes.

``service_sides(plan, graph)`` is pure: the sides of a service's placed tasks (``PLACED_TASKS``) from
a plan, taken in the graph's topological order, with one rule on top of the planner's choice: a task
after a task that runs in the cloud runs in the cloud too (its input is already there; the planner
never gains by coming back, the executor makes it a rule). ``EDGE_SIDES`` are the sides before any
plan, or when placement is off: everything on the gateway, as gatewayd always ran.

``PlannedSides`` is the mechanism: the PlacementRunner calls ``update(plan)`` for each new plan; the
owner of a service's inputs (the sensor ingest task, the camera router) reads ``current(service)``
in its own task, before each input, and switches (writing a PlacementMarker) when the sides differ
from the last it applied. Nothing here runs a task or calls back into an owner.

Invariant: ``current(service)`` always returns a side for every placed task of that service, and no
task is at the edge when one of its predecessors is in the cloud.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.placement.plan import Plan
from gateway.taskgraphs.graph import TaskGraph
from protocol.control import Side
from protocol.derived import PLACED_TASKS as PLACED_BY_SERVICE
from protocol.derived import PlacedService, all_on

# the protocol's table, looked up by a task graph's name (any str)
PLACED_TASKS: dict[str, tuple[str, ...]] = {service: tasks for service, tasks in PLACED_BY_SERVICE.items()}
EDGE_SIDES: dict[str, dict[str, Side]] = {service: all_on(service, "edge") for service in PLACED_BY_SERVICE}


def service_sides(plan: Plan, graph: TaskGraph) -> dict[str, Side]:
    """The sides of ``graph``'s placed tasks under ``plan`` (a task after a cloud task is in the cloud)."""
    placed = dict(plan.service(graph.name).placement)
    sides: dict[str, Side] = {}
    for task in graph.tasks:  # topological order: every predecessor is decided first
        side = placed[task.name]
        if any(sides[before] == "cloud" for before in task.after):
            side = "cloud"
        sides[task.name] = side
    return {name: sides[name] for name in PLACED_TASKS[graph.name]}


@dataclass(frozen=True)
class ServiceSides:
    """Where a service's placed tasks run, and the plan that said so (0: no plan yet)."""

    plan: int
    sides: dict[str, Side]

    @staticmethod
    def edge(service: str) -> ServiceSides:
        """Every task of ``service`` at the edge: before the first plan, and with placement off."""
        return ServiceSides(0, dict(EDGE_SIDES[service]))


def sides_text(sides: dict[str, Side]) -> str:
    """``infer@cloud summarise@cloud``: how logs name a service's sides."""
    return " ".join(f"{task}@{side}" for task, side in sides.items())


class PlannedSides:
    """The sides of the placed services under the latest plan, for their owners to read."""

    def __init__(self, graphs: tuple[TaskGraph, ...]) -> None:
        self._graphs = {g.name: g for g in graphs if g.name in PLACED_TASKS}
        self._current: dict[str, ServiceSides] = {name: ServiceSides.edge(name) for name in self._graphs}
        self.changes = 0  # plans that moved a placed task

    def update(self, plan: Plan) -> None:
        changed = False
        for name, graph in self._graphs.items():
            sides = service_sides(plan, graph)
            changed |= sides != self._current[name].sides
            self._current[name] = ServiceSides(plan.version, sides)
        self.changes += changed

    def current(self, service: PlacedService) -> ServiceSides:
        """The sides now; a service this gateway does not plan runs everything at the edge."""
        found = self._current.get(service)
        return found if found is not None else ServiceSides.edge(service)

    def to_dict(self) -> dict[str, dict[str, Side]]:
        return {name: dict(current.sides) for name, current in self._current.items()}
