"""Placement on the real processes: the live trace played for the plan, always-edge and always-cloud.

The trace of tests/harness/live_trace.py (mosquitto, cloudd, gatewayd with a devicesim camera and
sensors, the uplink through the fault proxy: fast, outage, slow 50 kB/s + 300 ms, flapping 2 s up /
3 s down, recovery) is played three times in one run, on fresh processes each time:
- ``plan``: the gateway's placement plan decides where camera ``infer`` runs;
- ``always-edge`` / ``always-cloud``: ``camera/infer`` pinned there (``[placement] pins``).

The gateway is an emulated weak edge box (tests/harness/weak_edge.py): gatewayd under a CPU quota of
``EDGE_CPU`` of one core, running a 192-pixel scene model whose width is calibrated on the machine the
bench runs on to ~55 ms a frame at full speed (``weak_edge.calibrated``; so ~0.28 s under the quota: a
Raspberry-Pi-class box, still faster than the catalog's declared 0.45 s), which cloudd runs too, at
full speed. It plans with the costs it measures. This machine infers the shipped model in
~1 ms, so without the emulation there is nothing for the cloud to win; where no cgroup can be written
(not root) the bench says so, runs the shipped model on the bare gateway with the catalog's declared
Pi-class cost instead, and records ``weak_edge: null``.

Result latency, as bench.placement defines it: a changed frame's capture -> its result produced, on
the side that made it (the gateway logging its CameraEvent; cloudd storing the one it made).
Delivery (capture -> the result first seen in cloudd's store, polled every 0.5 s) is shown apart.

Figures (the names issue 18 gives; the first and last are ratios, higher is better; the middle two
are rates and times, lower is better, with their targets):
- ``latency_vs_best_static``: the better static system's mean result latency over the plan's (>= 1.3);
- ``replans_per_min_steady``: the plan's new versions per minute in the steady phases (fast, outage,
  slow), ``FOLLOW_S`` after each phase began (<= 2);
- ``flap_detect_s``: the flapping phase's start -> the gateway's monitor first saying "flapping" (<= 15);
- ``drain_vs_ideal``: after the outage, the ideal drain time (the bytes of the records, and of the
  frames they carry as blobs, written before the link came back and not yet in the cloud, over the
  slow phase's 50 kB/s) over ours (the link's return -> the last of them first seen in cloudd) (>= 0.5).

    python -m bench.placement_live [--quick]   -> bench/results/placement_live.json
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench._common import Results, parse_args
from cloud.store.dataset import StoredRecord
from tests.harness.live_trace import SLOW, LiveRun, Phase, run_live, trace
from tests.harness.weak_edge import WeakEdge, WeakEdgeUnavailable, calibrated

SYSTEMS: dict[str, dict[str, str]] = {
    "plan": {},
    "always-edge": {"camera/infer": "edge"},
    "always-cloud": {"camera/infer": "cloud"},
}
FOLLOW_S = 12.0  # as tests/e2e/test_placement_live.py: the plan's time to follow a phase change
STEADY = ("fast", "outage", "slow")
EDGE_CPU = 0.2  # of one core, for the whole gatewayd (module docstring)


def camera_made(run: LiveRun, start: float, end: float) -> list[StoredRecord]:
    """The camera results (not task failures) of the frames captured in [start, end)."""
    return [
        r
        for r in run.camera_results()
        if "capture_ts" in r.record["body"] and start <= r.record["body"]["capture_ts"] < end
    ]


def camera_latencies(run: LiveRun) -> tuple[list[float], list[float]]:
    """(produced, delivered) seconds per camera result, from its frame's capture, for the frames
    captured while the trace played (not those of the processes' start, nor of the final drain)."""
    made = camera_made(run, run.phases[0][1], run.phases[-1][2])
    produced = [r.record["received_ts"] - r.record["body"]["capture_ts"] for r in made]
    delivered = [run.first_seen[(r.log_id, r.lsn)] - r.record["body"]["capture_ts"] for r in made]
    return produced, delivered


def by_phase(run: LiveRun) -> dict[str, tuple[float, float]]:
    """Per phase of the trace: the mean result latency of its frames, and the share inferred in the
    cloud (where the plan's time went)."""
    out = {}
    for name, start, end in run.phases:
        made = camera_made(run, start, end)
        if made:
            latency = statistics.fmean(r.record["received_ts"] - r.record["body"]["capture_ts"] for r in made)
            in_cloud = sum(r.record["body"]["ran_at"]["infer"] == "cloud" for r in made)
            out[name] = (latency, in_cloud / len(made))
    return out


def replans_per_minute(run: LiveRun) -> float:
    versions = minutes = 0.0
    for name in STEADY:
        start, end = run.phase(name)
        seen = [s["placement"]["decisions_total"] for at, s in run.samples if start + FOLLOW_S <= at <= end]
        versions += seen[-1] - seen[0] if seen else 0
        minutes += max(0.0, end - start - FOLLOW_S) / 60
    return versions / minutes if minutes else float("nan")


def flap_detect_s(run: LiveRun) -> float:
    start, end = run.phase("flapping")
    seen = [at for at, state in run.link_states() if start <= at <= end and state == "flapping"]
    return seen[0] - start if seen else float("inf")


def drain_figures(run: LiveRun) -> dict[str, float]:
    """The backlog the outage left: its bytes, the ideal time to send them at the slow phase's rate,
    and the time it took."""
    _, back_at = run.phase("outage")
    written = max(s["log"]["durable_lsn"] for at, s in run.samples if at <= back_at)
    backlog = [
        r for r in run.gateway_log() if r.lsn <= written and run.first_seen[(r.log_id, r.lsn)] > back_at
    ]
    nbytes = sum(len(json.dumps(r.record, separators=(",", ":"))) for r in backlog)
    nbytes += sum(r.record["body"]["blob"]["size"] for r in backlog if "blob" in r.record["body"])  # frames
    took = max((run.first_seen[(r.log_id, r.lsn)] for r in backlog), default=back_at) - back_at
    ideal = nbytes / SLOW["bandwidth_Bps"]
    return {"backlog_bytes": nbytes, "records": len(backlog), "ideal_s": ideal, "took_s": took}


async def play_all(phases: tuple[Phase, ...], edge: WeakEdge | None) -> dict[str, LiveRun]:
    runs: dict[str, LiveRun] = {}
    for system, pins in SYSTEMS.items():
        with tempfile.TemporaryDirectory(prefix=f"placement-live-{system}-") as tmp:
            print(f"-- {system}: {sum(p.duration_s for p in phases):.0f} s trace", flush=True)
            runs[system] = await run_live(Path(tmp), phases, pins=pins, weak_edge=edge)
    return runs


async def measure(quick: bool) -> Results:
    results = Results("placement_live", quick)
    phases = trace(scale=0.5 if quick else 1.5)
    latency: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="placement-live-model-") as model_dir:
        # once, for all three systems: the same box for each
        weak, full_speed_ms = await asyncio.to_thread(calibrated, Path(model_dir), EDGE_CPU)
        edge: WeakEdge | None = weak
        print(
            f"-- weak edge: {EDGE_CPU} of a core, model width {weak.width}: {full_speed_ms:.0f} ms a frame"
            " at full speed",
            flush=True,
        )
        try:
            runs = await play_all(phases, edge)
        except WeakEdgeUnavailable as exc:
            print(f"-- no weak edge ({exc}); the bare gateway with the declared Pi-class cost", flush=True)
            edge = None
            runs = await play_all(phases, edge)
    results.extra["weak_edge"] = (
        None
        if edge is None
        else {
            "cpu_fraction": edge.cpu_fraction,
            "input_size": edge.input_size,
            "width": edge.width,
            "full_speed_ms": full_speed_ms,
        }
    )
    for system, run in runs.items():
        produced, delivered = camera_latencies(run)
        latency[system] = statistics.fmean(produced)
        for metric, values in (("produced_s", produced), ("delivered_s", delivered)):
            results.add("camera", system, f"{metric}_mean", statistics.fmean(values))
            results.add("camera", system, f"{metric}_p95", statistics.quantiles(values, n=20)[-1])
        results.add("camera", system, "results", len(produced))
        for phase, (mean, cloud_share) in by_phase(run).items():
            results.add(f"camera/{phase}", system, "produced_s_mean", mean)
            results.add(f"camera/{phase}", system, "inferred_in_cloud", cloud_share)
    plan = runs["plan"]
    drain = drain_figures(plan)
    for metric, value in drain.items():
        results.add("drain", "plan", metric, value)
    best_static = min(latency["always-edge"], latency["always-cloud"])
    results.ratio("latency_vs_best_static", best_static, latency["plan"])
    results.ratios["replans_per_min_steady"] = replans_per_minute(plan)
    results.ratios["flap_detect_s"] = flap_detect_s(plan)
    results.ratio("drain_vs_ideal", drain["ideal_s"], drain["took_s"])
    results.extra["targets"] = {
        "latency_vs_best_static": ">= 1.3",
        "replans_per_min_steady": "<= 2",
        "flap_detect_s": "<= 15",
        "drain_vs_ideal": ">= 0.5",
    }
    results.extra["phases"] = [[name, end - start] for name, start, end in plan.phases]
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    results = asyncio.run(measure(args.quick))
    results.write()
    return results.ratios


if __name__ == "__main__":
    main()
