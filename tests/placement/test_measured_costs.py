"""Measured costs: the band that keeps noise from re-planning, declared costs that override
measurement, the camera's traffic in its graph, and the planner's non-forcing revision."""

from __future__ import annotations

import math

import pytest

from gateway.camera.source import CameraCounters
from gateway.camera.traffic import CameraTraffic, camera_quantities
from gateway.control.wiring import base_from_file
from gateway.placement import Budgets, LinkView, PlacementPlanner
from gateway.taskgraphs import default_graphs
from gateway.taskgraphs.measured import CostError, MeasuredGraphs, Quantity, check_edge_costs, edge_cost
from gateway.taskgraphs.profile import RunningMedian
from protocol.config import parse_gateway_config
from protocol.control import ControlError
from protocol.errors import ProtocolError

INFER = edge_cost("camera/infer")
FAST = LinkView("up", 0.002, 2_000_000)


def camera(graphs):
    return next(g for g in graphs if g.name == "camera")


def test_a_measurement_moves_the_value_in_force_only_outside_the_band():
    costs = MeasuredGraphs(default_graphs(), band_ratio=1.5)
    assert costs.offer({INFER: 0.40}) == ()  # within 1.5x of the catalog's 0.45: noise
    assert camera(costs.graphs).task("infer").edge_cost_s == 0.45 and costs.source(INFER) == "default"
    assert costs.offer({INFER: 0.001}) == ("camera/infer edge_cost_s 0.45->0.001",)
    assert camera(costs.graphs).task("infer").edge_cost_s == 0.001 and costs.source(INFER) == "measured"
    before = costs.graphs
    assert costs.offer({INFER: 0.0014}) == () and costs.offer({INFER: 0.0007}) == ()
    assert costs.graphs is before  # the band is around the value in force, not the last measurement
    assert costs.offer({INFER: 0.0016}) != ()
    assert costs.revisions == 2 and costs.latest[INFER] == 0.0016
    status = costs.status()
    assert status["tasks"]["camera/infer"] == {
        "edge_cost_s": 0.0016,
        "source": "measured",
        "input_rate_hz": pytest.approx(0.1),
        "output_bytes": 2000,
    }
    assert status["tasks"]["sensor/aggregate"]["source"] == "default"


def test_a_declared_cost_is_in_force_whatever_is_measured():
    costs = MeasuredGraphs(default_graphs(), {"camera/infer": 0.45, "sensor/detect": 0.01})
    assert camera(costs.graphs).task("infer").edge_cost_s == 0.45
    assert costs.offer({INFER: 0.001}) == ()
    assert costs.source(INFER) == "declared" and costs.latest[INFER] == 0.001  # shown, not used
    assert costs.status()["tasks"]["sensor/detect"] == {
        "edge_cost_s": 0.01,
        "source": "declared",
        "input_rate_hz": pytest.approx(1.0),
        "output_bytes": 64,
    }


def test_measuring_off_keeps_the_declared_and_default_costs():
    costs = MeasuredGraphs(default_graphs(), measure=False)
    assert costs.offer({INFER: 0.001}) == () and costs.source(INFER) == "default"


def test_declared_costs_that_name_no_task_are_refused_naming_it():
    errors = check_edge_costs(
        default_graphs(), {"camera/inference": 0.1, "radar/x": 1.0, "sensor/detect": -1}
    )
    assert errors == (
        "camera/inference: service 'camera' has no task 'inference' "
        "(its tasks: capture, change, infer, summarise, upload)",
        "radar/x: no service 'radar' (services: sensor, camera, training)",
        "sensor/detect: must be a number of seconds >= 0, not -1",
    )
    with pytest.raises(CostError, match="camera/inference"):
        MeasuredGraphs(default_graphs(), {"camera/inference": 0.1})


def test_measurements_that_would_make_an_invalid_graph_are_refused_and_counted():
    costs = MeasuredGraphs(default_graphs())
    bad = {
        Quantity("camera", "rate_hz"): 0.0,
        Quantity("camera", "edge_cost_s", "nosuch"): 0.1,
        Quantity("radar", "rate_hz"): 2.0,
        Quantity("camera", "selectivity", "change"): math.nan,
        Quantity("camera", "output_bytes", "change"): -5.0,
    }
    assert costs.offer(bad) == () and costs.refused == 5 and costs.graphs == tuple(default_graphs())
    with pytest.raises(ValueError):
        Quantity("camera", "rate_hz", "capture")  # a service's figure names no task


def test_camera_traffic_becomes_the_camera_graphs_rate_selectivity_and_frame_size():
    now = [0.0]
    traffic = CameraTraffic(clock=lambda: now[0])
    counters = CameraCounters()
    traffic.observe(counters)
    assert traffic.figures() is None
    # 10 s: 60 frames read, 20 sampled out, 30 unchanged, 8 delivered and 2 dropped, 10 JPEGs
    counters.frames_read, counters.sampled_out, counters.unchanged = 60, 20, 30
    counters.delivered, counters.dropped, counters.jpeg_bytes = 8, 2, 50_000
    now[0] = 4.0
    traffic.observe(counters)
    assert traffic.figures() is None  # a window shorter than MIN_SPAN_S says too little
    now[0] = 10.0
    traffic.observe(counters)
    figures = traffic.figures()
    assert figures is not None
    assert (figures.frames_per_s, figures.changed_fraction, figures.jpeg_bytes) == (4.0, 0.25, 5000.0)
    costs = MeasuredGraphs(default_graphs())
    moved = costs.offer(camera_quantities(0.002, figures))
    assert len(moved) == 5
    graph = camera(costs.graphs)
    assert graph.input_rate("infer") == pytest.approx(1.0)  # changed frames per second
    assert graph.task("change").output_bytes == 5000 and graph.task("infer").edge_cost_s == 0.002
    now[0] = 50.0  # the window forgets samples older than WINDOW_S; a stalled source reports nothing
    traffic.observe(counters)
    assert traffic.figures() is None


def test_running_median_ignores_a_few_stalls():
    median = RunningMedian(size=8)
    assert median.value is None
    for value in (0.001, 0.001, 0.5, 0.001, 0.002, 0.4, 0.001):
        median.add(value)
    assert median.value == 0.001 and len(median) == 7


def test_a_cost_revision_makes_a_new_plan_version_only_if_a_task_moves():
    costs = MeasuredGraphs(default_graphs(), {"camera/infer": 0.45})
    planner = PlacementPlanner(costs.graphs, Budgets())
    first = planner.update(FAST)
    assert first is not None and dict(first.service("camera").placement)["infer"] == "cloud"

    measured = MeasuredGraphs(default_graphs())  # the same box, measuring instead
    moved = measured.offer({INFER: 0.001})
    planner.revise_services(measured.graphs, "costs: " + ", ".join(moved))
    second = planner.update(FAST)
    assert second is not None and second.version == 2
    assert dict(second.service("camera").placement)["infer"] == "edge"
    assert planner.decisions[-1].trigger == "costs: camera/infer edge_cost_s 0.45->0.001"

    moved = measured.offer({INFER: 0.004})  # left the band, but the edge is still the place
    assert moved
    planner.revise_services(measured.graphs, "costs: " + ", ".join(moved))
    assert planner.update(FAST) is None
    assert planner.current is second and planner.plans_kept == 1
    assert planner.update(FAST) is None and planner.plans_kept == 1  # evaluated once, not every check


def test_config_checks_the_form_and_the_task_of_declared_costs(tmp_path):
    base = {"gateway_id": "gw1", "data_dir": str(tmp_path)}
    with pytest.raises(ProtocolError, match="placement.edge_costs"):
        parse_gateway_config({**base, "placement": {"edge_costs": {"infer": 0.4}}})
    with pytest.raises(ProtocolError, match="placement.edge_costs"):
        parse_gateway_config({**base, "placement": {"edge_costs": {"camera/infer": -0.4}}})
    config = parse_gateway_config({**base, "placement": {"edge_costs": {"camera/infr": 0.45}}})
    with pytest.raises(ControlError, match="placement.edge_costs: camera/infr: service 'camera' has no task"):
        base_from_file(config)
    good = parse_gateway_config({**base, "placement": {"edge_costs": {"camera/infer": 0.45}}})
    assert good.placement.measure_costs and good.placement.cost_band_ratio == 1.5
    base_from_file(good)
