"""The fleet load as data, and what its measurements come to (the driver is bench/_fleet_load.py).

A ``FleetPlan`` says how many gateways, how their records come (``backlog_batches`` already in
each log when the stages begin, as an outage leaves them; then each ``Stage``'s pace) and where
they go. A worker's ``WorkerReport`` holds what it measured, with wall-clock ends so that the
workers' events line up. The figures are pure functions of plan and reports:

- a paced stage (``batch_every_s``): over its window after a warm-up, batches cloudd stored per
  second (answered 200), records per second, the batch POST's p50/p99, heartbeats' p99;
- the backlog (``drain_figures``): batches stored per second while the fleet drains it, between
  the 10th and the 90th percentile of its acknowledgements (the ramp-up and the last stragglers
  left out), with the same latencies over that span: the rate a fleet that has more to send than
  cloudd takes gets, i.e. cloudd's capacity;
- ``verify_exactly_once``: what cloudd stored against what the gateways appended.

Invariant: a batch counts as stored only when its POST was answered with a ``BatchAck`` (kind
"ok"); a 503 ``busy`` is a refusal, counted apart (``refused``).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    name: str
    seconds: float
    batch_every_s: float | None  # each gateway appends one batch of records this often; None: none


@dataclass(frozen=True)
class FleetPlan:
    url: str
    gateways: int
    stages: tuple[Stage, ...]
    records_per_batch: int = 50
    backlog_batches: int = 0  # batches in each gateway's log when the stages begin
    heartbeat_every_s: float = 15.0  # gatewayd's default (uplink.heartbeat_interval_s)
    processes: int = 4
    token_format: str = "token-{gateway}"
    # tmpfs where there is one: the driver must not spend the disk cloudd stores on
    log_root: str = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    drain_s: float = 300.0

    def __post_init__(self) -> None:
        if min(self.gateways, self.processes, self.records_per_batch) < 1 or self.backlog_batches < 0:
            raise ValueError("gateways, processes, records_per_batch >= 1 and backlog_batches >= 0, please")
        for stage in self.stages:
            if stage.seconds <= 0 or (stage.batch_every_s is not None and stage.batch_every_s <= 0):
                raise ValueError(f"stage {stage.name!r}: seconds and batch_every_s must be > 0")
        if not self.stages and not self.backlog_batches:
            raise ValueError("a fleet plan with no stages and no backlog sends nothing")

    def gateway_ids(self) -> tuple[str, ...]:
        return fleet_gateways(self.gateways)


def fleet_gateways(count: int) -> tuple[str, ...]:
    """The gateway ids of a fleet of ``count`` (cloudd must hold a token for each)."""
    return tuple(f"fleet{i:04d}" for i in range(count))


@dataclass
class WorkerReport:
    """What one worker process measured."""

    started: float = 0.0  # wall clock when its stages began
    ended: float = 0.0  # wall clock when its gateways had all drained
    cpu_s: float = 0.0  # its CPU (user + system) from ``started`` to ``ended``
    batches: list[tuple[float, float, str]] = field(default_factory=list)  # (end, seconds, outcome kind)
    heartbeats: list[tuple[float, float, int]] = field(default_factory=list)  # (end, seconds, status)
    heartbeats_skipped: int = 0
    appended: dict[str, tuple[str, int]] = field(default_factory=dict)  # gateway -> (log_id, last LSN)
    failures: dict[str, int] = field(default_factory=dict)  # the uplinks' failures by kind
    behind: list[str] = field(default_factory=list)  # gateways not drained at the deadline


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; nan when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _span(plan: FleetPlan, reports: list[WorkerReport], lo: float, hi: float) -> dict[str, float]:
    batches = [(s, kind) for r in reports for end, s, kind in r.batches if lo <= end < hi]
    beats = [(s, status) for r in reports for end, s, status in r.heartbeats if lo <= end < hi]
    stored_ms = [s * 1000 for s, kind in batches if kind == "ok"]
    return {
        "batches_per_s": len(stored_ms) / (hi - lo),
        "records_per_s": len(stored_ms) * plan.records_per_batch / (hi - lo),
        "refused_per_s": sum(1 for _, kind in batches if kind != "ok") / (hi - lo),
        "batch_p50_ms": percentile(stored_ms, 0.50),
        "batch_p99_ms": percentile(stored_ms, 0.99),
        "heartbeat_p99_ms": percentile([s * 1000 for s, status in beats if status == 200], 0.99),
        "heartbeats_failed": float(sum(1 for _, status in beats if status != 200)),
    }


def stage_windows(
    plan: FleetPlan, reports: list[WorkerReport], warmup_s: float
) -> dict[str, tuple[float, float]]:
    """Each paced stage's window (wall clock): after ``warmup_s`` (at most half the stage) to its end."""
    windows, start = {}, min(r.started for r in reports)
    for stage in plan.stages:
        if stage.batch_every_s is not None:
            windows[stage.name] = (start + min(warmup_s, stage.seconds / 2), start + stage.seconds)
        start += stage.seconds
    return windows


def stage_figures(
    plan: FleetPlan, reports: list[WorkerReport], warmup_s: float
) -> dict[str, dict[str, float]]:
    """Per paced stage, over its window (``stage_windows``)."""
    paces = {stage.name: stage.batch_every_s for stage in plan.stages}
    figures = {}
    for name, (lo, hi) in stage_windows(plan, reports, warmup_s).items():
        period = paces[name]
        assert period is not None  # stage_windows gives paced stages only
        offered = {"offered_batches_per_s": plan.gateways / period}
        figures[name] = {**offered, **_span(plan, reports, lo, hi)}
    return figures


def drain_figures(plan: FleetPlan, reports: list[WorkerReport]) -> dict[str, float]:
    """The backlog's drain, between its 10th and 90th percentile acknowledgement. The stages before
    the first paced one are the drain's; it must be over by their end (or the paced stage would
    measure the backlog's queue)."""
    until = min(r.started for r in reports)
    for stage in plan.stages:
        if stage.batch_every_s is not None:
            break
        until += stage.seconds
    else:
        until = float("inf")
    stored = sorted(end for r in reports for end, _, kind in r.batches if kind == "ok" and end < until)
    backlog = plan.gateways * plan.backlog_batches
    if backlog < 10 or len(stored) < backlog:
        raise ValueError(f"{len(stored)} of a backlog of {backlog} batches stored before the paced stage")
    lo, hi = stored[len(stored) // 10], stored[len(stored) * 9 // 10]
    return {"backlog_batches": float(backlog), **_span(plan, reports, lo, hi)}


def driver_cpu(reports: list[WorkerReport]) -> dict[str, float]:
    """The driver's own CPU from the start to the drain: seconds, and cores' worth."""
    seconds = sum(r.cpu_s for r in reports)
    wall = max(r.ended for r in reports) - min(r.started for r in reports)
    return {"driver_cpu_s": seconds, "driver_cores": seconds / wall if wall > 0 else float("nan")}


def verify_exactly_once(
    reports: list[WorkerReport], stored: Iterable[tuple[str, str, int]]
) -> dict[str, int]:
    """Compare ``stored`` (gateway, log id, LSN of each record cloudd holds) with what the gateways
    appended: every appended record once, none missing, nothing else of theirs."""
    expected = {gw: entry for r in reports for gw, entry in r.appended.items()}
    counts = Counter(key for key in stored if key[0] in expected)
    missing = sum(
        1
        for gw, (log_id, last) in expected.items()
        for lsn in range(1, last + 1)
        if (gw, log_id, lsn) not in counts
    )
    return {
        "appended": sum(last for _, last in expected.values()),
        "stored": sum(counts.values()),
        "missing": missing,
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "unexpected": sum(
            n for (gw, log_id, lsn), n in counts.items() if log_id != expected[gw][0] or lsn > expected[gw][1]
        ),
    }
