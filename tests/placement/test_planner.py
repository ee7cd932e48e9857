"""Planner math: exact search vs brute force, heuristics, hysteresis, link down, pins, budgets, priority."""

from __future__ import annotations

import itertools
import random

import pytest

from gateway.placement.cost import Budgets, LinkView, effective_link, evaluate, make_option
from gateway.placement.execution import InputDispatch
from gateway.placement.planner import Hysteresis, PinError, PlacementPlanner, plan_placement, replan_trigger
from gateway.placement.search import (
    cut_options,
    enumerate_options,
    heuristic_options,
    search_descent,
    search_exact,
)
from gateway.taskgraphs import (
    Task,
    TaskGraph,
    camera_graph,
    default_graphs,
    sensor_graph,
    training_graph,
)

UP = LinkView("up", 0.04, 1_000_000)
SLOW = LinkView("up", 0.3, 30_000)


def _chain(rng: random.Random, n: int, name: str = "s", priority: int = 1) -> TaskGraph:
    tasks = [Task("t0", 0.001, 0.001, rng.randint(1_000, 200_000), raw=True)]
    for i in range(1, n):
        edge = rng.uniform(0.001, 0.5)
        tasks.append(
            Task(
                f"t{i}",
                edge,
                edge * rng.uniform(0.02, 1.0),
                rng.randint(10, 200_000),
                selectivity=rng.choice([1.0, 0.5, 0.1]),
                after=(f"t{i - 1}",),
            )
        )
    tasks.append(Task("upload", 0, 0, 0, after=(f"t{n - 1}",), pin="cloud", delivery=rng.random() < 0.5))
    return TaskGraph(
        name,
        tuple(tasks),
        latency_target_s=rng.uniform(0.2, 3),
        priority=priority,
        rate_hz=rng.uniform(0.2, 3),
    )


def _dag(rng: random.Random, n: int, name: str = "d") -> TaskGraph:
    tasks = [Task("t0", 0.001, 0.001, rng.randint(1_000, 100_000), raw=True)]
    for i in range(1, n):
        preds = tuple(sorted(set(rng.sample([f"t{j}" for j in range(i)], k=min(i, rng.randint(1, 2))))))
        edge = rng.uniform(0.001, 0.4)
        tasks.append(
            Task(f"t{i}", edge, edge * rng.uniform(0.02, 1.0), rng.randint(10, 100_000), after=preds)
        )
    tasks.append(Task("upload", 0, 0, 0, after=(f"t{n - 1}",), pin="cloud"))
    return TaskGraph(name, tuple(tasks), latency_target_s=2.0, rate_hz=rng.uniform(0.2, 2))


def runnable_chain_placements(chain: TaskGraph) -> list[tuple[str, ...]]:
    """Every placement of a 3-task chain (source at the edge, upload in the cloud) that gatewayd runs
    as placed: none comes back to the edge after the cloud."""
    names = [t.name for t in chain.tasks]
    every = [("edge", *c, "cloud") for c in itertools.product(("edge", "cloud"), repeat=2)]
    return [sides for sides in every if chain.returns_to_edge(dict(zip(names, sides, strict=True))) is None]


def test_exact_equals_brute_force_over_joint_assignments():
    rng = random.Random(1)
    budgets = Budgets(uplink_Bps=100_000, edge_cores=1.0)
    for _ in range(10):
        services = [_chain(rng, 3, "a", 2), _chain(rng, 3, "b", 1)]
        link = LinkView("up", rng.uniform(0.01, 0.3), rng.uniform(20_000, 2_000_000))
        plan = plan_placement(services, link, budgets)
        eff = effective_link(link, budgets)
        brute = min(
            evaluate(
                [make_option(s, sides) for s, sides in zip(services, combo, strict=True)], eff, budgets
            ).score
            for combo in itertools.product(*[runnable_chain_placements(s) for s in services])
        )
        chosen = [make_option(s, [side for _, side in plan.service(s.name).placement]) for s in services]
        assert evaluate(chosen, eff, budgets).score == brute


def test_cut_points_are_exact_for_chains_without_budget_pressure():
    rng = random.Random(2)
    budgets = Budgets(uplink_Bps=1e12, edge_cores=100.0, byte_weight=0.0)
    for _ in range(30):
        s = _chain(rng, rng.randint(2, 7))
        link = effective_link(
            LinkView("up", rng.uniform(0.005, 0.5), rng.uniform(10_000, 5_000_000)), budgets
        )
        pins = s.required_pins()
        best_cut = min(evaluate([o], link, budgets).score[2] for o in cut_options(s, pins))
        best = min(evaluate([o], link, budgets).score[2] for o in enumerate_options(s, pins))
        assert best_cut == pytest.approx(best)


def test_heuristic_within_bound_of_exact_on_small_dags():
    rng = random.Random(3)
    budgets = Budgets(uplink_Bps=1e12, edge_cores=100.0, byte_weight=0.0)
    worst = 1.0
    for _ in range(30):
        s = _dag(rng, rng.randint(3, 7))
        link = effective_link(
            LinkView("up", rng.uniform(0.005, 0.3), rng.uniform(10_000, 5_000_000)), budgets
        )
        pins = s.required_pins()
        heur = min(evaluate([o], link, budgets).score[2] for o in heuristic_options(s, pins, link, budgets))
        exact = min(evaluate([o], link, budgets).score[2] for o in enumerate_options(s, pins))
        assert heur >= exact - 1e-12
        worst = max(worst, heur / exact)
    assert worst <= 1.25, f"hill climb from the best cut is {worst:.2f}x the exact optimum"


def test_descent_within_bound_of_exhaustive_joint_search():
    rng = random.Random(4)
    budgets = Budgets(uplink_Bps=60_000, edge_cores=1.0)
    for _ in range(15):
        services = [_chain(rng, 4, f"s{i}", priority=i % 3) for i in range(3)]
        link = effective_link(LinkView("up", rng.uniform(0.01, 0.2), rng.uniform(50_000, 2_000_000)), budgets)
        lists = [enumerate_options(s, s.required_pins()) for s in services]
        _, exact = search_exact(lists, link, budgets)
        _, descent = search_descent(lists, link, budgets)
        assert descent.score[:2] == exact.score[:2] or descent.score > exact.score
        if descent.score[:2] == exact.score[:2]:
            assert descent.score[2] <= exact.score[2] * 1.5


def test_fast_link_sends_inference_to_cloud_slow_link_keeps_it_at_edge():
    services = default_graphs()
    assert plan_placement(services, UP, Budgets()).side("camera", "infer") == "cloud"
    slow = plan_placement(services, SLOW, Budgets())
    assert slow.side("camera", "infer") == "edge" and slow.side("camera", "change") == "edge"


def test_link_down_puts_everything_at_the_edge_and_results_wait():
    plan = plan_placement(default_graphs(), LinkView("down", 0.04, 1e6), Budgets())
    for s in plan.services:
        assert all(side == "edge" for task, side in s.placement if task != "upload")
        assert s.latency_s is not None and s.latency_s > 0  # computed at the edge; delivery waits
    pinned = plan_placement(
        default_graphs(), LinkView("down", 0.04, 1e6), Budgets(), {"camera/infer": "cloud"}
    )
    assert pinned.service("camera").latency_s is None and pinned.service("sensor").latency_s is not None
    assert any("results wait in the log" in r for r in plan.reasons)


def test_private_service_never_sends_raw_data():
    for link in (UP, SLOW, LinkView("up", 0.001, 1e9)):
        plan = plan_placement([training_graph()], link, Budgets(edge_cores=100))
        assert plan.side("training", "train") == "edge"


def test_operator_pins_are_honoured_and_validated():
    pins = {"camera/infer": "edge"}
    plan = plan_placement(default_graphs(), UP, Budgets(), pins)
    assert plan.side("camera", "infer") == "edge"
    assert any("pinned by operator: camera/infer@edge" in r for r in plan.reasons)
    with pytest.raises(PinError, match="camera/capture"):
        plan_placement(default_graphs(), UP, Budgets(), {"camera/capture": "cloud"})
    with pytest.raises(PinError, match="training/train"):
        plan_placement(default_graphs(), UP, Budgets(), {"training/train": "cloud"})
    with pytest.raises(PinError, match="no such"):
        plan_placement(default_graphs(), UP, Budgets(), {"camera/nope": "edge"})


def test_no_plan_comes_back_to_the_edge_even_when_the_edge_is_over_budget():
    """``infer`` pinned to the edge of a box its inference overloads: in the model, moving ``change``
    to the cloud relieves the edge, but gatewayd runs a task after a cloud task in the cloud, so
    ``infer`` would run there, over the pin (seen in the live bench's always-edge run, flapping)."""
    budgets = Budgets(edge_cores=0.2)
    graph = camera_graph(fps=4, changed_fraction=0.5)  # infer: 0.45 s x 2 frames/s = 0.9 cores
    for link in (UP, SLOW, LinkView("flapping", 0.1, 200_000, up_fraction=0.4)):
        plan = plan_placement([graph], link, budgets, {"camera/infer": "edge"})
        sides = dict(plan.service("camera").placement)
        assert graph.returns_to_edge(sides) is None and sides["infer"] == "edge", (link.state, sides)
    with pytest.raises(PinError, match="come back down"):
        plan_placement([graph], UP, budgets, {"camera/change": "cloud", "camera/infer": "edge"})


def test_uplink_budget_binds():
    plan = plan_placement([camera_graph(changed_fraction=1.0)], UP, Budgets(uplink_Bps=50_000, byte_weight=0))
    assert plan.uplink_Bps <= 50_000
    assert plan.side("camera", "infer") == "edge"
    assert any("uplink binds" in r for r in plan.reasons)


def test_edge_cpu_budget_binds():
    budgets = Budgets(uplink_Bps=1e9, edge_cores=0.5, byte_weight=0)
    plan = plan_placement([camera_graph(fps=4, changed_fraction=0.5)], UP, budgets)
    assert plan.edge_utilisation <= budgets.edge_cpu_share
    assert plan.side("camera", "infer") == "cloud"
    neither = plan_placement([camera_graph(fps=4, changed_fraction=0.5)], SLOW, budgets)
    assert any("no placement fits the budgets" in r for r in neither.reasons)


def test_priority_decides_who_misses():
    # Two cameras that both need the cloud to meet 0.5 s; the uplink fits only one of them.
    hi = camera_graph(changed_fraction=1.0, target_s=0.5, priority=5)
    lo = camera_graph(changed_fraction=1.0, target_s=0.5, priority=1)
    lo = TaskGraph("camera2", lo.tasks, lo.latency_target_s, lo.priority, lo.private, lo.rate_hz)
    budgets = Budgets(uplink_Bps=200_000, byte_weight=0)
    plan = plan_placement([lo, hi], UP, budgets)
    assert plan.service("camera").meets_target is True
    assert plan.service("camera2").meets_target is False
    assert any("camera2 misses its target" in r and "camera" in r for r in plan.reasons)


def test_hysteresis_band():
    band = Hysteresis()
    base = LinkView("up", 0.10, 100_000)
    assert replan_trigger(base, LinkView("up", 0.12, 120_000), band) is None
    assert "rtt" in replan_trigger(base, LinkView("up", 0.30, 100_000), band)
    assert "goodput" in replan_trigger(base, LinkView("up", 0.10, 50_000), band)
    assert "up->down" in replan_trigger(base, LinkView("down", 0.10, 100_000), band)
    tiny = LinkView("up", 0.001, 1e6)
    assert replan_trigger(tiny, LinkView("up", 0.005, 1e6), band) is None  # 5x but under the floor


def test_planner_replans_only_outside_band_and_logs_decisions():
    t = [0.0]
    planner = PlacementPlanner(default_graphs(), clock=lambda: t[0], log_size=3)
    assert planner.update(UP) is not None
    assert planner.update(LinkView("up", 0.045, 950_000)) is None
    t[0] = 5.0
    slow = planner.update(SLOW)
    assert slow is not None and slow.version == 2
    assert any(m.startswith("camera/infer cloud->edge") for m in planner.decisions[-1].moves)
    planner.update(LinkView("down", 0.3, 30_000))
    planner.set_pins({"sensor/detect": "cloud"})
    planner.update(LinkView("down", 0.3, 30_000))
    assert [d.trigger for d in planner.decisions][-1] == "pins changed"
    assert len(planner.decisions) == 3 and planner.decisions_dropped == 1
    with pytest.raises(PinError):
        planner.set_pins({"sensor/ingest": "cloud"})
    assert planner.pins == {"sensor/detect": "cloud"}


def test_plan_text_form_names_everything():
    text = plan_placement([sensor_graph()], UP, Budgets()).to_text()
    assert "sensor p3:" in text and "ingest@edge" in text and "reason:" in text


def test_one_frames_cloud_latency_follows_the_link_and_decides_where_a_frame_is_done_sooner():
    """``cloud_input_s`` (what the camera router dispatches each frame by): one frame with ``infer``
    and ``summarise`` in the cloud, priced on the link as it is now, whatever the plan placed."""
    planner = PlacementPlanner(default_graphs())
    assert planner.cloud_input_s("camera", "infer", UP) is None  # no plan yet
    planner.update(SLOW)
    assert planner.current is not None and planner.current.side("camera", "infer") == "edge"
    fast, slow = (planner.cloud_input_s("camera", "infer", link) for link in (UP, SLOW))
    assert fast is not None and slow is not None
    frame = camera_graph().task("change")  # what crosses: the changed frame, a blob then its record
    assert slow >= frame.trips * SLOW.rtt_s + frame.output_bytes / SLOW.goodput_Bps > fast
    assert planner.cloud_input_s("camera", "infer", LinkView("down", 0.04, 1e6)) is None
    flapping = LinkView("flapping", 0.04, 1e6, up_fraction=0.4, longest_down_s=3.0)
    waits = planner.cloud_input_s("camera", "infer", flapping)
    assert waits is not None and waits > fast + 0.6 * 3.0 / 2 - 1e-9  # the wait for the link

    dispatch = InputDispatch(cloud_s=0.7)
    assert [dispatch.spill(edge_s) for edge_s in (0.3, 0.6, 0.9)] == [False, False, True]
    assert not dispatch.uplink_busy().spill(100)  # a backlog goes first: never
    assert not InputDispatch(cloud_s=None).spill(100)  # link down: never
    assert not InputDispatch(cloud_s=0.7, link_failing=True).spill(100)
