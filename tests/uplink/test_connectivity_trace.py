"""Must-show 1 of issue 4: a scripted connectivity trace through a real fault proxy, end to end.

    simulated sensors -> real mosquitto -> real gatewayd --(uplink + probes)--> FaultProxy -> real cloudd

The proxy plays up, slow, down "for minutes", flapping, up. Minutes are scaled to seconds: the trace
is written in field time (60 s up, 60 s slow, 120 s down, 60 s flapping, 60 s up) and played with
``TIME_SCALE`` = 0.05, i.e. 3 s, 3 s, 6 s, 3 s, 3 s; the gateway's probe interval, monitor window and
backoff are scaled the same way in its config. Asserted: every record the broker acknowledged is in
the cloud exactly once (as tests/e2e/test_exactly_once.py), and the gateway's own decision log
(GET /status, "placement") moved camera/infer the way the trace demands: to the cloud on a fast
link, to the edge when slow, everything at the edge while down, the edge while flapping, and back
to the cloud when the link is good again.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import pytest

from devices.sensors import SensorRun, SentRecord, run_sensors
from tests.harness.faultproxy import FaultProxy
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # a scripted 18 s trace, four real processes

TIME_SCALE = 0.05
TRACE = [  # field time (seconds), played at TIME_SCALE
    (60.0, "up", {}),
    (60.0, "slow", {"delay_s": 0.1, "bandwidth_Bps": 40_000}),
    (120.0, "blackhole", {}),
    (60.0, "flap", {"period_s": 8.0, "down": "reset"}),
    (60.0, "up", {}),
]

GATEWAY_EXTRA = """timeout_s = 2.0
batch_max_records = 200

[devices]
allow = ["sensor-*"]

[placement]
probe_interval_s = 0.15
probe_timeout_s = 0.6
goodput_every = 2
replan_interval_s = 0.1
alpha = 0.7
window_s = 3.0
down_after_failures = 2
flap_transitions = 4
prior_goodput_Bps = 100000.0
uplink_budget_Bps = 1000000.0
up_fraction_delta = 0.3
decisions_in_status = 256

[placement.edge_costs]
"camera/infer" = 0.45                # a Raspberry-Pi-class box: on a fast link, inference goes up
"""


def _infer(decision: dict) -> str:
    return next(p.split("@")[1] for p in decision["placement"] if p.startswith("camera/infer@"))


def _first(decisions: list[dict], start: int, pred) -> int | None:
    return next((i for i in range(start, len(decisions)) if pred(decisions[i])), None)


async def test_trace_loses_nothing_duplicates_nothing_and_placement_follows_it(
    mosquitto, cloudd, tmp_path: Path
):
    proxy = FaultProxy(cloudd.port)
    port = await proxy.start()
    config, http_port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=f"http://127.0.0.1:{port}",
        token=cloudd.token_for("gw1"),
        extra=GATEWAY_EXTRA,
    )
    gateway = await asyncio.to_thread(lambda: Gatewayd(config, http_port).wait_ready())
    stop_sensors = threading.Event()
    sent: list[SentRecord] = []
    run = SensorRun(
        broker=mosquitto.url, count=3, rate_hz=20, duration_s=None, messages=None, dropout_probability=0.0
    )
    sensors = threading.Thread(target=lambda: sent.append(run_sensors(run, stop_sensors)), name="sensors")
    sensors.start()

    def gateway_status():
        return asyncio.to_thread(gateway.status)

    def fast_link_in_the_cloud(status: dict) -> bool:
        decisions = status["placement"]["decisions"]
        return decisions[-1]["link_state"] == "up" and _infer(decisions[-1]) == "cloud"

    try:
        # the trace starts from a fast link: the first goodput probes have put camera/infer in the cloud
        await eventually(
            gateway_status, 30, "camera/infer in the cloud on a fast link", check=fast_link_in_the_cloud
        )
        await proxy.play(TRACE, time_scale=TIME_SCALE)
        await proxy.wait_trace(timeout=60)
        stop_sensors.set()
        await asyncio.to_thread(sensors.join, 30)
        assert not sensors.is_alive()
        # the final "up" is believed once the flaps leave the window
        await eventually(
            gateway_status,
            30,
            "the link up again, camera/infer back in the cloud",
            check=fast_link_in_the_cloud,
        )
        expected = sent[0].total
        status = await eventually(
            gateway_status,
            40,
            f"the uplink drained and {expected} records in the cloud",
            check=lambda s: s["uplink"]["backlog"] == 0 and len(cloudd.telemetry("gw1")) >= expected,
            interval_s=0.2,
        )
    finally:
        stop_sensors.set()
        await asyncio.to_thread(gateway.kill)
        await proxy.stop()

    # -- zero lost, zero duplicated (the cloud's own store, read back) ---------------------------
    stored = cloudd.telemetry("gw1")
    counts = Counter((r.record["device"], r.record["body"]["seq"]) for r in stored)
    expected_keys = {(device, seq) for device, seqs in sent[0].sent.items() for seq in seqs}
    assert sent[0].total > 500
    assert expected_keys - counts.keys() == set(), "records lost"
    assert counts.keys() - expected_keys == set(), "records stored that were never sent"
    assert {k: n for k, n in counts.items() if n > 1} == {}, "records stored more than once"
    assert status["uplink"]["failures"]["timeout"] + status["uplink"]["failures"]["connection"] > 0

    # -- the placement followed the trace (the gateway's decision log) ---------------------------
    decisions = status["placement"]["decisions"]
    assert status["placement"]["decisions_dropped"] == 0
    text = "\n".join(f"v{d['version']} {d['link_state']} {d['trigger']} {d['moves']}" for d in decisions)
    fast = _first(decisions, 0, lambda d: d["link_state"] == "up" and _infer(d) == "cloud")
    assert fast is not None, text
    slow = _first(decisions, fast + 1, lambda d: d["link_state"] == "up" and _infer(d) == "edge")
    assert slow is not None, text
    down = _first(decisions, slow + 1, lambda d: d["link_state"] == "down")
    assert down is not None, text
    assert all(p.endswith("@edge") or p.endswith("upload@cloud") for p in decisions[down]["placement"]), text
    assert any("results wait in the log" in r for r in decisions[down]["reasons"]), text
    flapping = _first(decisions, down + 1, lambda d: d["link_state"] == "flapping")
    assert flapping is not None, text
    assert _infer(decisions[flapping]) == "edge", text
    back = _first(decisions, flapping + 1, lambda d: d["link_state"] == "up" and _infer(d) == "cloud")
    assert back is not None, text
    assert status["placement"]["plan"]["link"]["state"] == "up"
