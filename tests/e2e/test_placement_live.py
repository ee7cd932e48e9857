"""Must-show 1 of issue 18: the placement plan runs, on real processes, through a live trace.

mosquitto, cloudd, gatewayd with a devicesim camera and devicesim sensors (and one device that runs
hot), the uplink through the fault proxy playing a fast link, an outage, a slow link (50 kB/s, 300 ms),
a link flapping 2 s up / 3 s down, and a recovery (tests/harness/live_trace.py). Asserted from what
cloudd stored and the gateway's /status samples:

- every telemetry record is stored exactly once; every changed frame has exactly one camera result,
  made on one side; every telemetry record lies in exactly one sensor window, with one detection;
- camera inference ran in the cloud in the fast phase and on the gateway in the outage, the slow
  phase and the flapping (the stored events say where), once the plan had ``FOLLOW_S`` to follow
  (with ``dispatch_inputs`` off: this asserts the plan; a frame dispatched against it, a burst
  spilled to the cloud or a frame the black hole kept, is docs/placement.md's "Dispatching each
  frame", and bench/placement_live.py plays the trace with it on);
- at most 2 re-plans per minute on the steady phases; flapping recognised within 15 s;
- the alerts written while the link was down were stored before the raw telemetry of that time.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from protocol.derived import parse_derived
from tests.harness.live_trace import HOT_DEVICE, LiveRun, run_live, trace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]  # a 160 s trace on five processes

FOLLOW_S = 12.0  # after a phase starts, how long the link estimate and the plan may take to follow
FLAP_DETECT_S = 15.0
MAX_REPLANS_PER_MIN = 2.0


def sensor_results(run: LiveRun, kind: str, task: str) -> list[Any]:
    return [parse_derived(r.record["body"]) for r in run.sensor_results(kind, task)]


def where_inferred(results: list[dict[str, Any]], start: float, end: float) -> Counter[str]:
    return Counter(b["ran_at"]["infer"] for b in results if start <= b["capture_ts"] < end)


def plan_versions_in(run: LiveRun, start: float, end: float) -> int:
    versions = [s["placement"]["decisions_total"] for at, s in run.samples if start <= at <= end]
    return versions[-1] - versions[0] if versions else 0


async def test_the_plan_runs_through_a_live_trace(tmp_path: Path) -> None:
    check(await run_live(tmp_path, trace(), dispatch_inputs=False))


def check(run: LiveRun) -> None:
    """Every assertion, on what the run left (a function apart, to re-check a recorded run)."""
    stored = run.gateway_log()
    status = run.final_status

    # -- nothing lost, nothing doubled --------------------------------------------------------------
    telemetry = Counter(
        (r.record["device"], r.record["body"]["seq"]) for r in stored if r.record["kind"] == "telemetry"
    )
    sent = {(device, seq) for device, seqs in run.sensors.sent.items() for seq in seqs}
    sent |= {(HOT_DEVICE, seq) for seq in range(run.hot_sent)}
    assert telemetry.keys() == sent and set(telemetry.values()) == {1}

    results = [r.record["body"] for r in run.camera_results()]
    assert all(b.get("type") != "task_failed" for b in results), [b for b in results if "reason" in b]
    seqs = Counter(b["seq"] for b in results)
    assert set(seqs.values()) == {1}, "a frame with two results"
    assert len(seqs) == status["camera"]["capture"]["delivered"], "a changed frame without a result"

    telemetry_lsns = {r.lsn for r in stored if r.record["kind"] == "telemetry"}
    aggregates = sensor_results(run, "sensor_aggregate", "sensor/aggregate")
    windows = Counter(
        lsn for a in aggregates for lsn in telemetry_lsns if a.window.first_lsn <= lsn <= a.window.last_lsn
    )
    assert windows.keys() == telemetry_lsns and sum(a.samples for a in aggregates) == len(telemetry_lsns)
    detections = sensor_results(run, "sensor_detection", "sensor/detect")
    assert sorted((d.window.device, d.window.first_lsn) for d in detections) == sorted(
        (a.window.device, a.window.first_lsn) for a in aggregates
    )
    for d in detections:  # the hot device is always out of bounds; devicesim's sensors only fail now and then
        expected = d.window.device == HOT_DEVICE or any("fault" in reason for reason in d.reasons)
        assert (d.severity == "alert") == expected, d

    # -- where camera inference ran, phase by phase -------------------------------------------------
    phases = {name: (start + FOLLOW_S, end) for name, start, end in run.phases}
    placed = {name: where_inferred(results, *bounds) for name, bounds in phases.items()}
    assert set(placed["fast"]) == {"cloud"}, placed  # (a scene may not change for a while: a phase
    for name in ("outage", "slow", "flapping"):  # may have no frame, never one on the wrong side)
        assert set(placed[name]) <= {"edge"}, (name, placed)
    assert sum(placed[name]["edge"] for name in ("outage", "slow", "flapping")) > 0, placed

    # -- a steady estimate, a quick flap detector ---------------------------------------------------
    steady = ("fast", "outage", "slow")
    replans = sum(plan_versions_in(run, *phases[name]) for name in steady)
    minutes = sum(end - start for name, (start, end) in phases.items() if name in steady) / 60
    assert replans <= MAX_REPLANS_PER_MIN * minutes, (replans, minutes)
    flap_start, flap_end = run.phase("flapping")
    flapping_at = [at for at, s in run.link_states() if flap_start <= at <= flap_end and s == "flapping"]
    assert flapping_at and flapping_at[0] - flap_start <= FLAP_DETECT_S, flapping_at[:1]

    # -- alerts written while the link was down went up before that time's raw telemetry ------------
    outage_start, outage_end = run.phase("outage")
    down_at = next(at for at, state in run.link_states() if outage_start <= at and state == "down")
    telemetry_records = [r for r in stored if r.record["kind"] == "telemetry"]
    raw = [r for r in telemetry_records if down_at <= r.record["received_ts"] < outage_end]
    first_lsn, last_lsn = min(r.lsn for r in raw), max(r.lsn for r in raw)
    events = [r for r in stored if r.record["kind"] == "event" and first_lsn <= r.lsn <= last_lsn]
    alerts = [r for r in events if r.record["body"].get("severity") == "alert"]
    order = run.order()
    assert alerts, "no alert written during the outage"
    assert max(order[(r.log_id, r.lsn)] for r in alerts) < min(order[(r.log_id, r.lsn)] for r in raw)
