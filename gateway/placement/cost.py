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
- A flapping link is seen through its up fraction: goodput scaled by it, and each crossing waits for
  the link: an input finds it down the down fraction of the time, and then waits half a down stretch
  on average, so ``(1 - up) x longest_down_s / 2`` (the monitor's longest down stretch in its window:
  the conservative one), or ``(1 - up) x flap_penalty_s`` before a down stretch was measured. Paid
  once per crossing, not per round trip: the trips of one crossing go in the same up window. (Seen on
  the live trace, 2 s up / 3 s down: frames inferred in the cloud 1.0 s after capture; the old model,
  ``flap_penalty_s`` per round trip, predicted 6 s and kept them on an edge that took 3.4 s.)
- A link back from down may drop again soon (a flapping link before it is recognised as one). A task
  in the cloud then hands the inputs of the last ``handback_window_s`` (the time to call the link
  down) back to the edge at once, and on a saturated edge that burst queues behind the model for the
  rest of the phase (seen on the live trace: 3.6 s a frame while flapping against always-edge's
  0.7 s). So while a returning link *settles* (``return_settle_factor`` times its longest down
  stretch in the monitor's window, at most ``return_settle_max_s``, since it came back) a service
  with tasks in the cloud pays ``drop_risk`` (1 at the return, falling linearly to 0 once settled)
  times its burst's delay: the work of its tasks that would come back (``Option.handback_cpu`` x
  ``handback_window_s``), over the edge cores, times ``qf`` of the edge with every service's
  returning tasks back on it.
  Cheap on an edge with room (a camera at 0.1 frame/s adds ~0.1 s), prohibitive on a saturated one.
- Bytes cost something too (a metered, shared link): the score adds ``byte_weight`` x uplink bytes/s
  over the operator's uplink budget (divided by the up fraction when flapping: bytes sent on a
  flapping link are often sent twice), so equal-latency placements prefer the one that sends less.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
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
    up_for_s: float = math.inf  # since the link last came back from down (inf: no return seen)
    longest_down_s: float = 0.0  # the longest down stretch that ended in the monitor's window


@dataclass(frozen=True)
class Budgets:
    uplink_Bps: float = 250_000.0  # what the operator lets us send (a metered link)
    edge_cores: float = 1.0  # cores the services may use on the gateway
    edge_cpu_share: float = 0.8  # of those cores: keep headroom for ingest, the log, the uplink
    max_link_utilisation: float = 0.8  # of the measured goodput
    flap_penalty_s: float = 5.0  # expected wait for a flapping link, per crossing, at 0% up, until measured
    byte_weight: float = 1.0  # score of sending the whole uplink budget, in units of one latency target
    flapping: FlappingPolicy = "model"
    return_settle_factor: float = 1.5  # an up link settles for this x its longest recent down stretch
    return_settle_max_s: float = 15.0  # ... but no longer (a long outage is not a flapping link)
    handback_window_s: float = 2.0  # inputs sent to the cloud after a drop, until it is called down

    def __post_init__(self) -> None:
        for name in ("uplink_Bps", "edge_cores", "edge_cpu_share", "max_link_utilisation"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Budgets.{name} must be > 0")
        settle = (self.return_settle_factor, self.return_settle_max_s, self.handback_window_s)
        if min(self.byte_weight, self.flap_penalty_s, *settle) < 0:
            raise ValueError(
                "Budgets.byte_weight, flap_penalty_s, return_settle_factor, return_settle_max_s and "
                "handback_window_s must be >= 0"
            )
        if self.flapping not in get_args(FlappingPolicy):
            raise ValueError("Budgets.flapping must be 'edge' or 'model'")


@dataclass(frozen=True)
class EffectiveLink:
    rtt_s: float
    goodput_Bps: float
    uplink_limit_Bps: float
    up_fraction: float = 1.0
    drop_risk: float = 0.0  # of a returning link (``drop_risk``), weighting the hand-back
    handback_window_s: float = 0.0
    wait_s: float = 0.0  # a crossing's expected wait for a flapping link to be up


def effective_link(link: LinkView, budgets: Budgets) -> EffectiveLink:
    up = min(max(link.up_fraction, 0.0), 1.0) if link.state == "flapping" else 1.0
    goodput = max(link.goodput_Bps * up, 1.0)
    return EffectiveLink(
        link.rtt_s,
        goodput,
        min(budgets.uplink_Bps, goodput * budgets.max_link_utilisation),
        max(up, 0.05),
        drop_risk(link, budgets),
        budgets.handback_window_s,
        (1.0 - up) * (link.longest_down_s / 2 if link.longest_down_s > 0 else budgets.flap_penalty_s),
    )


def settle_s(link: LinkView, budgets: Budgets) -> float:
    """How long an up link back from down settles: ``return_settle_factor`` x the longest down
    stretch of the monitor's window, at most ``return_settle_max_s``; 0 for a link that is not up
    (down and flapping have their own rules) or had no down stretch in the window."""
    if link.state != "up" or link.longest_down_s <= 0:
        return 0.0
    return min(budgets.return_settle_factor * link.longest_down_s, budgets.return_settle_max_s)


def drop_risk(link: LinkView, budgets: Budgets) -> float:
    """The weight of a drop of a returning link: 1 as it comes back, falling linearly to 0 as it
    settles (``settle_s``), 0 once settled."""
    settle = settle_s(link, budgets)
    return max(0.0, 1.0 - link.up_for_s / settle) if settle > 0 else 0.0


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
    handback_cpu: float = 0.0  # edge CPU of its cloud tasks that come back to the edge if the link drops

    def side(self, task: str) -> Side:
        return self.sides[[t.name for t in self.service.tasks].index(task)]


def make_option(service: TaskGraph, sides: Sequence[Side], pinned: Collection[str] = ()) -> Option:
    """``pinned``: the service's tasks (by name) pinned where they are; they stay if the link drops."""
    sides = tuple(sides)
    where = dict(zip((t.name for t in service.tasks), sides, strict=True))
    cpu = sum(service.input_rate(t.name) * t.edge_cost_s for t in service.tasks if where[t.name] == "edge")
    handback = sum(
        service.input_rate(t.name) * t.edge_cost_s
        for t in service.tasks
        if where[t.name] == "cloud" and not t.delivery and t.pin is None and t.name not in pinned
    )
    up = 0.0
    for t in service.tasks:
        if where[t.name] == "edge" and any(where[s] == "cloud" for s in service.successors(t.name)):
            up += service.output_rate_bytes(t.name)
    return Option(service, sides, cpu, up, handback)


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
                crossing = (
                    link.rtt_s * service.task(p).trips + link.wait_s + size / link.goodput_Bps * qf_link
                )
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


def handback_delay_s(
    option: Option, options: Sequence[Option], link: EffectiveLink, budgets: Budgets
) -> float:
    """The expected delay a returning link's drop would add to ``option``'s results: ``drop_risk``
    x the burst of its own work handed back (``handback_window_s`` of its ``handback_cpu``) over the
    edge cores, queued on an edge that runs every option's returning tasks too (module docstring).
    0 while the link is settled or nothing of ``option`` would come back."""
    if link.drop_risk <= 0 or option.handback_cpu <= 0:
        return 0.0
    back = sum(o.edge_cpu + o.handback_cpu for o in options) / budgets.edge_cores
    burst_s = option.handback_cpu * link.handback_window_s / budgets.edge_cores
    return min(link.drop_risk * burst_s * queue_factor(back), LATENCY_CAP_S)


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
    lat = tuple(
        min(option_latency(o, link, qf_e, qf_l) + handback_delay_s(o, options, link, budgets), LATENCY_CAP_S)
        for o in options
    )
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
