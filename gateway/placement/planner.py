"""The placement planner: ``plan_placement`` (pure) and ``PlacementPlanner`` (hysteresis + decision log).

Invariants:
- ``plan_placement`` is a pure function of (services, link view, budgets, pins): it honours every
  pin, puts every unpinned task at the edge when the link is down, and also while a link flaps
  (policy ``"edge"``) as long as that fits the edge CPU budget; otherwise it returns the best
  placement ``search.choose`` finds (exact for small graphs), with a returning link's risk of
  dropping again priced in (``cost.drop_risk``).
- ``PlacementPlanner`` evaluates a new placement only when the link leaves the hysteresis band
  around the estimate of its last evaluation, when the link state changes, when a returning link
  starts or ends settling, when the services' figures are revised (measured costs), or when pins,
  budgets or services change. A *new plan version* is made only when the placement changes, the
  link state changes or something was forced (pins, budgets, ``set_services``; never a revision);
  an evaluation that finds the same placement, or one whose predicted gain over the current
  placement (both scored on the new estimates) is under ``Hysteresis.switch_gain``, keeps the
  current plan (``plans_kept`` counts it) and only moves the band's basis: on a link whose round
  trip wanders around a task's break-even point the task does not move back and forth for nothing.
  The end of a returning link's settling is treated as a change of state (no ``switch_gain``).
  Each new version appends one ``Decision`` to a bounded log (evictions counted).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence

from gateway.placement.cost import (
    Budgets,
    EffectiveLink,
    LinkView,
    Option,
    drop_risk,
    effective_link,
    evaluate,
    make_option,
    option_latency,
    queue_factor,
    settle_s,
)
from gateway.placement.pins import PinError, Pins, check_pins, pins_for
from gateway.placement.plan import Decision, Plan, ServicePlan, moves_between, placement_strings
from gateway.placement.search import choose, service_options
from gateway.placement.triggers import Hysteresis, kB_s, replan_trigger, settle_trigger
from gateway.taskgraphs.graph import Side, TaskGraph

log = logging.getLogger(__name__)


def plan_placement(
    services: Sequence[TaskGraph],
    link: LinkView,
    budgets: Budgets,
    pins: Pins | None = None,
    *,
    version: int = 1,
    made_at: float = 0.0,
) -> Plan:
    pins = dict(pins or {})
    errors = check_pins(services, pins)
    if errors:
        raise PinError("; ".join(errors))
    eff = effective_link(link, budgets)
    reasons = [
        f"link {link.state}: rtt {link.rtt_s * 1000:.1f} ms, goodput {kB_s(link.goodput_Bps)}, "
        f"up {link.up_fraction:.0%}"
    ]
    reasons += [f"pinned by operator: {k}@{v}" for k, v in sorted(pins.items())]
    reasons += [
        f"private: {s.name} raw data stays on the gateway ({', '.join(s.raw_consumers())} at the edge)"
        for s in services
        if s.private
    ]
    per_service_pins = [pins_for(s, pins) for s in services]

    if link.state == "down":
        options = [
            make_option(s, [p.get(t.name, "edge") for t in s.tasks])
            for s, p in zip(services, per_service_pins, strict=True)
        ]
        cpu = sum(o.edge_cpu for o in options) / budgets.edge_cores
        backlog = sum(o.uplink_Bps for o in options)
        reasons.append(
            f"link down: all unpinned tasks at the edge; results wait in the log "
            f"(backlog grows {kB_s(backlog)})"
        )
        if cpu > budgets.edge_cpu_share:
            reasons.append(
                f"edge CPU over budget while down: {cpu:.2f} > {budgets.edge_cpu_share:.2f} of "
                f"{budgets.edge_cores:g} cores; work queues"
            )
        # With no link, a result is ready when the edge has computed it; a service with a task the
        # operator pinned to the cloud has no result until the link returns (latency None).
        qf = queue_factor(cpu)
        plans = tuple(
            ServicePlan(
                o.service.name,
                o.service.priority,
                o.service.latency_target_s,
                _down_latency(o, eff, qf),
                o.edge_cpu,
                o.uplink_Bps,
                _placement(o.service, o.sides),
            )
            for o in options
        )
        return Plan(version, made_at, link, "link-down", plans, cpu, backlog, 0.0, tuple(reasons))

    option_lists, methods = [], []
    for s, p in zip(services, per_service_pins, strict=True):
        opts, method = service_options(s, p, eff, budgets)
        option_lists.append(opts)
        methods.append(method)
    chosen, ev, method = None, None, ""
    if eff.drop_risk > 0:
        reasons.append(
            f"link back {link.up_for_s:.1f} s after a down stretch of {link.longest_down_s:.1f} s: tasks"
            f" in the cloud priced with handing their inputs back to the edge if it drops again (risk"
            f" {eff.drop_risk:.2f}, settled in {settle_s(link, budgets) - link.up_for_s:.1f} s)"
        )
    if link.state == "flapping":
        reasons.append(
            f"link flapping (up {link.up_fraction:.0%}): predicting with goodput {kB_s(eff.goodput_Bps)},"
            f" rtt {eff.rtt_s * 1000:.0f} ms and a wait of {eff.wait_s:.2f} s per crossing (down stretches"
            f" of up to {link.longest_down_s:.1f} s)"
        )
        if budgets.flapping == "edge":
            at_edge = [
                make_option(s, [p.get(t.name, "edge") for t in s.tasks], p)
                for s, p in zip(services, per_service_pins, strict=True)
            ]
            ev = evaluate(at_edge, eff, budgets)
            if ev.violation == 0:
                chosen, method = tuple(at_edge), "flapping-edge"
                reasons.append(
                    "flapping policy 'edge': all unpinned tasks at the edge, uploads when the link is up"
                )
            else:
                reasons.append("flapping policy 'edge' does not fit the edge CPU budget: searching instead")
    if chosen is None or ev is None:
        chosen, ev, method = choose(option_lists, eff, budgets)
    reasons += [
        f"{s.name}: {len(s.tasks)} tasks, heuristic candidates (cut points + hill climb)"
        for s, m in zip(services, methods, strict=True)
        if m == "heuristic"
    ]
    if method in ("exact", "descent"):
        reasons += _binding_reasons(option_lists, ev, eff, budgets)
    plans = tuple(
        ServicePlan(
            o.service.name,
            o.service.priority,
            o.service.latency_target_s,
            lat,
            o.edge_cpu,
            o.uplink_Bps,
            _placement(o.service, o.sides),
        )
        for o, lat in zip(chosen, ev.latencies_s, strict=True)
    )
    for sp in plans:
        if sp.latency_s is not None and sp.latency_s > sp.target_s:
            higher = [p.name for p in plans if p.priority > sp.priority and p.meets_target]
            who = f"; capacity kept for higher priority {', '.join(higher)}" if higher else ""
            reasons.append(
                f"{sp.name} misses its target: predicted {sp.latency_s:.3g} s > {sp.target_s:g} s{who}"
            )
    return Plan(
        version,
        made_at,
        link,
        method,
        plans,
        ev.edge_utilisation,
        ev.uplink_Bps,
        eff.uplink_limit_Bps,
        tuple(reasons),
    )


def _down_latency(option: Option, eff: EffectiveLink, qf_edge: float) -> float | None:
    delivery = set(option.service.delivery_tasks())
    if any(
        side == "cloud" and t.name not in delivery
        for t, side in zip(option.service.tasks, option.sides, strict=True)
    ):
        return None
    return option_latency(option, eff, qf_edge, 1.0)


def _placement(service: TaskGraph, sides: Sequence[Side]) -> tuple[tuple[str, Side], ...]:
    return tuple(zip((t.name for t in service.tasks), sides, strict=True))


def _binding_reasons(option_lists, ev, eff, budgets: Budgets) -> list[str]:
    """Which budget bound: compare with the placement that would be chosen without budgets."""
    unbounded = dataclasses.replace(budgets, edge_cpu_share=1.0, max_link_utilisation=1.0)
    free_eff = dataclasses.replace(eff, uplink_limit_Bps=math.inf)
    free_choice, free_ev, _ = choose(option_lists, free_eff, unbounded)
    reasons = []
    if ev.violation > 0:
        reasons.append(
            f"no placement fits the budgets: least violation chosen (edge CPU {ev.edge_utilisation:.2f}"
            f" of {budgets.edge_cpu_share:.2f}, uplink {kB_s(ev.uplink_Bps)} of {kB_s(eff.uplink_limit_Bps)})"
        )
    full = evaluate(free_choice, eff, budgets)
    if full.uplink_Bps > eff.uplink_limit_Bps:
        src = (
            "operator budget"
            if eff.uplink_limit_Bps >= budgets.uplink_Bps
            else f"{budgets.max_link_utilisation:.0%} of goodput"
        )
        reasons.append(
            f"uplink binds: fastest placement needs {kB_s(full.uplink_Bps)} > limit "
            f"{kB_s(eff.uplink_limit_Bps)} ({src})"
        )
    if full.edge_utilisation > budgets.edge_cpu_share:
        reasons.append(
            f"edge CPU binds: fastest placement needs {full.edge_utilisation:.2f} > "
            f"{budgets.edge_cpu_share:.2f} of {budgets.edge_cores:g} cores"
        )
    if budgets.byte_weight > 0:
        latency_only = dataclasses.replace(budgets, byte_weight=0.0)
        fast, fast_ev, _ = choose(option_lists, eff, latency_only)
        if (
            fast_ev.score[:2] == ev.score[:2]
            and fast_ev.uplink_Bps > ev.uplink_Bps * 1.01
            and fast_ev.normalised_latency < ev.normalised_latency
        ):
            reasons.append(
                f"byte cost (weight {budgets.byte_weight:g}) chose a placement sending "
                f"{kB_s(fast_ev.uplink_Bps - ev.uplink_Bps)} less at a small latency cost"
            )
    if free_ev.score[1:] == ev.score[1:] and not reasons:
        reasons.append("no budget binds: best placement for latency and bytes chosen")
    return reasons


class PlacementPlanner:
    """Holds the current plan, decides when to re-plan, and logs each decision with its reasons."""

    def __init__(
        self,
        services: Sequence[TaskGraph],
        budgets: Budgets | None = None,
        *,
        hysteresis: Hysteresis | None = None,
        pins: Pins | None = None,
        clock: Callable[[], float] = time.monotonic,
        log_size: int = 256,
    ) -> None:
        self._services = tuple(services)
        self._budgets = budgets or Budgets()
        self._band = hysteresis or Hysteresis()
        self._pins: dict[str, Side] = {}
        self._clock = clock
        self._forced: str | None = None
        self._revised: str | None = None  # why the services' figures changed since the last evaluation
        self.current: Plan | None = None
        # The link of the last evaluation: the current plan's, or a newer one that found the same plan.
        self.basis: LinkView | None = None
        self.plans_kept = 0
        self.decisions: deque[Decision] = deque(maxlen=log_size)
        self.decisions_dropped = 0
        if pins:
            self.set_pins(pins)

    @property
    def pins(self) -> dict[str, Side]:
        return dict(self._pins)

    def set_pins(self, pins: Pins) -> None:
        """Replace the operator pins (validated whole: a bad pin raises PinError and changes nothing)."""
        errors = check_pins(self._services, pins)
        if errors:
            raise PinError("; ".join(errors))
        self._pins = dict(pins)
        self._forced = "pins changed"

    def set_budgets(self, budgets: Budgets) -> None:
        self._budgets = budgets
        self._forced = "budgets changed"

    def set_services(self, services: Sequence[TaskGraph]) -> None:
        errors = check_pins(services, self._pins)
        if errors:
            raise PinError("; ".join(errors))
        self._services = tuple(services)
        self._forced = "services changed"

    def revise_services(self, services: Sequence[TaskGraph], reason: str) -> None:
        """New figures for the services (measured costs, rates, sizes): the next ``update`` evaluates
        the placement again, but makes a new version only if a task moves (else ``plans_kept``).
        Pins are checked as in ``set_services`` (PinError, nothing changed)."""
        errors = check_pins(services, self._pins)
        if errors:
            raise PinError("; ".join(errors))
        self._services = tuple(services)
        self._revised = reason

    def update(self, link: LinkView) -> Plan | None:
        """Re-plan if the link left the band or the services were revised (or something was forced);
        return a new plan or None.

        None also when the evaluation found the placement the current plan already has, in the same
        link state: an estimate or a figure that moved without changing the answer is not a new plan."""
        if self.current is None or self.basis is None:
            return self.replan(link, "first plan")
        if self._forced is not None:
            return self.replan(link, self._forced)
        settling = settle_trigger(self.basis, link, self._budgets)
        moved = (replan_trigger(self.basis, link, self._band), settling, self._revised)
        trigger = "; ".join(t for t in moved if t)
        if not trigger:
            return None
        candidate = self._plan(link, self.current.version + 1)
        # The end of a returning link's settling lifts a price, as a change of state does: the plan
        # it allows is adopted without switch_gain (a move held back by the price may gain little).
        settled = settling is not None and drop_risk(link, self._budgets) == 0
        if link.state == self.current.link.state and (
            candidate.placement_key() == self.current.placement_key()
            or not (settled or self._worth_moving(candidate))
        ):
            self.basis = link
            self._revised = None
            self.plans_kept += 1
            log.debug("placement kept v%d (%s): no move worth making", self.current.version, trigger)
            return None
        return self._adopt(candidate, trigger)

    def _worth_moving(self, candidate: Plan) -> bool:
        """Whether ``candidate`` beats the current placement, scored on the candidate's estimates,
        by fewer budget violations or missed targets, or by ``switch_gain`` of latency and bytes."""
        assert self.current is not None
        try:
            now = self._score(self.current, candidate.link)
        except KeyError:  # the services changed since: the current placement cannot be scored
            return True
        new = self._score(candidate, candidate.link)
        return new[:-1] < now[:-1] or (new[:-1] == now[:-1] and new[-1] < now[-1] - self._band.switch_gain)

    def _score(self, plan: Plan, link: LinkView) -> tuple:
        options = [
            make_option(s, [plan.side(s.name, t.name) for t in s.tasks], pins_for(s, self._pins))
            for s in self._services
        ]
        return evaluate(options, effective_link(link, self._budgets), self._budgets).score

    def replan(self, link: LinkView, trigger: str) -> Plan:
        """A new plan version now, whatever it places (first plan, forced, or a caller's decision)."""
        version = 1 if self.current is None else self.current.version + 1
        return self._adopt(self._plan(link, version), trigger)

    def cloud_input_s(self, service: str, task: str, link: LinkView) -> float | None:
        """The predicted latency of one input of ``service`` with ``task`` and every task after it in
        the cloud, the others where the current plan has them, on ``link`` with the current plan's
        uplink traffic (execution.py's ``InputDispatch``); None while the link is down or before a
        plan."""
        if link.state == "down" or self.current is None:
            return None
        graph = next(s for s in self._services if s.name == service)
        in_cloud: set[str] = set()
        for t in graph.tasks:  # topological order
            if t.name == task or any(before in in_cloud for before in t.after):
                in_cloud.add(t.name)
        sides = ["cloud" if t.name in in_cloud else self.current.side(service, t.name) for t in graph.tasks]
        eff = effective_link(link, self._budgets)
        qf_link = queue_factor(self.current.uplink_Bps / eff.goodput_Bps)
        return option_latency(make_option(graph, sides), eff, 1.0, qf_link)

    def _plan(self, link: LinkView, version: int) -> Plan:
        return plan_placement(
            self._services, link, self._budgets, self._pins, version=version, made_at=self._clock()
        )

    def _adopt(self, plan: Plan, trigger: str) -> Plan:
        if len(self.decisions) == self.decisions.maxlen:
            self.decisions_dropped += 1
        self.decisions.append(
            Decision(
                plan.made_at,
                plan.version,
                trigger,
                plan.link.state,
                moves_between(self.current, plan),
                plan.reasons,
                placement_strings(plan),
            )
        )
        self.current = plan
        self.basis = plan.link
        self._forced = self._revised = None
        return plan
