"""A scripted connectivity trace (up, slow, down, flapping, up) through the fault proxy to a real aiohttp
server, watched by LinkProber + LinkMonitor + PlacementController; asserted from the decision log."""

from __future__ import annotations

import pytest
from aiohttp import web

from gateway.placement import (
    Budgets,
    Hysteresis,
    LinkMonitor,
    LinkProber,
    PlacementController,
    PlacementPlanner,
)
from gateway.taskgraphs import Task, TaskGraph, sensor_graph
from tests.harness.faultproxy import FaultProxy
from tests.harness.poll import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]  # a scripted connectivity trace, played out

# A camera whose inference is slow on the gateway (1 s) and fast in the cloud: on a fast link it
# belongs in the cloud, on a slow one at the edge.
CAMERA = TaskGraph(
    "camera",
    latency_target_s=3.0,
    priority=2,
    rate_hz=1.0,
    tasks=(
        Task("capture", 0.003, 0.003, 150_000, raw=True),
        Task("change", 0.02, 0.003, 150_000, selectivity=0.1, after=("capture",), raw=True),
        Task("infer", 1.0, 0.03, 2_000, after=("change",)),
        Task("upload", 0, 0, 0, after=("infer",), pin="cloud", delivery=True),
    ),
)

# (duration_s, mode, params); played at time_scale 1 (the whole trace is ~17 s)
TRACE = [
    (3.0, "up", {}),
    (4.0, "slow", {"delay_s": 0.1, "bandwidth_Bps": 40_000}),
    (3.0, "blackhole", {}),
    (4.0, "flap", {"period_s": 0.4, "down": "reset"}),
    (3.0, "up", {}),
]


@pytest.fixture
async def cloud():
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def probe(request: web.Request) -> web.Response:
        return web.json_response({"bytes": len(await request.read())})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/probe", probe)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


def _first(decisions, start, pred):
    for i in range(start, len(decisions)):
        if pred(decisions[i]):
            return i
    return None


def _infer(decision) -> str:
    return next(p.split("@")[1] for p in decision.placement if p.startswith("camera/infer@"))


async def test_placement_follows_connectivity_trace(cloud):
    proxy = FaultProxy(cloud)
    port = await proxy.start()
    monitor = LinkMonitor(
        alpha=0.7, window_s=3.0, down_after_failures=2, flap_transitions=4, prior_goodput_Bps=100_000
    )
    planner = PlacementPlanner(
        [sensor_graph(), CAMERA],
        # the "edge" flapping policy: a flapping link puts every task here (the default, "model", is
        # held to its flap model in test_handback.py and on real processes in test_placement_live.py)
        Budgets(uplink_Bps=1_000_000, flapping="edge"),
        hysteresis=Hysteresis(up_fraction_delta=0.3),
    )
    plans = []
    controller = PlacementController(planner, monitor, plans.append, interval_s=0.1)
    prober = LinkProber(
        monitor,
        f"http://127.0.0.1:{port}/healthz",
        interval_s=0.1,
        timeout_s=0.6,
        goodput_url=f"http://127.0.0.1:{port}/probe",
        payload_bytes=32 * 1024,
        goodput_every=2,
        upload_timeout_s=3.0,
    )
    await prober.start()
    await controller.start()
    try:
        await proxy.play(TRACE)
        await proxy.wait_trace(timeout=60)
        await eventually(  # the final "up" is seen once the flaps leave the window
            lambda: planner.decisions[-1],
            15,
            "the final decision: link up, camera/infer in the cloud",
            check=lambda d: d.link_state == "up" and _infer(d) == "cloud",
            interval_s=0.1,
        )
    finally:
        await controller.stop()
        await prober.stop()
        await proxy.stop()

    log = list(planner.decisions)
    text = "\n".join(d.to_text() for d in log)
    assert len(plans) == len(log) and planner.decisions_dropped == 0
    fast = _first(log, 0, lambda d: d.link_state == "up" and _infer(d) == "cloud")
    assert fast is not None, text
    slow = _first(log, fast + 1, lambda d: d.link_state == "up" and _infer(d) == "edge")
    assert slow is not None, text
    down = _first(log, slow + 1, lambda d: d.link_state == "down")
    assert down is not None, text
    assert all(p.endswith("@edge") or p.endswith("upload@cloud") for p in log[down].placement), text
    assert any("results wait in the log" in r for r in log[down].reasons)
    flapping = _first(log, down + 1, lambda d: d.link_state == "flapping")
    assert flapping is not None, text
    assert _infer(log[flapping]) == "edge"
    back = _first(log, flapping + 1, lambda d: d.link_state == "up" and _infer(d) == "cloud")
    assert back is not None, text
    assert proxy.stats["resets"] > 0 and proxy.stats["bytes_discarded"] > 0
