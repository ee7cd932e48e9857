"""Services as data: validation, derived rates, text round trip, profiling."""

from __future__ import annotations

import pytest

from gateway.taskgraphs import Task, TaskGraph, TaskGraphError, default_graphs, format_graphs, parse_graphs
from gateway.taskgraphs.profile import profile_builtin, profile_edge_cost


def test_text_form_round_trips():
    services = default_graphs()
    assert parse_graphs(format_graphs(services)) == services


def test_derived_rates():
    sensor = default_graphs()[0]
    assert sensor.input_rate("detect") == pytest.approx(1.0)
    assert sensor.output_rate_bytes("ingest") == pytest.approx(2000)


@pytest.mark.parametrize(
    "text, match",
    [
        ("service s target=1\n task a edge=1 cloud=1 out=1 pin=cloud\nend\n", "source"),
        (
            "service s target=1\n task a edge=1 cloud=1 out=1\n task b edge=1 cloud=1 out=1 after=c\nend\n",
            "earlier",
        ),
        ("service s target=-1\n task a edge=1 cloud=1 out=1\nend\n", "target"),
        ("service s target=1\n task a edge=x cloud=1 out=1\nend\n", "not a number"),
        ("service s target=1\n task a edge=1 cloud=1 out=1 colour=red\nend\n", "colour"),
        (
            "service s target=1 private=yes\n task a edge=1 cloud=1 out=1\n"
            " task b edge=1 cloud=1 out=1 after=a pin=cloud\nend\n",
            "private",
        ),
        ("service s target=1\n task a edge=1 cloud=1 out=1\n", "missing 'end'"),
    ],
)
def test_invalid_definitions_are_rejected_naming_the_field(text, match):
    with pytest.raises(TaskGraphError, match=match):
        parse_graphs(text)


def test_duplicate_task_rejected():
    with pytest.raises(TaskGraphError, match="unique"):
        TaskGraph("s", (Task("a", 0, 0, 0), Task("a", 0, 0, 0)), 1.0)


def test_profiler_measures_with_injected_clock():
    ticks = iter(range(100))
    cost = profile_edge_cost(lambda x: x, 0, repeats=5, warmup=0, clock=lambda: float(next(ticks)))
    assert cost == 1.0
    profiled = profile_builtin(default_graphs(), repeats=3)
    assert profiled[0].task("aggregate").edge_cost_s != default_graphs()[0].task("aggregate").edge_cost_s
