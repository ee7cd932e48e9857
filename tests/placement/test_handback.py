"""A returning link's risk of dropping again, priced in the planner (cost.drop_risk, handback_delay_s).

The live trace's flapping phase, before the monitor recognised it, had the plan move camera
``infer`` to the cloud in a 2 s up window; the link dropped and the frames came back to a saturated
weak edge at once (3.6 s a frame against always-edge's 0.7 s). These tests hold the planner to:
on a busy edge a task stays there while a returning link settles, and moves once it has; on an edge
with room the price is small and changes nothing.
"""

from __future__ import annotations

import math

import pytest

from gateway.placement.cost import (
    Budgets,
    LinkView,
    drop_risk,
    effective_link,
    evaluate,
    handback_delay_s,
    make_option,
    settle_s,
)
from gateway.placement.link import LinkMonitor
from gateway.placement.planner import PlacementPlanner, plan_placement
from gateway.taskgraphs import camera_graph, default_graphs
from gateway.taskgraphs.graph import Side
from protocol.config import FlappingPolicy

# The live bench's weak edge: 4 fps, a quarter of the frames changed, small JPEGs, ~0.5 s a frame.
BUSY = camera_graph(fps=4, changed_fraction=0.25, frame_bytes=7_000)
FAST = LinkView("up", 0.002, 1_000_000)


def returning(up_for_s: float, longest_down_s: float = 3.0) -> LinkView:
    return LinkView("up", 0.002, 1_000_000, up_for_s=up_for_s, longest_down_s=longest_down_s)


def test_drop_risk_falls_linearly_from_the_return_to_settled():
    budgets = Budgets()  # settle: 1.5 x the longest down stretch, at most 15 s
    assert settle_s(returning(0.0, 3.0), budgets) == pytest.approx(4.5)
    assert settle_s(returning(0.0, 60.0), budgets) == 15.0  # a long outage is no flapping link
    assert drop_risk(returning(0.0), budgets) == 1.0
    assert drop_risk(returning(2.25), budgets) == pytest.approx(0.5)
    assert drop_risk(returning(4.5), budgets) == 0.0
    assert drop_risk(FAST, budgets) == 0.0  # no down stretch in the window, or no return seen
    assert drop_risk(LinkView("up", 0.002, 1e6, up_for_s=math.inf, longest_down_s=3.0), budgets) == 0.0
    for state in ("down", "flapping"):  # their own rules
        assert drop_risk(LinkView(state, 0.002, 1e6, 0.5, up_for_s=0.5, longest_down_s=3.0), budgets) == 0.0
    assert drop_risk(returning(0.5), Budgets(return_settle_factor=0)) == 0.0  # switched off


def test_the_handback_costs_a_busy_edge_much_and_an_edge_with_room_little():
    budgets = Budgets()
    link = effective_link(returning(0.0), budgets)
    split: list[Side] = ["edge", "edge", "cloud", "cloud", "cloud"]
    busy = make_option(BUSY, split)
    idle = make_option(camera_graph(), split)
    assert handback_delay_s(busy, [busy], link, budgets) > 1.0  # a second of frames at ~0.5 s, queued
    assert handback_delay_s(idle, [idle], link, budgets) < 0.15  # 0.1 frame/s: one frame at most
    at_edge = make_option(BUSY, ["edge", "edge", "edge", "edge", "cloud"])
    assert at_edge.handback_cpu == 0.0 and handback_delay_s(at_edge, [at_edge], link, budgets) == 0.0
    pinned = make_option(BUSY, split, {"infer": "cloud"})
    assert pinned.handback_cpu == pytest.approx(busy.handback_cpu - 1.0 * 0.45)  # a pin stays in the cloud
    settled = effective_link(returning(10.0), budgets)
    assert handback_delay_s(busy, [busy], settled, budgets) == 0.0
    priced = evaluate([busy], link, budgets).latencies_s[0]
    assert priced == pytest.approx(
        evaluate([busy], settled, budgets).latencies_s[0] + handback_delay_s(busy, [busy], link, budgets)
    )


def test_a_busy_edge_keeps_infer_while_the_link_settles_then_moves_it():
    budgets = Budgets()
    assert plan_placement([BUSY], FAST, budgets).side("camera", "infer") == "cloud"  # never went down
    back = plan_placement([BUSY], returning(0.5), budgets)
    assert back.side("camera", "infer") == "edge"
    assert any("handing their inputs back" in r for r in back.reasons)
    assert plan_placement([BUSY], returning(1.9), budgets).side("camera", "infer") == "edge"  # a 2 s window
    assert plan_placement([BUSY], returning(4.5), budgets).side("camera", "infer") == "cloud"  # settled


def test_an_edge_with_room_moves_to_the_cloud_as_the_link_returns():
    """The simulator's Pi-class mix (2 cores, a camera at 0.1 changed frame/s): the price changes
    nothing, so the plan keeps its gain on a link that comes back and stays."""
    budgets = Budgets(edge_cores=2)
    settled = plan_placement(default_graphs(), FAST, budgets)
    back = plan_placement(default_graphs(), returning(0.5, 90.0), budgets)
    assert back.side("camera", "infer") == settled.side("camera", "infer") == "cloud"
    priced, unpriced = back.service("camera").latency_s, settled.service("camera").latency_s
    assert priced is not None and unpriced is not None and priced < unpriced + 0.1


def test_the_end_of_settling_is_a_trigger_and_needs_no_switch_gain():
    t = [0.0]
    planner = PlacementPlanner([BUSY], clock=lambda: t[0])
    planner.update(LinkView("down", 0.002, 1e6, 0.8))
    assert planner.update(returning(0.5)) is not None  # down -> up: a new version, infer at the edge
    assert planner.current is not None and planner.current.side("camera", "infer") == "edge"
    assert planner.update(returning(2.0)) is None  # nothing left its band
    t[0] = 5.0
    settled = planner.update(returning(4.6))
    assert settled is not None and settled.side("camera", "infer") == "cloud"
    assert planner.decisions[-1].trigger.startswith("link settled")


@pytest.mark.parametrize("policy", ["model", "edge"])
def test_a_link_flapping_before_it_is_recognised_keeps_a_busy_edges_work(policy: FlappingPolicy) -> None:
    """The monitor fed the live trace's flapping onset (2 s up, 3 s down, refused at once), the
    planner asked every 0.5 s: ``infer`` never leaves the busy edge in an up window after a drop
    before the monitor says "flapping"; once it does, the flap model places it once (a drop inside
    the flapping hands nothing back: the state stays "flapping") and it does not move per flap; it
    is in the cloud once the link has stayed up. Under the ``"edge"`` policy it stays at the edge
    through the flapping too."""
    t = [0.0]
    monitor = LinkMonitor(clock=lambda: t[0], down_after_failures=2)
    planner = PlacementPlanner([BUSY], Budgets(flapping=policy), clock=lambda: t[0])
    sides: list[tuple[float, str, str]] = []

    def step(until: float, up: bool) -> None:
        while t[0] < until - 1e-9:
            t[0] = round(t[0] + 0.5, 3)
            monitor.observe_probe(0.002 if up else None)
            if up:
                monitor.observe_upload(64_000, 0.07, ok=True)
            planner.update(monitor.snapshot().view())
            assert planner.current is not None
            sides.append((t[0], monitor.snapshot().state, planner.current.side("camera", "infer")))

    step(10.0, up=True)
    assert sides[-1][2] == "cloud"  # a steady fast link: the cloud
    windows = []
    for _ in range(4):  # flapping: 3 s down, 2 s up
        step(t[0] + 3.0, up=False)
        start = len(sides)
        step(t[0] + 2.0, up=True)
        windows += sides[start:]
    before = [side for _, state, side in windows if state == "up"]
    during = [side for _, state, side in windows if state == "flapping"]
    assert before and all(side == "edge" for side in before), windows  # the price holds it
    assert during and len(set(during)) == 1, windows  # one side for the whole flapping
    if policy == "edge":
        assert during[0] == "edge"
    step(t[0] + 20.0, up=True)
    assert sides[-1][1:] == ("up", "cloud"), sides


def test_the_monitor_says_how_long_the_link_is_back_and_its_longest_down_stretch():
    t = [0.0]
    monitor = LinkMonitor(clock=lambda: t[0], down_after_failures=2, window_s=30)
    monitor.observe_probe(0.01)
    assert (monitor.snapshot().up_for_s, monitor.snapshot().longest_down_s) == (math.inf, 0.0)
    for at, rtt in ((6.0, None), (7.0, None), (8.0, None)):  # down at 7
        t[0] = at
        monitor.observe_probe(rtt)
    assert monitor.snapshot().up_for_s == 0.0
    t[0] = 10.0
    monitor.observe_probe(0.01)  # back at 10: a 3 s down stretch
    t[0] = 12.0
    view = monitor.snapshot().view()
    assert (view.up_for_s, view.longest_down_s) == (2.0, 3.0)
    t[0] = 41.0  # the stretch ended more than a window ago
    assert monitor.snapshot().longest_down_s == 0.0 and monitor.snapshot().up_for_s == 31.0
