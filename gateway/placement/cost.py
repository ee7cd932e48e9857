"""The placement cost model: pure functions from (services, placement, link, budgets) to predictions.

Invariant: nothing here has state or does I/O; the same inputs give the same numbers.

Model (units: seconds, bytes, cores):
- A task at the edge takes ``edge_cost_s * qf(rho_edge)`` per input, where ``rho_edge`` is the edge
  CPU utilisation of the whole plan (all services share the gateway) and ``qf(rho) = 1 + rho/(2(1-rho))``
  is the M/D/1 waiting factor; in the cloud it takes ``cloud_cost_s`` (the cloud is not the bottleneck).
- An output crossing from one side to the other costs ``trips x rtt + output_bytes / goodput *
  qf(rho_link)``; ``trips`` is the task's (2 for a frame: the uplink sends a blob before the record
  that references it; the live trace's frames on a 300 ms link took ~3 s to reach the cloud's model,
  where one round trip predicted 0.8 s)
  (an acknowledged upload: one round trip plus the transfer, slowed by the queue on the link).
- A service's latency is the critical path of its DAG from the source to its results (the tasks
  feeding only *delivery* tasks): store-and-forward into the cloud costs uplink bytes, not latency.
- Loads: edge CPU = sum of input rate x edge cost over edge tasks; uplink = bytes/s of every edge
  output that has a consumer in the cloud (uploaded once however many consumers it has).
- A flapping link is seen through its up fraction: goodput scaled by it, and each crossing pays
  ``flap_penalty_s`` times the down fraction (the expected wait for the link to come back).
- Bytes cost something too (a metered, shared link): the score adds ``byte_weight`` x uplink bytes/s
  over the operator's uplink budget (divided by the up fraction when flapping: bytes sent on a
  flapping link are often sent twice), so equal-latency placements prefer the one that sends less.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from gateway.taskgraphs.graph import Side, TaskGraph
from protocol.config import FlappingPolicy

LinkState = Literal["up", "down", "flapping"]
LINK_STATES: tuple[LinkState, ...] = get_args(LinkState)
LATENCY_CAP_S = 1e6  # stands in for "never" (a saturated queue) so that scores stay comparable


@dataclass(frozen=True)
class LinkView:
    """What the planner believes about the link (from LinkMonitor, or the truth for an oracle)."""

    state: LinkState
    rtt_s: float
    goodput_Bps: float
    up_fraction: float = 1.0


@dataclass(frozen=True)
class Budgets:
    uplink_Bps: float = 250_000.0  # what the operator lets us send (a metered link)
    edge_cores: float = 1.0  # cores the services may use on the gateway
    edge_cpu_share: float = 0.8  # of those cores: keep headroom for ingest, the log, the uplink
    max_link_utilisation: float = 0.8  # of the measured goodput
    flap_penalty_s: float = 5.0  # expected wait for a flapping link, per crossing, at 0% up
    byte_weight: float = 1.0  # score of sending the whole uplink budget, in units of one latency target
    flapping: FlappingPolicy = "edge"

    def __post_init__(self) -> None:
        for name in ("uplink_Bps", "edge_cores", "edge_cpu_share", "max_link_utilisation"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Budgets.{name} must be > 0")
        if self.byte_weight < 0 or self.flap_penalty_s < 0:
            raise ValueError("Budgets.byte_weight and flap_penalty_s must be >= 0")
        if self.flapping not in get_args(FlappingPolicy):
            raise ValueError("Budgets.flapping must be 'edge' or 'model'")


@dataclass(frozen=True)
class EffectiveLink:
    rtt_s: float
    goodput_Bps: float
    uplink_limit_Bps: float
    up_fraction: float = 1.0


def effective_link(link: LinkView, budgets: Budgets) -> EffectiveLink:
    up = min(max(link.up_fraction, 0.0), 1.0) if link.state == "flapping" else 1.0
    goodput = max(link.goodput_Bps * up, 1.0)
    rtt = link.rtt_s + (1.0 - up) * budgets.flap_penalty_s
    return EffectiveLink(
        rtt, goodput, min(budgets.uplink_Bps, goodput * budgets.max_link_utilisation), max(up, 0.05)
    )


def queue_factor(rho: float) -> float:
    """M/D/1 mean sojourn over service time; infinite at or past saturation."""
    return math.inf if rho >= 1.0 else 1.0 + rho / (2.0 * (1.0 - rho))


@dataclass(frozen=True)
class Option:
    """One placement of one service's tasks (``sides`` aligned with ``service.tasks``) and its loads."""

    service: TaskGraph
    sides: tuple[Side, ...]
    edge_cpu: float
    uplink_Bps: float

    def side(self, task: str) -> Side:
        return self.sides[[t.name for t in self.service.tasks].index(task)]


def make_option(service: TaskGraph, sides: Sequence[Side]) -> Option:
    sides = tuple(sides)
    where = dict(zip((t.name for t in service.tasks), sides, strict=True))
    cpu = sum(service.input_rate(t.name) * t.edge_cost_s for t in service.tasks if where[t.name] == "edge")
    up = 0.0
    for t in service.tasks:
        if where[t.name] == "edge" and any(where[s] == "cloud" for s in service.successors(t.name)):
            up += service.output_rate_bytes(t.name)
    return Option(service, sides, cpu, up)


def option_latency(option: Option, link: EffectiveLink, qf_edge: float, qf_link: float) -> float:
    """Critical-path latency of one input through the service under this placement."""
    service = option.service
    where = dict(zip((t.name for t in service.tasks), option.sides, strict=True))
    finish: dict[str, float] = {}
    for t in service.tasks:
        start = 0.0
        for p in t.after:
            crossing = 0.0
            if where[p] != where[t.name]:
                size = service.task(p).output_bytes
                crossing = link.rtt_s * service.task(p).trips + size / link.goodput_Bps * qf_link
            start = max(start, finish[p] + crossing)
        compute = t.edge_cost_s * qf_edge if where[t.name] == "edge" else t.cloud_cost_s
        finish[t.name] = start + compute
    delivery = set(service.delivery_tasks())
    results = [
        t.name
        for t in service.tasks
        if t.name not in delivery and all(s in delivery for s in service.successors(t.name))
    ]
    latency = max(finish[r] for r in results)
    return min(latency, LATENCY_CAP_S) if not math.isnan(latency) else LATENCY_CAP_S


@dataclass(frozen=True)
class Evaluation:
    latencies_s: tuple[float, ...]
    edge_utilisation: float  # of the usable cores (edge_cores)
    uplink_Bps: float
    violation: float  # 0 when within both budgets
    misses: tuple[int, ...]  # missed targets per priority, highest priority first
    normalised_latency: float  # sum of latency / target
    byte_cost: float  # byte_weight x uplink / budget (/ up fraction)
    score: tuple


def evaluate(options: Sequence[Option], link: EffectiveLink, budgets: Budgets) -> Evaluation:
    """Predict every service's latency under a joint placement; ``score`` orders placements.

    Lower score is better: first stay within the budgets, then miss fewer targets of higher
    priority (lexicographic by priority), then the smallest sum of latency / target plus byte cost.
    """
    cpu = sum(o.edge_cpu for o in options)
    up = sum(o.uplink_Bps for o in options)
    rho_edge = cpu / budgets.edge_cores
    qf_e, qf_l = queue_factor(rho_edge), queue_factor(up / link.goodput_Bps)
    lat = tuple(option_latency(o, link, qf_e, qf_l) for o in options)
    violation = (
        max(0.0, rho_edge - budgets.edge_cpu_share) / budgets.edge_cpu_share
        + max(0.0, up - link.uplink_limit_Bps) / link.uplink_limit_Bps
    )
    priorities = sorted({o.service.priority for o in options}, reverse=True)
    misses = tuple(
        sum(
            1
            for o, lt in zip(options, lat, strict=True)
            if o.service.priority == p and lt > o.service.latency_target_s
        )
        for p in priorities
    )
    norm = sum(lt / o.service.latency_target_s for o, lt in zip(options, lat, strict=True))
    byte_cost = budgets.byte_weight * up / budgets.uplink_Bps / link.up_fraction
    violation = round(violation, 12)
    return Evaluation(
        lat, rho_edge, up, violation, misses, norm, byte_cost, (violation, misses, norm + byte_cost)
    )
