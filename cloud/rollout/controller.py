"""RolloutController: cloudd's one owner task that watches canaries and rolls them back or on.

Every ``interval_s`` it reads each model name's lifecycle; for a name with a canary it combines the
heartbeat ``models`` figures of the canary gateways (only online gateways, only heartbeats received
after the canary started, only figures of the canary version) and the baseline, with what the gate
measured of the canary against that production (``Expected``; cloud/rollout/health.py), and acts
on the judgement: ``rollback`` (canary -> archived, the alias cleared, an event) or ``promote``
(canary -> production after the soak). A worse canary is thus rolled back within one heartbeat
interval plus ``interval_s`` of the heartbeat that shows it.

Invariants: only this task changes a lifecycle on its own account, and each change re-checks under
the registry's lock that the canary it judged is still the canary (an operator may have acted in
between); what it keeps is bounded: the last judgement per name that has a canary, and the figures
per (name, gateway) of the production version before a swap, at most ``MAX_REMEMBERED`` (the oldest
forgotten first, counted in ``counters["forgotten"]``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from cloud.fleet import FleetView, Seen, heartbeat_models
from cloud.registry import ModelRegistry
from cloud.rollout.health import Expected, Judgement, RolloutConfig, combine, judge
from cloud.rollout.lifecycle import Lifecycle
from cloud.rollout.transitions import promote_production, rollback
from protocol.fleet import is_online
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)
MAX_REMEMBERED = 4096
BY = "rollout-controller"


class RolloutController:
    def __init__(
        self,
        registry: ModelRegistry,
        fleet: FleetView,
        config: RolloutConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry, self.fleet, self.config, self.clock = registry, fleet, config, clock
        self.counters = {"ticks": 0, "rollbacks": 0, "promotions": 0, "errors": 0, "forgotten": 0}
        self.judgements: dict[str, dict[str, Any]] = {}
        self._before: dict[tuple[str, str], dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rollout-controller")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or a disk error: logged and counted, the next tick tries again
                self.counters["errors"] += 1
                log.exception("rollout: tick failed")

    async def tick(self) -> None:
        self.counters["ticks"] += 1
        latest = self.fleet.latest()
        names = await asyncio.to_thread(self.registry.names)
        for name in names:
            state = await asyncio.to_thread(self.registry.lifecycle, name)
            self._remember(name, state, latest)
            if state.canary is None:
                self.judgements.pop(name, None)
                continue
            entry = await asyncio.to_thread(self.registry.entry, name, state.canary.version)
            expected = Expected.from_evaluation(entry["evaluation"] if entry else None, state.production)
            judgement = self._judge(name, state, latest, expected)
            self.judgements[name] = {
                "version": state.canary.version,
                "ts": self.clock(),
                **judgement.to_json(),
            }
            if judgement.action != "wait":
                await self._act(name, state.canary.version, judgement)

    def _judge(
        self, name: str, state: Lifecycle, latest: dict[str, Seen], expected: Expected | None
    ) -> Judgement:
        canary = state.canary
        assert canary is not None
        reports: dict[str, dict[str, Any]] = {}
        now = self.clock()
        for gateway, seen in latest.items():
            if not is_online(seen.received_ts, seen.heartbeat.interval_s, now):
                continue  # an offline gateway's last figures describe nothing running now
            figures = heartbeat_models(seen.heartbeat).get(name)
            if figures is not None:
                reports[gateway] = figures | {"received_ts": seen.received_ts}
        on_canary = [
            r
            for g, r in reports.items()
            if g in canary.gateways
            and r.get("version") == canary.version
            and r["received_ts"] >= canary.started_ts
        ]
        on_production = [
            r for g, r in reports.items() if g not in canary.gateways and r.get("version") == state.production
        ]
        if not on_production:  # no production gateway reports: the canary gateways' own figures before
            on_production = [
                self._before[(name, g)]
                for g in canary.gateways
                if self._before.get((name, g), {}).get("version") == state.production
            ]
        baseline = combine(on_production) if on_production else None
        return judge(combine(on_canary), baseline, self.clock() - canary.started_ts, self.config, expected)

    async def _act(self, name: str, version: str, judgement: Judgement) -> None:
        now = self.clock()

        def change(state: Lifecycle) -> bool:
            if state.canary is None or state.canary.version != version:
                return False  # the operator acted since this judgement
            if judgement.action == "rollback":
                rollback(state, None, None, by=BY, now=now, reason=judgement.reason)
            else:  # gated when it became the canary (or forced then: the event says so again)
                entry = dict(self.registry.entry(name, version) or {"name": name, "version": version})
                promote_production(state, entry, force=True, by=BY, now=now, reason=judgement.reason)
            state.events[-1]["figures"] = judgement.to_json()
            return True

        if await self.registry.change_lifecycle(name, change):
            key = "rollbacks" if judgement.action == "rollback" else "promotions"
            self.counters[key] += 1
            log.info("rollout: %s@%s %s: %s", name, version, judgement.action, judgement.reason)

    def _remember(self, name: str, state: Lifecycle, latest: dict[str, Seen]) -> None:
        for gateway, seen in latest.items():
            figures = heartbeat_models(seen.heartbeat).get(name)
            if figures is None or figures.get("version") != state.production:
                continue
            key = (name, gateway)
            self._before.pop(key, None)  # re-inserted last: the dict's order is oldest first
            self._before[key] = figures
            while len(self._before) > MAX_REMEMBERED:
                del self._before[next(iter(self._before))]
                self.counters["forgotten"] += 1
