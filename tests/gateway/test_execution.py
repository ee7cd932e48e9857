"""Executing the plan on the gateway, below the daemon: the sides of a service from a real plan
(gateway/placement/execution.py) and the sensor windows the ingest task runs (gateway/ingest/windows.py)
writing into a real EpochLog, read back."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.ingest.windows import SensorWindows
from gateway.placement.cost import Budgets, LinkView
from gateway.placement.execution import PlannedSides, ServiceSides, service_sides
from gateway.placement.planner import PinError, plan_placement
from gateway.storage.epoch_log import EpochLog
from gateway.taskgraphs import TaskGraph, camera_graph, default_graphs, parse_graphs, sensor_graph
from protocol.derived import Bounds, SensorParams, parse_derived

FAST = LinkView(state="up", rtt_s=0.01, goodput_Bps=5e6, up_fraction=1.0)
DOWN = LinkView(state="down", rtt_s=0.01, goodput_Bps=5e6, up_fraction=0.0)


def plan(pins: dict[str, Any], link: LinkView = FAST, graphs: tuple[TaskGraph, ...] | None = None):
    return plan_placement(graphs or default_graphs(), link, Budgets(), pins)


def test_sides_follow_the_plan_and_pins() -> None:
    cloud = plan({"camera/infer": "cloud", "sensor/aggregate": "cloud"})
    assert service_sides(cloud, camera_graph()) == {"infer": "cloud", "summarise": "cloud"}
    assert service_sides(cloud, sensor_graph()) == {"aggregate": "cloud", "detect": "cloud"}
    edge = plan({"camera/infer": "edge", "camera/summarise": "edge"}, DOWN)
    assert service_sides(edge, camera_graph()) == {"infer": "edge", "summarise": "edge"}
    split = plan({"sensor/aggregate": "edge", "sensor/detect": "cloud"})
    assert service_sides(split, sensor_graph()) == {"aggregate": "edge", "detect": "cloud"}


def test_a_task_after_a_cloud_task_runs_in_the_cloud() -> None:
    """The planner never places a task at the edge after one in the cloud (and refuses pins that
    would); the executor still runs such a task in the cloud, should a plan say otherwise."""
    [graph] = parse_graphs(
        "service camera target=2 priority=2 private=no rate=1\n"
        "  task capture edge=0.003 cloud=0.003 out=150000 raw=yes\n"
        "  task infer edge=0.45 cloud=0.03 out=2000 after=capture\n"
        "  task summarise edge=0.005 cloud=0.001 out=400 after=infer\n"
        "  task upload edge=0 cloud=0 out=0 after=summarise pin=cloud delivery=yes\n"
        "end\n"
    )
    with pytest.raises(PinError, match="camera/summarise: pinned to the edge after"):
        plan({"camera/infer": "cloud", "camera/summarise": "edge"}, graphs=(graph,))
    made = plan({"camera/infer": "cloud"}, graphs=(graph,))
    [camera] = made.services
    back = dataclasses.replace(
        camera, placement=tuple((t, "edge" if t == "summarise" else side) for t, side in camera.placement)
    )
    forged = dataclasses.replace(made, services=(back,))
    assert forged.side("camera", "summarise") == "edge"  # what such a plan says...
    assert service_sides(forged, graph) == {"infer": "cloud", "summarise": "cloud"}  # ...and what runs


def test_planned_sides_counts_only_moves() -> None:
    sides = PlannedSides(default_graphs())
    assert sides.current("camera") == ServiceSides(0, {"infer": "edge", "summarise": "edge"})
    first = plan({"camera/infer": "cloud"})
    sides.update(first)
    assert sides.current("camera").sides == {"infer": "cloud", "summarise": "cloud"}
    assert sides.changes == 1
    sides.update(plan({"camera/infer": "cloud"}))  # same sides, another plan
    assert sides.changes == 1
    sides.update(plan({"camera/infer": "edge", "camera/summarise": "edge"}))
    assert sides.changes == 2 and sides.current("camera").sides["infer"] == "edge"


class Sides:
    def __init__(self, aggregate: str, detect: str) -> None:
        self.now = ServiceSides(1, {"aggregate": aggregate, "detect": detect})

    def __call__(self) -> ServiceSides:
        return self.now


async def read_bodies(log: EpochLog) -> list[tuple[int, dict[str, Any]]]:
    await (await log.flush()).durable
    return [(lsn, json.loads(data)) async for lsn, data in log.read(1)]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


def test_sensor_windows_results_markers_and_alerts(log_dir: Path) -> None:
    """Every telemetry record is in exactly one edge window, a window that ran in the cloud has no
    edge result, a switch writes a marker after the old windows' results, and an out-of-bounds mean
    is an alert."""

    async def go() -> list[tuple[int, dict[str, Any]]]:
        log = EpochLog(log_dir, segment_bytes=1 << 20, max_bytes=1 << 24)
        await log.open()
        sides = Sides("edge", "edge")
        clock = [100.0]
        params = SensorParams(window_s=1.0, bounds={"temperature_c": Bounds(high=40.0)})
        windows = SensorWindows(log, "gw1", params, sides, lambda: clock[0])
        await windows.follow()  # start marker

        async def sample(device: str, ts: float, value: float) -> None:
            clock[0] = ts
            await windows.follow()
            body = {"status": "ok", "readings": {"temperature_c": value}}
            lsn = await log.append(json.dumps({"kind": "telemetry", "device": device, "body": body}).encode())
            await windows.observe(lsn, device, ts, body)

        for i in range(30):  # 3 s of two devices at 10 Hz; s2 runs hot in its second second
            await sample("s1", 100.0 + i / 10, 20.0)
            await sample("s2", 100.0 + i / 10 + 0.01, 45.0 if 10 <= i < 20 else 20.0)
        sides.now = ServiceSides(2, {"aggregate": "edge", "detect": "cloud"})
        for i in range(30, 40):
            await sample("s1", 100.0 + i / 10, 20.0)
        sides.now = ServiceSides(3, {"aggregate": "cloud", "detect": "cloud"})
        for i in range(40, 50):
            await sample("s1", 100.0 + i / 10, 20.0)
        clock[0] = 110.0
        await windows.tick()  # silent: the cloud's windows close, with nothing made here
        assert len(windows.book) == 0
        bodies = await read_bodies(log)
        await log.close()
        return bodies

    records = asyncio.run(go())
    telemetry = [(lsn, r["device"]) for lsn, r in records if r["kind"] == "telemetry"]
    events = [(lsn, parse_derived(r["body"])) for lsn, r in records if r["kind"] == "event"]
    markers = [(lsn, e) for lsn, e in events if e.type == "placement"]
    assert [(m.reason, m.plan, m.sides["aggregate"], m.sides["detect"]) for _, m in markers] == [
        ("start", 1, "edge", "edge"),
        ("plan", 2, "edge", "cloud"),
        ("plan", 3, "cloud", "cloud"),
    ]
    assert all(m.sensor is not None and m.sensor.bounds["temperature_c"].high == 40.0 for _, m in markers)
    aggregates = [(lsn, e) for lsn, e in events if e.type == "sensor_aggregate"]
    detections = [e for _, e in events if e.type == "sensor_detection"]
    # the edge windows cover exactly the telemetry logged before the marker that sent them to the cloud
    cloud_from = markers[2][0]
    covered = sorted(
        (lsn, device)
        for lsn, device in telemetry
        for _, a in aggregates
        if a.window.device == device and a.window.first_lsn <= lsn <= a.window.last_lsn
    )
    assert covered == [(lsn, device) for lsn, device in telemetry if lsn < cloud_from]
    assert sum(a.samples for _, a in aggregates) == len(covered)
    # each result follows its window's last record and precedes the next marker
    for lsn, a in aggregates:
        assert a.window.last_lsn < lsn
        assert not any(a.window.last_lsn < m < lsn for m, _ in markers)
    # detect ran here only for the windows opened while it was placed here
    assert {tuple(a.ran_at.values()) for _, a in aggregates} == {("edge", "edge"), ("edge", "cloud")}
    edge_detected = [a for _, a in aggregates if a.ran_at["detect"] == "edge"]
    assert [d.window for d in detections] == [a.window for a in edge_detected]
    alerts = [d for d in detections if d.severity == "alert"]
    assert alerts and all(d.window.device == "s2" and d.anomalous for d in alerts)
    assert all(d.severity == "info" for d in detections if d.window.device == "s1")
