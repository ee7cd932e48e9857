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

``InputDispatch`` is what a service whose inputs are independent (the camera's frames; ``PER_INPUT``)
needs to send one input to the other side than the plan's (docs/placement.md, "Dispatching each
frame"): the runner sets it after every check of the link (``set_dispatch``), not only with a new plan,
so it follows the link without making plan versions.

Invariant: ``current(service)`` always returns a side for every placed task of that service, and no
task is at the edge when one of its predecessors is in the cloud.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.placement.plan import Plan
from gateway.taskgraphs.graph import TaskGraph
from protocol.control import Side
from protocol.derived import PLACED_TASKS as PLACED_BY_SERVICE
from protocol.derived import PlacedService, all_on

# the protocol's table, looked up by a task graph's name (any str)
PLACED_TASKS: dict[str, tuple[str, ...]] = {service: tasks for service, tasks in PLACED_BY_SERVICE.items()}
EDGE_SIDES: dict[str, dict[str, Side]] = {service: all_on(service, "edge") for service in PLACED_BY_SERVICE}
# The services whose inputs may each go to either side, and the task that decides it (the tasks after
# it follow it). The sensor's windows are not independent inputs: they move with the plan only.
PER_INPUT: dict[str, str] = {"camera": "infer"}


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
class InputDispatch:
    """What the owner of a ``PER_INPUT`` service needs to send one input against the plan:
    ``cloud_s``, the predicted latency of one input with the task in the cloud on the link as it is
    now (None: none goes there against the plan: the link is down, or the uplink has others to send
    first); ``link_failing``, a failure seen since the last success (or the link down): nothing waits
    for the link, an input the plan sends to the cloud runs here; ``declared_cost_s``, the task's edge
    cost per input if the operator declared one (in force whatever is measured, as in the plan; None:
    the owner prices its queue with what it measures)."""

    cloud_s: float | None
    link_failing: bool = False
    declared_cost_s: float | None = None

    def cost_s(self, measured_s: float | None) -> float | None:
        """The cost per input to price the owner's queue with: the declared one, else ``measured_s``."""
        return self.declared_cost_s if self.declared_cost_s is not None else measured_s

    def spill(self, edge_s: float) -> bool:
        """Whether an input the plan runs at the edge, done there in ``edge_s``, is done sooner in
        the cloud."""
        return not self.link_failing and self.cloud_s is not None and edge_s > self.cloud_s

    def uplink_busy(self) -> InputDispatch:
        """The same, while the uplink has other records to send first: nothing spills."""
        return InputDispatch(None, self.link_failing, self.declared_cost_s)


@dataclass(frozen=True)
class ServiceSides:
    """Where a service's placed tasks run, the plan that said so (0: no plan yet), and how a single
    input may go to the other side (None: it may not: a pinned task, placement off, dispatch off)."""

    plan: int
    sides: dict[str, Side]
    dispatch: InputDispatch | None = field(default=None, compare=False)

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
        self._dispatch: dict[str, InputDispatch | None] = {}
        self.changes = 0  # plans that moved a placed task

    def update(self, plan: Plan) -> None:
        changed = False
        for name, graph in self._graphs.items():
            sides = service_sides(plan, graph)
            changed |= sides != self._current[name].sides
            self._current[name] = ServiceSides(plan.version, sides)
        self.changes += changed

    def set_dispatch(self, service: str, dispatch: InputDispatch | None) -> None:
        """How one input of ``service`` (a ``PER_INPUT`` one) may go to the other side from now on."""
        self._dispatch[service] = dispatch

    def current(self, service: PlacedService) -> ServiceSides:
        """The sides now; a service this gateway does not plan runs everything at the edge."""
        found = self._current.get(service)
        if found is None:
            return ServiceSides.edge(service)
        return ServiceSides(found.plan, found.sides, self._dispatch.get(service))

    def to_dict(self) -> dict[str, dict[str, Side]]:
        return {name: dict(current.sides) for name, current in self._current.items()}

    def dispatch_status(self) -> dict[str, dict[str, float | None] | None]:
        """/status: per ``PER_INPUT`` service, the figures its inputs are dispatched by (None: off)."""
        return {
            name: None if d is None else {"cloud_s": d.cloud_s, "link_failing": d.link_failing}
            for name, d in self._dispatch.items()
        }
