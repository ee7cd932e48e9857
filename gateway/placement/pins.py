"""Operator pins: "service/task" -> side, checked against the services' task graphs.

Invariant: ``check_pins`` returns one message per pin that names no task or contradicts its service
(a source, a private service's raw consumer, a declared pin), and nothing for acceptable pins; the
planner (planner.py) takes a pin set only when it is empty of errors, so the plan honours every pin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.taskgraphs.graph import SIDES, Side, TaskGraph

Pins = Mapping[str, Side]  # "service/task" -> side, set by the operator


class PinError(ValueError):
    """An operator pin that names no task or contradicts the service (source, privacy)."""


def check_pins(services: Sequence[TaskGraph], pins: Pins) -> tuple[str, ...]:
    """Errors as values: one message per bad pin, empty when all are acceptable."""
    errors = []
    by_name = {s.name: s for s in services}
    for key, side in pins.items():
        service_name, _, task = key.partition("/")
        service = by_name.get(service_name)
        if side not in SIDES:
            errors.append(f"{key}: side must be edge or cloud, not {side!r}")
        elif service is None or task not in {t.name for t in service.tasks}:
            errors.append(f"{key}: no such service/task")
        else:
            required = service.required_pins().get(task)
            if required is not None and required != side:
                errors.append(
                    f"{key}: must stay at the {required} ({'private' if service.private else 'source'}"
                    f" or declared pin)"
                )
    if not errors:
        errors.extend(error for service in services for error in _pinned_back_to_edge(service, pins))
    return tuple(errors)


def _pinned_back_to_edge(service: TaskGraph, pins: Pins) -> list[str]:
    """A task pinned to the edge downstream of one pinned to the cloud cannot run where it is pinned
    (its input is in the cloud: TaskGraph.returns_to_edge)."""
    pinned = pins_for(service, pins)
    downstream_of_cloud: set[str] = set()
    errors = []
    for task in service.tasks:  # topological order
        if any(p in downstream_of_cloud for p in task.after) and pinned.get(task.name) == "edge":
            errors.append(
                f"{service.name}/{task.name}: pinned to the edge after a task pinned to the cloud "
                "(its input would have to come back down)"
            )
        if pinned.get(task.name) == "cloud" or any(p in downstream_of_cloud for p in task.after):
            downstream_of_cloud.add(task.name)
    return errors


def pins_for(service: TaskGraph, pins: Pins) -> dict[str, Side]:
    """The pins of one service's tasks (by task name): its graph's own, then the operator's."""
    merged = dict(service.required_pins())
    prefix = service.name + "/"
    merged.update({k[len(prefix) :]: v for k, v in pins.items() if k.startswith(prefix)})
    return merged
