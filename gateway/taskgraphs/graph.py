"""Services as task graphs, as data: ``Task`` and ``TaskGraph`` values, their validation and text form.

Invariant: a ``TaskGraph`` exists only if it is valid: task names are unique, every ``after`` names an
earlier task (so ``tasks`` is in topological order and the graph is a DAG), every source (a task
with no predecessor) is pinned to the edge (raw data is born on the gateway), and in a private
service no task that consumes raw output is pinned to the cloud. Invalid input raises
``TaskGraphError`` naming the service, the task and the field.

Units: seconds, bytes, inputs per second. ``edge_cost_s``/``cloud_cost_s`` are compute seconds per
input (edge: one edge core; cloud: declared); ``output_bytes`` is the size of one output message;
``selectivity`` is outputs per input (a window of 10 samples emits 0.1 outputs per input), so a
task's input rate is derived from the service's source rate, never declared twice.

Text form (one service per block; ``parse_graphs(format_graphs(s)) == s``)::

    service camera target=2.5 priority=2 private=no rate=1
      task capture edge=0.002 cloud=0.002 out=60000 pin=edge raw=yes
      task change edge=0.015 cloud=0.002 out=60000 sel=0.4 after=capture trips=2
      task upload edge=0 cloud=0 out=0 after=change pin=cloud delivery=yes
    end

A *delivery* task (``upload``) is the store-and-forward of results into the cloud: what crosses into
it costs uplink bytes, but a service's latency ends when its last other task has produced the
result, at the edge or in the cloud. That is what keeps a gateway useful through an outage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, get_args

from protocol.control import Side

SIDES: tuple[Side, ...] = get_args(Side)


class TaskGraphError(ValueError):
    """An invalid service or task definition; the message names where and what."""


@dataclass(frozen=True)
class Task:
    name: str
    edge_cost_s: float
    cloud_cost_s: float
    output_bytes: int
    after: tuple[str, ...] = ()
    selectivity: float = 1.0
    pin: Side | None = None
    raw: bool = False  # its output is raw data (sources always are)
    delivery: bool = False  # store-and-forward into the cloud: costs uplink bytes, not service latency
    trips: int = 1  # round trips its output takes to cross: 2 for a blob (its PUT, then its record)


@dataclass(frozen=True)
class TaskGraph:
    name: str
    tasks: tuple[Task, ...]
    latency_target_s: float
    priority: int = 1  # higher wins when not every service can meet its target
    private: bool = False  # raw data may not leave the gateway
    rate_hz: float = 1.0  # inputs per second at the sources
    _index: dict[str, Task] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _validate(self)
        object.__setattr__(self, "_index", {t.name: t for t in self.tasks})

    def task(self, name: str) -> Task:
        try:
            return self._index[name]
        except KeyError:
            raise TaskGraphError(f"service {self.name!r} has no task {name!r}") from None

    def delivery_tasks(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks if t.delivery)

    def successors(self, name: str) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks if name in t.after)

    def returns_to_edge(self, sides: Mapping[str, Side]) -> str | None:
        """The first task placed at the edge after a task in the cloud (its input would have to come
        back down), or None. gatewayd runs such a task in the cloud (gateway/placement/execution.py),
        so a plan that places one is not the plan that runs: the search never offers it."""
        in_cloud: set[str] = set()
        for task in self.tasks:  # topological order
            upstream_cloud = any(p in in_cloud for p in task.after)
            if upstream_cloud and sides.get(task.name, "edge") == "edge":
                return task.name
            if upstream_cloud or sides.get(task.name, "edge") == "cloud":
                in_cloud.add(task.name)
        return None

    def input_rate(self, name: str) -> float:
        """Inputs per second reaching ``name``: the source rate times selectivities on the way.

        With several predecessors the busiest one sets the rate (a join fires per input of its
        fastest branch); documented, simple, and exact for chains.
        """
        rates: dict[str, float] = {}
        for t in self.tasks:
            rates[t.name] = (
                self.rate_hz if not t.after else max(rates[p] * self._index[p].selectivity for p in t.after)
            )
        return rates[name]

    def output_rate_bytes(self, name: str) -> float:
        """Bytes per second ``name`` emits (what crosses the link if its consumer is elsewhere)."""
        task = self.task(name)
        return self.input_rate(name) * task.selectivity * task.output_bytes

    def raw_consumers(self) -> tuple[str, ...]:
        """Tasks whose input includes raw data: in a private service they must run at the edge."""
        raw = {t.name for t in self.tasks if t.raw or not t.after}
        return tuple(t.name for t in self.tasks if any(p in raw for p in t.after))

    def required_pins(self) -> dict[str, Side]:
        """Pins the definition itself imposes: declared pins, sources at the edge, privacy."""
        pins: dict[str, Side] = {t.name: t.pin for t in self.tasks if t.pin is not None}
        for t in self.tasks:
            if not t.after:
                pins[t.name] = "edge"
        if self.private:
            for name in self.raw_consumers():
                pins[name] = "edge"
        return pins


def _fail(service: str, where: str, why: str) -> NoReturn:
    raise TaskGraphError(f"service {service!r}: {where}: {why}")


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _non_negative(x: float) -> bool:
    return math.isfinite(x) and x >= 0


# Checks of the service's own fields, in the order they are tried: (field, holds, why it failed).
_SERVICE_RULES: tuple[tuple[str, Callable[[TaskGraph], bool], str], ...] = (
    (
        "name",
        lambda s: bool(s.name) and s.name.replace("_", "").replace("-", "").isalnum(),
        "must be a non-empty identifier of [A-Za-z0-9_-]",
    ),
    (
        "target",
        lambda s: _positive(s.latency_target_s),
        "latency target must be a positive number of seconds",
    ),
    ("rate", lambda s: _positive(s.rate_hz), "source rate must be a positive number of inputs per second"),
    ("tasks", lambda s: bool(s.tasks), "a service needs at least one task"),
)


def _name_problem(t: Task, earlier: set[str]) -> str:
    unique_word = bool(t.name) and " " not in t.name and "=" not in t.name and t.name not in earlier
    return "" if unique_word else "task names must be unique words"


def _cost_problem(t: Task, earlier: set[str]) -> str:
    for value, label in ((t.edge_cost_s, "edge"), (t.cloud_cost_s, "cloud")):
        if not _non_negative(value):
            return f"{label} cost must be >= 0 seconds"
    return ""


def _output_problem(t: Task, earlier: set[str]) -> str:
    if t.trips < 1:
        return "trips (round trips to cross) must be >= 1"
    return "" if t.output_bytes >= 0 else "out (output bytes) must be >= 0"


def _selectivity_problem(t: Task, earlier: set[str]) -> str:
    return "" if _non_negative(t.selectivity) else "sel (outputs per input) must be >= 0"


def _pin_problem(t: Task, earlier: set[str]) -> str:
    return "" if t.pin in (None, *SIDES) else f"pin must be edge or cloud, not {t.pin!r}"


def _after_problem(t: Task, earlier: set[str]) -> str:
    for p in t.after:
        if p not in earlier:
            return f"after={p!r} must name an earlier task (tasks in topological order)"
    return ""


def _delivery_problem(t: Task, earlier: set[str]) -> str:
    if t.delivery and (t.pin != "cloud" or not t.after):
        return "a delivery task must be pinned to cloud and have a predecessor"
    return ""


def _source_problem(t: Task, earlier: set[str]) -> str:
    if not t.after and t.pin == "cloud":
        return "a source task produces raw data on the gateway: it cannot be pinned to cloud"
    return ""


# Checks of one task, in the order they are tried: each gets the task and the names of the tasks
# before it, and says what is wrong ("" if nothing).
_TASK_CHECKS: tuple[Callable[[Task, set[str]], str], ...] = (
    _name_problem,
    _cost_problem,
    _output_problem,
    _selectivity_problem,
    _pin_problem,
    _after_problem,
    _delivery_problem,
    _source_problem,
)


def _validate(s: TaskGraph) -> None:
    """Raise TaskGraphError at the first rule ``s`` breaks: the service's fields, then each task in
    order, then privacy."""
    for where, holds, why in _SERVICE_RULES:
        if not holds(s):
            _fail(s.name, where, why)
    earlier: set[str] = set()
    for t in s.tasks:
        for check in _TASK_CHECKS:
            problem = check(t, earlier)
            if problem:
                _fail(s.name, f"task {t.name!r}", problem)
        earlier.add(t.name)
    _check_privacy(s)


def _check_privacy(s: TaskGraph) -> None:
    """In a private service no consumer of raw data may be pinned to the cloud."""
    if not s.private:
        return
    declared = {t.name: t.pin for t in s.tasks}
    for name in s.raw_consumers():
        if declared[name] == "cloud":
            _fail(
                s.name, f"task {name!r}", "private service: a consumer of raw data cannot be pinned to cloud"
            )


# -- text form -----------------------------------------------------------------------------------


def _num(x: float) -> str:
    text = repr(float(x))  # repr round-trips exactly
    return text[:-2] if text.endswith(".0") else text


def format_graph(s: TaskGraph) -> str:
    lines = [
        f"service {s.name} target={_num(s.latency_target_s)} priority={s.priority} "
        f"private={'yes' if s.private else 'no'} rate={_num(s.rate_hz)}"
    ]
    for t in s.tasks:
        parts = [
            f"  task {t.name} edge={_num(t.edge_cost_s)} cloud={_num(t.cloud_cost_s)} out={t.output_bytes}"
        ]
        if t.selectivity != 1.0:
            parts.append(f"sel={_num(t.selectivity)}")
        if t.after:
            parts.append("after=" + ",".join(t.after))
        if t.pin:
            parts.append(f"pin={t.pin}")
        if t.raw:
            parts.append("raw=yes")
        if t.delivery:
            parts.append("delivery=yes")
        if t.trips != 1:
            parts.append(f"trips={t.trips}")
        lines.append(" ".join(parts))
    lines.append("end")
    return "\n".join(lines)


def format_graphs(services: tuple[TaskGraph, ...] | list[TaskGraph]) -> str:
    return "\n".join(format_graph(s) for s in services) + "\n"


def _fields(words: list[str], allowed: set[str], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or key not in allowed:
            raise TaskGraphError(f"{where}: unknown or malformed field {w!r} (allowed: {sorted(allowed)})")
        out[key] = value
    return out


def _float(fields: dict[str, str], key: str, where: str, default: float | None = None) -> float:
    if key not in fields:
        if default is None:
            raise TaskGraphError(f"{where}: missing field {key}=")
        return default
    try:
        return float(fields[key])
    except ValueError:
        raise TaskGraphError(f"{where}: {key}={fields[key]!r} is not a number") from None


def _yes(value: str, where: str) -> bool:
    if value not in ("yes", "no"):
        raise TaskGraphError(f"{where}: expected yes or no, got {value!r}")
    return value == "yes"


def parse_graphs(text: str) -> tuple[TaskGraph, ...]:
    """Parse the text form; raise TaskGraphError naming the line on any problem."""
    services: list[TaskGraph] = []
    head: dict[str, str] | None = None
    name = ""
    tasks: list[Task] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        where = f"line {lineno}"
        if not words:
            continue
        if words[0] == "service" and head is None and len(words) >= 2:
            name, tasks = words[1], []
            head = _fields(words[2:], {"target", "priority", "private", "rate"}, where)
        elif words[0] == "task" and head is not None and len(words) >= 2:
            fields = {"edge", "cloud", "out", "sel", "after", "pin", "raw", "delivery", "trips"}
            f = _fields(words[2:], fields, where)
            pin = f.get("pin")
            if not (pin is None or pin in SIDES):
                raise TaskGraphError(f"{where}: pin must be edge or cloud, not {pin!r}")
            tasks.append(
                Task(
                    name=words[1],
                    edge_cost_s=_float(f, "edge", where),
                    cloud_cost_s=_float(f, "cloud", where),
                    output_bytes=int(_float(f, "out", where)),
                    selectivity=_float(f, "sel", where, 1.0),
                    after=tuple(a for a in f.get("after", "").split(",") if a),
                    pin=pin,
                    raw=_yes(f.get("raw", "no"), where),
                    delivery=_yes(f.get("delivery", "no"), where),
                    trips=int(_float(f, "trips", where, 1)),
                )
            )
        elif words == ["end"] and head is not None:
            services.append(
                TaskGraph(
                    name=name,
                    tasks=tuple(tasks),
                    latency_target_s=_float(head, "target", where),
                    priority=int(_float(head, "priority", where, 1)),
                    private=_yes(head.get("private", "no"), where),
                    rate_hz=_float(head, "rate", where, 1.0),
                )
            )
            head = None
        else:
            raise TaskGraphError(f"{where}: unexpected {line.strip()!r}")
    if head is not None:
        raise TaskGraphError(f"service {name!r}: missing 'end'")
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        raise TaskGraphError(f"duplicate service names in {names}")
    return tuple(services)
