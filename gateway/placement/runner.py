"""PlacementRunner: the daemon's placement subsystem, built from ``PlacementConfig``.

Owns the LinkProber and the PlacementController (the LinkMonitor is made by ``make_monitor`` so
the uplink can feed it before this starts). Start order: prober, then controller (whose first
plan is made in its ``start``); stop in reverse. ``sides`` (a ``PlannedSides``) is updated with
each new plan before ``on_plan`` is called: the owners of the placed services read it there
(execution.py). After every check, with ``dispatch_inputs``, the figures each input of a per-input
service (the camera) is dispatched by are set there too (``InputDispatch``), unless the operator pinned
its task.

Costs: ``costs`` (a ``MeasuredGraphs``) holds the graphs the planner plans with: the catalog's, with
the edge costs the config declares, and what the measurement sources (``add_measurement_source``:
the camera runner's, when a camera runs) measure. With ``measure_costs`` the controller's task polls
the sources before each check; values that left their band revise the planner's services, which
makes a new plan version only if a task moves.

Invariant: ``status()`` always reflects the planner's current plan, its last decisions and the
costs in force; a new pin set (the control plane's, through ``GatewayRunner.set_placement_pins``)
is validated whole by the planner first, so a bad pin raises ``PinError`` and changes nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.placement.controller import OnPlan, PlacementController
from gateway.placement.cost import Budgets, LinkView
from gateway.placement.execution import PER_INPUT, InputDispatch, PlannedSides
from gateway.placement.link import LinkEstimate, LinkMonitor
from gateway.placement.plan import Plan
from gateway.placement.planner import Hysteresis, PlacementPlanner
from gateway.placement.probe import LinkProber
from gateway.ratelimit import RateLimitedLog
from gateway.taskgraphs import TaskGraph, default_graphs
from gateway.taskgraphs.measured import MeasuredGraphs, Quantity
from protocol.config import PlacementConfig

log = logging.getLogger(__name__)

MeasurementSource = Callable[[], Mapping[Quantity, float]]  # what a subsystem measures now


def make_monitor(config: PlacementConfig) -> LinkMonitor:
    return LinkMonitor(
        alpha=config.alpha,
        window_s=config.window_s,
        down_after_failures=config.down_after_failures,
        flap_transitions=config.flap_transitions,
        settle_factor=config.settle_factor,
        shift_ratio=config.shift_ratio,
        prior_goodput_Bps=config.prior_goodput_Bps,
    )


def budgets_from(config: PlacementConfig) -> Budgets:
    return Budgets(
        uplink_Bps=config.uplink_budget_Bps,
        edge_cores=config.edge_cores,
        edge_cpu_share=config.edge_cpu_share,
        max_link_utilisation=config.max_link_utilisation,
        flap_penalty_s=config.flap_penalty_s,
        byte_weight=config.byte_weight,
        flapping=config.flapping,
        return_settle_factor=config.return_settle_factor,
        return_settle_max_s=config.return_settle_max_s,
        handback_window_s=config.handback_window_s,
    )


def hysteresis_from(config: PlacementConfig) -> Hysteresis:
    return Hysteresis(
        rtt_ratio=config.rtt_ratio,
        rtt_floor_s=config.rtt_floor_s,
        goodput_ratio=config.goodput_ratio,
        up_fraction_delta=config.up_fraction_delta,
        switch_gain=config.switch_gain,
    )


class PlacementRunner:
    def __init__(
        self,
        config: PlacementConfig,
        cloud_url: str,
        monitor: LinkMonitor,
        on_plan: OnPlan | None = None,
        services: tuple[TaskGraph, ...] | None = None,
    ) -> None:
        self.config = config
        self.monitor = monitor
        self.costs = MeasuredGraphs(  # CostError if a declared cost names no task
            services or default_graphs(),
            config.edge_costs,
            band_ratio=config.cost_band_ratio,
            measure=config.measure_costs,
        )
        graphs = self.costs.graphs
        self._sources: list[MeasurementSource] = []
        self.source_errors = 0
        self._warn = RateLimitedLog(log)
        self.sides = PlannedSides(graphs)
        self._on_plan = on_plan
        self.planner = PlacementPlanner(
            graphs,
            budgets_from(config),
            hysteresis=hysteresis_from(config),
            pins=dict(config.pins),
        )
        base = cloud_url.rstrip("/")
        self.prober = LinkProber(
            monitor,
            base + config.probe_path,
            interval_s=config.probe_interval_s,
            timeout_s=config.probe_timeout_s,
            goodput_url=None if config.goodput_path is None else base + config.goodput_path,
            payload_bytes=config.payload_bytes,
            goodput_every=config.goodput_every,
            upload_timeout_s=max(config.probe_timeout_s, 10.0),
            confirm_after_s=config.confirm_after_s,
        )
        self.controller = PlacementController(
            self.planner,
            monitor,
            self._new_plan,
            interval_s=config.replan_interval_s,
            before_check=self._poll_costs,
            after_check=self._set_dispatch,
        )
        monitor.add_listener(lambda _up: self.controller.poke())  # up/down re-plans now, not at the next tick
        monitor.add_suspect_listener(self.controller.poke)  # a failing link: dispatch nothing to it now
        self._started: list[str] = []

    def add_measurement_source(self, source: MeasurementSource) -> None:
        """Polled before each check (with ``measure_costs``); add them before ``start``."""
        self._sources.append(source)

    def _poll_costs(self) -> None:
        """Offer what the sources measure now; revise the planner's services if a value moved."""
        if not self.costs.measure or not self._sources:
            return
        measured: dict[Quantity, float] = {}
        for source in self._sources:
            try:
                measured.update(source())
            except Exception as exc:  # one broken source must not stop planning with the others
                self.source_errors += 1
                self._warn.warning("source", "placement: a measurement source failed: %r", exc)
        moved = self.costs.offer(measured)
        if moved:
            self.planner.revise_services(self.costs.graphs, "costs: " + ", ".join(moved))
            log.info("placement: costs in force now %s", ", ".join(moved))

    def _set_dispatch(self, estimate: LinkEstimate, link: LinkView) -> None:
        """Per-input dispatch from this check's link (execution.py's ``InputDispatch``)."""
        failing = link.state == "down" or estimate.consecutive_failures > 0
        planned = {g.name for g in self.costs.graphs}
        for service, task in PER_INPUT.items():
            if service not in planned:
                continue
            dispatch, name = None, f"{service}/{task}"
            if self.config.dispatch_inputs and name not in self.planner.pins:
                cloud_s = self.planner.cloud_input_s(service, task, link)
                dispatch = InputDispatch(cloud_s, failing, self.config.edge_costs.get(name))
            self.sides.set_dispatch(service, dispatch)

    async def _new_plan(self, plan: Plan) -> None:
        self.sides.update(plan)
        if self._on_plan is not None:
            result = self._on_plan(plan)
            if inspect.isawaitable(result):
                await result

    async def start(self) -> None:
        await self.prober.start()
        self._started.append("prober")
        await self.controller.start()
        self._started.append("controller")

    async def stop(self) -> None:
        for name in reversed(self._started):
            await (self.controller.stop() if name == "controller" else self.prober.stop())
        self._started.clear()

    def status(self) -> dict[str, Any]:
        plan = self.planner.current
        decisions = list(self.planner.decisions)[-self.config.decisions_in_status :]
        link = dataclasses.asdict(self.monitor.snapshot())
        return {
            "plan": None if plan is None else plan.to_dict(),
            "decisions": [d.to_dict() for d in decisions],
            "decisions_total": plan.version if plan is not None else 0,
            "decisions_dropped": self.planner.decisions_dropped,
            # For tests and benches: plan versions made (= decisions_total), evaluations that kept the
            # plan, and flapping as the monitor saw it, on this process's time.monotonic() (`now`).
            "plan_versions": plan.version if plan is not None else 0,
            "plans_kept": self.planner.plans_kept,
            "flapping_since": self.monitor.flapping_since,
            "first_flapping_at": self.monitor.first_flapping_at,
            "flapping_episodes": self.monitor.flapping_episodes,
            "estimate_restarts": self.monitor.estimate_restarts,
            "now": time.monotonic(),
            "pins": self.planner.pins,
            "link": link,
            "probes": self.prober.probes,
            "probe_failures": self.prober.failures,
            "callback_errors": self.controller.callback_errors,
            "sides": self.sides.to_dict(),
            "sides_changes": self.sides.changes,
            "dispatch": self.sides.dispatch_status(),
            "costs": {**self.costs.status(), "source_errors": self.source_errors},
        }
