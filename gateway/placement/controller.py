"""PlacementController: one asyncio task that watches a LinkMonitor and re-plans through a planner.

Invariants: one owner starts and stops it; the first plan is made in ``start`` (so a started
controller always has a plan); ``before_check`` (the owner's refresh of the planner's inputs, e.g.
measured costs) runs before every check, the first included, in this task, and ``after_check`` after
it with the monitor's estimate and the view the check planned with (what follows the link between
plans: per-input dispatch);
``on_plan`` is called once per new plan, in order, from this task only; an exception in any of them is
logged and counted (``callback_errors``), never kills the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from gateway.placement.cost import LinkView
from gateway.placement.link import LinkEstimate, LinkMonitor
from gateway.placement.plan import Plan
from gateway.placement.planner import PlacementPlanner
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

OnPlan = Callable[[Plan], Awaitable[None] | None]


class PlacementController:
    def __init__(
        self,
        planner: PlacementPlanner,
        monitor: LinkMonitor,
        on_plan: OnPlan | None = None,
        *,
        interval_s: float = 1.0,
        default_rtt_s: float = 0.1,
        before_check: Callable[[], None] | None = None,
        after_check: Callable[[LinkEstimate, LinkView], None] | None = None,
    ) -> None:
        self.planner = planner
        self._monitor = monitor
        self._on_plan = on_plan
        self._before_check = before_check
        self._after_check = after_check
        self._interval = interval_s
        self._default_rtt = default_rtt_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.callback_errors = 0

    @property
    def plan(self) -> Plan | None:
        return self.planner.current

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("PlacementController already started")
        await self.check()
        self._task = asyncio.create_task(self._run(), name="placement-controller")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def poke(self) -> None:
        """Check now rather than at the next interval (e.g. after pins changed)."""
        self._wake.set()

    async def check(self) -> Plan | None:
        if self._before_check is not None:
            try:
                self._before_check()
            except Exception:
                self.callback_errors += 1
                log.exception("placement: before_check failed; planning with the inputs it had")
        estimate = self._monitor.snapshot()
        view = estimate.view(self._default_rtt)
        plan = self.planner.update(view)
        if plan is not None:
            log.info("placement %s", self.planner.decisions[-1].to_text())
            if self._on_plan is not None:
                try:
                    result = self._on_plan(plan)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    self.callback_errors += 1
                    log.exception("on_plan callback failed for plan v%d", plan.version)
        if self._after_check is not None:
            try:
                self._after_check(estimate, view)
            except Exception:
                self.callback_errors += 1
                log.exception("placement: after_check failed")
        return plan

    async def _run(self) -> None:
        while True:
            await wait_event(self._wake, self._interval)
            self._wake.clear()
            await self.check()
