"""Placement benchmark: a trace-driven discrete-event simulation of a gateway, its link and the cloud.

Systems, all fed the same connectivity trace and the same seeded inputs:
- ``planner``: PlacementPlanner + LinkMonitor. It sees only what a gateway can measure: a probe every
  ``PROBE_S`` (its RTT, or a failure while the link is down), jittered by +-``PROBE_JITTER`` and every
  ``FAST_PROBE_S`` while the monitor is unsettled, as LinkProber does; a 32 kB payload probe at most
  every ``GOODPUT_EVERY`` x ``PROBE_S`` (sent through the same uplink queue, its bytes counted;
  skipped when real uploads measured goodput since the last one), a confirmation probe
  ``CONFIRM_S`` after a suspect failure, and the real uploads of the simulation (size, time, ok)
  -- so its estimates lag the link. It re-plans when a check every ``REPLAN_S`` finds the estimate
  outside the band and the placement changes, as PlacementController does. Hysteresis as in
  production. (Probes are not aligned with the trace's changes, as on a real gateway.)
- ``always-edge`` / ``always-cloud``: every unpinned task at the edge / in the cloud, always.
- ``oracle``: the same planner math fed the *true* link at every change of the trace, without lag
  or hysteresis (perfect knowledge of when the link changes).

Mechanism (the simulator, not the planner, knows the trace): edge CPU is ``EDGE_CORES`` servers with
a non-preemptive priority queue (higher service priority first), so saturation queues work; the
uplink is one FIFO server whose rate follows the trace, paused while the link is down (resumable
uploads); the cloud has unbounded servers. Each item runs the plan current when each task starts;
an upload cut by an outage fails and goes back to the head of the queue (it is still in the log),
and after a re-plan, queued inputs of tasks moved to the edge run there (the uplink does not wait
for a link that the plan gave up on).
Latency: input -> result produced (the service's last non-delivery task); delivery into the cloud
is store-and-forward and reported as ``delivery_lag``. Selectivities are seeded coin flips.
Costs come from the service definitions (gateway/taskgraphs/catalog.py).

    python -m bench.placement [--quick] [--seed N]   -> bench/results/placement.json
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import random
import statistics
from dataclasses import dataclass, field

from bench._common import Results
from gateway.placement.cost import Budgets, LinkView
from gateway.placement.link import LinkMonitor
from gateway.placement.planner import PlacementPlanner, plan_placement
from gateway.taskgraphs import (
    TaskGraph,
    camera_graph,
    sensor_graph,
    training_graph,
    vibration_graph,
)

PROBE_S = 5.0
CONFIRM_S = 1.0  # LinkProber's confirm_after_s: a suspect failure is re-probed this soon
REPLAN_S = 1.0  # PlacementController's check interval (placement.replan_interval_s)
FAST_PROBE_S = 1.0  # LinkProber's fast interval while the link is unsettled (interval / 5)
PROBE_JITTER = 0.25  # LinkProber's jitter: each interval is drawn from +-25 % of it
GOODPUT_EVERY = 2  # a payload probe of PROBE_BYTES at most every 2 probe intervals (LinkProber's)
PROBE_BYTES = 32 * 1024
EDGE_CORES = 2
BUDGETS = Budgets(uplink_Bps=250_000, edge_cores=EDGE_CORES, edge_cpu_share=0.8)

# (duration_s, kind, rtt_s, goodput_Bps[, flap_period_s]): a weakly connected farm link
TRACE = [
    (300, "up", 0.04, 1_000_000),
    (240, "slow", 0.35, 40_000),
    (240, "up", 0.05, 800_000),
    (180, "down", 0, 0),
    (240, "up", 0.04, 1_000_000),
    (180, "flap", 0.08, 500_000, 20.0),
    (300, "up", 0.04, 1_000_000),
    (120, "slow", 0.5, 25_000),
    (200, "up", 0.04, 1_000_000),
]


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    up: bool
    rtt_s: float
    goodput_Bps: float


def expand(trace: list[tuple], scale: float) -> list[Segment]:
    segs, t = [], 0.0
    for phase in trace:
        dur, kind, rtt, goodput = phase[0] * scale, phase[1], phase[2], phase[3]
        if kind == "flap":
            period, end, up = phase[4], t + dur, True
            while t < end:
                segs.append(Segment(t, min(end, t + period), up, rtt, goodput))
                t, up = min(end, t + period), not up
        else:
            segs.append(Segment(t, t + dur, kind != "down", rtt, goodput))
            t += dur
    return segs


class Link:
    def __init__(self, segs: list[Segment]) -> None:
        self.segs = segs
        self.starts = [s.start for s in segs]
        self.end = segs[-1].end

    def at(self, t: float) -> Segment:
        i = max(0, min(len(self.segs) - 1, bisect.bisect_right(self.starts, t) - 1))
        return self.segs[i]

    def next_up(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t) - 1
        while i < len(self.segs) and (i < 0 or not self.segs[i].up):
            i += 1
        return max(t, self.segs[i].start) if i < len(self.segs) else float("inf")

    def transmit(self, start: float, nbytes: float) -> float:
        """When ``nbytes`` sent from ``start`` are through (pausing while down, resuming after)."""
        t, left = start, nbytes
        while left > 0:
            t = self.next_up(t)
            if t == float("inf"):
                return t
            seg = self.at(t)
            if seg is self.segs[-1]:  # the last phase goes on past the trace's end (no endless loop)
                return t + left / seg.goodput_Bps
            can = (seg.end - t) * seg.goodput_Bps
            if can >= left:
                return t + left / seg.goodput_Bps
            left -= can
            t = seg.end
        return t


@dataclass
class Stats:
    latency: dict[str, list[float]] = field(default_factory=dict)
    delivery: dict[str, list[float]] = field(default_factory=dict)
    misses: dict[str, int] = field(default_factory=dict)
    uplink_bytes: float = 0.0
    replans: int = 0


class Sim:
    """One run of one system over the trace. ``placer(t)`` returns the plan side map to use at t."""

    def __init__(self, services: tuple[TaskGraph, ...], link: Link, system: str, seed: int) -> None:
        self.services, self.link, self.system = services, link, system
        self.rng = random.Random(seed)
        self.events: list = []
        self.seq = 0
        self.cpu_free = EDGE_CORES
        self.cpu_queue: list = []
        self.up_queue: list = []
        self.up_busy = False
        self.retry_pending = False
        self.stats = Stats()
        self.now = 0.0
        self.probe_rng = random.Random(seed + 1)  # apart from the inputs' draws: same inputs for all
        self.last_payload_at: float | None = None
        self.samples_seen = 0
        self.monitor = LinkMonitor(clock=lambda: self.now, alpha=0.5, window_s=120, prior_goodput_Bps=250_000)
        self.monitor.add_suspect_listener(self._confirm_soon)
        self.confirm_pending = False
        self.planner = PlacementPlanner(services, BUDGETS, clock=lambda: self.now)
        self.sides: dict[tuple[str, str], str] = {}

    # -- placement ----------------------------------------------------------------------------
    def _fixed(self, side: str) -> dict[tuple[str, str], str]:
        out = {}
        for s in self.services:
            pins = s.required_pins()
            for t in s.tasks:
                out[(s.name, t.name)] = pins.get(t.name, side)
        return out

    def _apply(self, plan) -> None:
        self.sides = {(s.name, t): side for s in plan.services for t, side in s.placement}

    def _oracle(self, seg: Segment) -> None:
        view = LinkView("up" if seg.up else "down", seg.rtt_s, max(seg.goodput_Bps, 1.0))
        self._apply(plan_placement(self.services, view, BUDGETS))

    # -- events -------------------------------------------------------------------------------
    def push(self, t: float, kind: str, *data) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, data))

    def run(self) -> Stats:
        for s in self.services:
            t = 0.0
            while True:
                t += self.rng.expovariate(s.rate_hz)
                if t >= self.link.end:
                    break
                self.push(t, "stage", s, 0, "edge", t)
        if self.system == "planner":
            self.push(0.0, "probe")
            for k in range(int(self.link.end / REPLAN_S)):
                self.push(k * REPLAN_S, "replan_check")  # after the probe at the same instant
        elif self.system == "oracle":
            for seg in self.link.segs:
                self.push(seg.start, "truth", seg)
        else:
            self.sides = self._fixed(self.system.split("-")[1])
        while self.events:
            self.now, _, kind, data = heapq.heappop(self.events)
            getattr(self, "_on_" + kind)(*data)
        return self.stats

    def _on_probe(self) -> None:
        seg = self.link.at(self.now)
        self.monitor.observe_probe(seg.rtt_s if seg.up else None)
        # As LinkProber.maybe_upload: a payload probe through the uplink when one is due, unless real
        # uploads measured goodput since the last one.
        due = self.last_payload_at is None or self.now - self.last_payload_at >= GOODPUT_EVERY * PROBE_S
        if seg.up and due:
            self.last_payload_at = self.now
            if self._payload_probe_needed():
                self._upload(None, 0, self.now, PROBE_BYTES, delivery=False)
        base = FAST_PROBE_S if self.monitor.unsettled else PROBE_S
        interval = base * (1 + PROBE_JITTER * self.probe_rng.uniform(-1, 1))
        if self.now + interval < self.link.end:
            self.push(self.now + interval, "probe")

    def _on_replan_check(self) -> None:
        plan = self.planner.update(self.monitor.snapshot().view())
        if plan is not None:
            self.stats.replans += 1
            self._apply(plan)
            self._reroute()

    def _confirm_soon(self) -> None:
        if not self.confirm_pending:
            self.confirm_pending = True
            self.push(self.now + CONFIRM_S, "confirm")

    def _on_confirm(self) -> None:
        self.confirm_pending = False
        seg = self.link.at(self.now)
        self.monitor.observe_probe(seg.rtt_s if seg.up else None)

    def _payload_probe_needed(self) -> bool:
        needed = self.monitor.large_goodput_samples == self.samples_seen
        self.samples_seen = self.monitor.large_goodput_samples
        return needed

    def _on_truth(self, seg: Segment) -> None:
        self.stats.replans += 1
        self._oracle(seg)
        self._reroute()

    def _on_stage(self, s: TaskGraph, i: int, loc: str, born: float) -> None:
        task = s.tasks[i]
        side = self.sides[(s.name, task.name)]
        if task.delivery:
            if loc == "edge":
                self._upload(s, i, born, s.tasks[i - 1].output_bytes, delivery=True)
            else:
                self.push(self.now, "done", s, i, "cloud", born)
            return
        if side != loc:
            size = s.tasks[i - 1].output_bytes
            if loc == "edge":
                self._upload(s, i, born, size, delivery=False)
            else:  # downlink: not the bottleneck, but it needs the link up
                seg = self.link.at(self.link.next_up(self.now))
                self.push(
                    self.link.next_up(self.now) + seg.rtt_s + size / seg.goodput_Bps,
                    "stage",
                    s,
                    i,
                    side,
                    born,
                )
            return
        if side == "cloud":
            self.push(self.now + task.cloud_cost_s, "done", s, i, "cloud", born)
        else:
            heapq.heappush(self.cpu_queue, (-s.priority, self.now, self.seq, s, i, born))
            self.seq += 1
            self._cpu_start()

    def _cpu_start(self) -> None:
        while self.cpu_free > 0 and self.cpu_queue:
            _, _, _, s, i, born = heapq.heappop(self.cpu_queue)
            self.cpu_free -= 1
            self.push(self.now + s.tasks[i].edge_cost_s, "cpu_done", s, i, born)

    def _on_cpu_done(self, s: TaskGraph, i: int, born: float) -> None:
        self.cpu_free += 1
        self._cpu_start()
        self._on_done(s, i, "edge", born)

    def _on_done(self, s: TaskGraph, i: int, loc: str, born: float) -> None:
        task = s.tasks[i]
        if task.delivery:
            self.stats.delivery.setdefault(s.name, []).append(self.now - born)
            return
        if self.rng.random() >= task.selectivity:
            return  # filtered out (no change in the frame, window not complete)
        nxt = s.tasks[i + 1]
        if nxt.delivery:  # the result exists now
            lat = self.now - born
            self.stats.latency.setdefault(s.name, []).append(lat)
            self.stats.misses[s.name] = self.stats.misses.get(s.name, 0) + (lat > s.latency_target_s)
        self.push(self.now, "stage", s, i + 1, loc, born)

    def _upload(self, s: TaskGraph | None, i: int, born: float, size: int, delivery: bool) -> None:
        """Queue an upload; ``s`` is None for a goodput probe (bytes on the wire, no task after)."""
        self.up_queue.append((s, i, born, size, delivery))
        self._up_start()

    def _up_start(self) -> None:
        if self.up_busy or not self.up_queue:
            return
        if not self.link.at(self.now).up:  # the uplink retries as soon as the link returns
            if not self.retry_pending:
                self.retry_pending = True
                self.push(self.link.next_up(self.now), "up_retry")
            return
        s, i, born, size, delivery = self.up_queue.pop(0)
        self.up_busy = True
        done = self.link.transmit(self.now, size)
        seg = self.link.at(self.now)
        if done > seg.end and not self.link.at(seg.end).up:  # the link dies under this upload
            self.push(seg.end, "up_fail", s, i, born, size, delivery, self.now)
        else:
            self.push(done, "up_done", s, i, born, size, self.now)

    def _on_up_retry(self) -> None:
        self.retry_pending = False
        self._up_start()

    def _on_up_fail(self, s, i, born, size, delivery, started) -> None:
        self.up_busy = False
        self.stats.uplink_bytes += (self.now - started) * self.link.at(started).goodput_Bps  # sent, then lost
        if self.system == "planner":
            self.monitor.observe_upload(size, self.now - started, ok=False)
        if s is not None:
            self.up_queue.insert(0, (s, i, born, size, delivery))  # still in the log: resent (or re-placed)
        self._up_start()

    def _reroute(self) -> None:
        """After a re-plan, work still waiting in the log for a cloud task runs at the edge if moved there."""
        keep = []
        for item in self.up_queue:
            s, i, born, _, delivery = item
            if s is not None and not delivery and self.sides[(s.name, s.tasks[i].name)] == "edge":
                self.push(self.now, "stage", s, i, "edge", born)
            else:
                keep.append(item)
        self.up_queue = keep

    def _on_up_done(self, s: TaskGraph | None, i: int, born: float, size: int, started: float) -> None:
        self.up_busy = False
        self.stats.uplink_bytes += size
        rtt = self.link.at(self.now).rtt_s
        if self.system == "planner":
            self.monitor.observe_upload(size, self.now - started + rtt, ok=True)
        if s is not None:  # a frame crosses as a blob, then its record: ``trips`` round trips
            self.push(self.now + rtt * s.tasks[i - 1].trips, "stage", s, i, "cloud", born)
        else:  # a goodput probe: as LinkProber, its own sample is not a real upload's
            self.samples_seen = self.monitor.large_goodput_samples
        self._up_start()


def bench_services() -> tuple[TaskGraph, ...]:
    """The mix: a Raspberry-Pi-class gateway (2 cores) and a GPU cloud (docs/placement.md, "Benchmark").

    sensor (10 Hz, cheap, p3), camera (1 fps, 10% of frames changed; inference 0.45 s on the edge
    CPU vs 0.02 s on a cloud GPU, p2), vibration (2 s audio windows; classifier 0.6 s vs 0.015 s,
    p2), training (private, one local round per 120 s, p1).
    """
    return (sensor_graph(), camera_graph(cloud_infer_s=0.02), vibration_graph(), training_graph())


def raw_bytes(services: tuple[TaskGraph, ...], duration: float) -> float:
    """Uploading everything raw: every source output, at its rate, for the whole trace."""
    return sum(s.output_rate_bytes(t.name) * duration for s in services for t in s.tasks if not t.after)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    scale = 0.5 if args.quick else 2.0
    services = bench_services()
    link = Link(expand(TRACE, scale))
    systems = ["planner", "always-edge", "always-cloud", "oracle"]
    results = {name: Sim(services, link, name, args.seed).run() for name in systems}

    def norm_mean(st: Stats) -> float:  # mean over services of mean(latency / target)
        return statistics.mean(statistics.mean(st.latency[s.name]) / s.latency_target_s for s in services)

    out = Results("placement", args.quick)
    print(f"trace {link.end:.0f} s, services {[s.name for s in services]}, seed {args.seed}")
    print(
        f"{'system':13} {'service':9} {'results':>7} {'mean_s':>9} {'p95_s':>9} {'misses':>7} {'deliv_s':>9}"
    )
    for name, st in results.items():
        for s in services:
            lat = sorted(st.latency.get(s.name, [float("nan")]))
            p95 = lat[int(0.95 * (len(lat) - 1))]
            dl = statistics.mean(st.delivery.get(s.name, [float("nan")]))
            print(
                f"{name:13} {s.name:9} {len(lat):7d} {statistics.mean(lat):9.3f} {p95:9.3f} "
                f"{st.misses.get(s.name, 0):7d} {dl:9.2f}"
            )
            for metric, value in (
                ("mean_latency_s", statistics.mean(lat)),
                ("p95_latency_s", p95),
                ("deadline_misses", st.misses.get(s.name, 0)),
                ("delivery_lag_s", dl),
            ):
                out.add(s.name, name, metric, value)
        out.add("mix", name, "mean_normalised_latency", norm_mean(st))
        out.add("mix", name, "uplink_bytes", st.uplink_bytes)
        out.add("mix", name, "replans", st.replans)
        print(
            f"{name:13} mix: normalised latency {norm_mean(st):.4f}, uplink {st.uplink_bytes / 1e6:.1f} MB, "
            f"replans {st.replans}"
        )
    raw = raw_bytes(services, link.end)
    out.add("mix", "raw-upload", "uplink_bytes", raw)
    ours = norm_mean(results["planner"])
    best_static = min(norm_mean(results["always-edge"]), norm_mean(results["always-cloud"]))
    out.ratios["latency_vs_best_static"] = best_static / ours
    out.ratios["latency_vs_oracle"] = norm_mean(results["oracle"]) / ours
    out.ratios["bytes_vs_raw"] = raw / results["planner"].uplink_bytes
    print(f"raw upload would send {raw / 1e6:.1f} MB")
    for k, v in out.ratios.items():
        print(f"{k}: {v:.2f}")
    out.write(table=False)


if __name__ == "__main__":
    main()
