"""Which figures of the services' task graphs are in force: the catalog's defaults, the edge costs the
operator declared, and what this box measures (a task's edge cost, a service's source rate, a task's
selectivity and output size), steadied by a band so that noise does not make the planner re-plan.

``MeasuredGraphs`` is pure (no I/O, no clock): its owner (the PlacementRunner) offers it each poll's
measurements, and gets back the quantities that moved; ``graphs`` then holds the graphs to plan with.

Invariants:
- an edge cost the operator declared is in force for its task, always: measurement never replaces it;
- a measured value replaces the one in force (the catalog's default, or an earlier measurement) only
  when it lies outside [in force / band_ratio, in force x band_ratio]; within the band nothing
  changes, so the planner is not asked to evaluate again;
- a quantity a poll did not measure keeps the value in force (a camera that stopped tells nothing
  new about the box);
- ``graphs`` are valid TaskGraphs: a measurement that would make one invalid (negative, not finite, a
  source rate of 0, an unknown service or task) is refused and counted (``refused``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.taskgraphs.graph import Task, TaskGraph

QuantityField = Literal["edge_cost_s", "rate_hz", "selectivity", "output_bytes"]
TASK_FIELDS = ("edge_cost_s", "selectivity", "output_bytes")  # the others are the service's own
CostSource = Literal["measured", "declared", "default"]  # where an edge cost in force came from


class CostError(ValueError):
    """A declared edge cost that names no task, or is not a number of seconds >= 0."""


@dataclass(frozen=True, order=True)
class Quantity:
    """One figure of one service's graph: a task's (``task`` given) or the service's source rate."""

    service: str
    field: QuantityField
    task: str = ""

    def __post_init__(self) -> None:
        if (self.field in TASK_FIELDS) != bool(self.task):
            raise ValueError(f"{self.field} is {'a task' if self.field in TASK_FIELDS else 'a service'}'s")

    def __str__(self) -> str:
        return f"{self.service}/{self.task} {self.field}" if self.task else f"{self.service} {self.field}"


def edge_cost(service_task: str) -> Quantity:
    """``"camera/infer"`` -> the edge cost of that task."""
    service, _, task = service_task.partition("/")
    return Quantity(service, "edge_cost_s", task)


def value_in(graph: TaskGraph, quantity: Quantity) -> float:
    if quantity.field == "rate_hz":
        return graph.rate_hz
    return float(getattr(graph.task(quantity.task), quantity.field))


def with_values(graphs: Sequence[TaskGraph], values: Mapping[Quantity, float]) -> tuple[TaskGraph, ...]:
    """Copies of ``graphs`` carrying ``values`` (each must name a task or service they have)."""
    out = []
    for graph in graphs:
        mine = {q: v for q, v in values.items() if q.service == graph.name}
        if not mine:
            out.append(graph)
            continue
        tasks = tuple(
            _task_with(t, {q.field: v for q, v in mine.items() if q.task == t.name}) for t in graph.tasks
        )
        rate = mine.get(Quantity(graph.name, "rate_hz"), graph.rate_hz)
        out.append(dataclasses.replace(graph, tasks=tasks, rate_hz=float(rate)))
    return tuple(out)


def _task_with(task: Task, values: Mapping[QuantityField, float]) -> Task:
    if not values:
        return task
    return dataclasses.replace(
        task,
        edge_cost_s=float(values.get("edge_cost_s", task.edge_cost_s)),
        selectivity=float(values.get("selectivity", task.selectivity)),
        output_bytes=int(round(values.get("output_bytes", task.output_bytes))),
    )


def check_edge_costs(graphs: Sequence[TaskGraph], costs: Mapping[str, float]) -> tuple[str, ...]:
    """Errors as values: one message per declared edge cost that names no task or is no duration."""
    by_name = {g.name: g for g in graphs}
    errors = []
    for key, seconds in costs.items():
        service, _, task = key.partition("/")
        graph = by_name.get(service)
        if graph is None:
            errors.append(f"{key}: no service {service!r} (services: {', '.join(by_name)})")
        elif task not in {t.name for t in graph.tasks}:
            tasks = ", ".join(t.name for t in graph.tasks)
            errors.append(f"{key}: service {service!r} has no task {task!r} (its tasks: {tasks})")
        elif not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0):
            errors.append(f"{key}: must be a number of seconds >= 0, not {seconds!r}")
    return tuple(errors)


def within_band(in_force: float, value: float, ratio: float) -> bool:
    """``value`` in [in_force / ratio, in_force x ratio] (0 is within the band of 0 only)."""
    return in_force / ratio <= value <= in_force * ratio


class MeasuredGraphs:
    """The graphs to plan with: defaults, overridden by declared edge costs, then by measurements."""

    def __init__(
        self,
        graphs: Sequence[TaskGraph],
        declared_edge_costs: Mapping[str, float] | None = None,
        *,
        band_ratio: float = 1.5,
        measure: bool = True,
    ) -> None:
        if not band_ratio > 1:
            raise ValueError("band_ratio must be > 1")
        declared = dict(declared_edge_costs or {})
        errors = check_edge_costs(graphs, declared)
        if errors:
            raise CostError("; ".join(errors))
        self.defaults = tuple(graphs)
        self._by_name = {g.name: g for g in self.defaults}
        self.band_ratio = band_ratio
        self.measure = measure
        self._declared = {edge_cost(key): float(seconds) for key, seconds in declared.items()}
        self._measured: dict[Quantity, float] = {}  # measured values in force
        self.latest: dict[Quantity, float] = {}  # the last acceptable value measured, in force or not
        self.graphs = with_values(self.defaults, self._declared)
        self.offers = 0
        self.revisions = 0  # offers that changed a value in force
        self.refused = 0

    def offer(self, measured: Mapping[Quantity, float]) -> tuple[str, ...]:
        """One poll's measurements; returns the values in force that moved (``"camera/infer
        edge_cost_s 0.45->0.0011"``), empty if none did. When some did, ``graphs`` carries them."""
        self.offers += 1
        moved: dict[Quantity, float] = {}
        for quantity, value in measured.items():
            if not self._acceptable(quantity, value):
                self.refused += 1
                continue
            self.latest[quantity] = value
            if not self.measure or quantity in self._declared:
                continue
            if not within_band(self.in_force(quantity), value, self.band_ratio):
                moved[quantity] = value
        if not moved:
            return ()
        changes = tuple(f"{q} {self.in_force(q):.3g}->{v:.3g}" for q, v in sorted(moved.items()))
        self._measured.update(moved)
        self.graphs = with_values(self.defaults, {**self._measured, **self._declared})
        self.revisions += 1
        return changes

    def in_force(self, quantity: Quantity) -> float:
        if quantity in self._declared:
            return self._declared[quantity]
        if quantity in self._measured:
            return self._measured[quantity]
        return value_in(self._by_name[quantity.service], quantity)

    def source(self, quantity: Quantity) -> CostSource:
        if quantity in self._declared:
            return "declared"
        return "measured" if quantity in self._measured else "default"

    def _acceptable(self, quantity: Quantity, value: float) -> bool:
        graph = self._by_name.get(quantity.service)
        if graph is None or (quantity.task and quantity.task not in {t.name for t in graph.tasks}):
            return False
        if not (math.isfinite(value) and value >= 0):
            return False
        return value > 0 or quantity.field != "rate_hz"  # a service's source rate is positive

    def status(self) -> dict[str, Any]:
        """Per task: the edge cost in force and where it came from, its input rate and output size."""
        tasks = {
            f"{g.name}/{t.name}": {
                "edge_cost_s": t.edge_cost_s,
                "source": self.source(Quantity(g.name, "edge_cost_s", t.name)),
                "input_rate_hz": g.input_rate(t.name),
                "output_bytes": t.output_bytes,
            }
            for g in self.graphs
            for t in g.tasks
        }
        return {
            "measure": self.measure,
            "band_ratio": self.band_ratio,
            "offers": self.offers,
            "revisions": self.revisions,
            "refused": self.refused,
            "tasks": tasks,
            "measured_in_force": {str(q): v for q, v in sorted(self._measured.items())},
            "latest": {str(q): v for q, v in sorted(self.latest.items())},
        }
