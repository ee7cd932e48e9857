"""Heartbeats to cloudd (``POST /v1/gateways/<gw>/heartbeat``): the gateway's backlog, its link
estimate, where its tasks run, the state of each service (``degraded`` or ``failed`` with the
error, as the control plane shows it) and each model it runs with its live figures (``models``:
gateway/camera/figures.py), every ``interval_s``, for the cloud's fleet view and rollout controller.

Invariant: one owner task. A heartbeat that fails is counted and not retried: the next one, one
interval later, carries newer figures, and cloudd calls the gateway offline only after three
intervals without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from gateway.control.handlers import Applied
from gateway.placement.link import LinkEstimate
from gateway.placement.plan import Plan
from protocol.fleet import GatewayCounters, GatewayHeartbeat, PlacementDecision, ServiceHealth
from protocol.fleet import LinkEstimate as HeartbeatLink
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def heartbeat_link(estimate: LinkEstimate) -> HeartbeatLink:
    return HeartbeatLink(
        up=estimate.state != "down",
        rtt_ms=None if estimate.rtt_s is None else estimate.rtt_s * 1000,
        bandwidth_bps=estimate.goodput_Bps * 8 if estimate.goodput_measured else None,
        availability=estimate.up_fraction,
    )


def heartbeat_placement(plan: Plan | None) -> list[PlacementDecision]:
    if plan is None:
        return []
    reason = "; ".join(plan.reasons)[:200]
    return [
        PlacementDecision(
            service=s.name, task=task, where="gateway" if side == "edge" else "cloud", reason=reason
        )
        for s in plan.services
        for task, side in s.placement
    ]


def heartbeat_services(states: dict[str, Applied]) -> list[ServiceHealth]:
    """Each service's state; a long detail is cut to what the heartbeat carries."""
    return [ServiceHealth(service=s, state=a.state, detail=a.detail[:300]) for s, a in states.items()]


def heartbeat_counters(
    log_stats: dict[str, Any], rejected: Mapping[str, int], uplink: Mapping[str, float]
) -> GatewayCounters:
    """The log's disk use and budget, refusals by reason and the uplink's counters, as sent (the
    64 of each a heartbeat may carry; numbers only)."""
    numbers = {k: float(v) for k, v in uplink.items() if isinstance(v, int | float) and v >= 0}
    return GatewayCounters(
        log_bytes=int(log_stats["bytes_used"]),
        log_budget_bytes=log_stats.get("max_bytes"),
        rejected=dict(list(rejected.items())[:64]),
        uplink=dict(list(numbers.items())[:64]),
    )


class HeartbeatSender:
    def __init__(
        self,
        gateway_id: str,
        cloud_url: str,
        token: str | None,
        interval_s: float,
        describe: Callable[[], dict[str, Any]],
        timeout_s: float = 5.0,
    ) -> None:
        """``describe()`` returns the heartbeat's changing fields: backlog_records, backlog_bytes,
        link, placement, services, models, counters (see protocol/fleet.py)."""
        self._url = f"{cloud_url.rstrip('/')}/v1/gateways/{gateway_id}/heartbeat"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.gateway_id = gateway_id
        self.interval_s = interval_s
        self._describe = describe
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._task: asyncio.Task[None] | None = None
        self.counters = {"sent": 0, "failed": 0}

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def body(self) -> bytes:
        beat = GatewayHeartbeat(
            gateway=self.gateway_id, sent_ts=time.time(), interval_s=self.interval_s, **self._describe()
        )
        # no models: the field is left out, so a cloudd that predates it accepts the heartbeat
        return beat.model_dump_json(exclude=None if beat.models else {"models"}).encode()

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            while True:
                await self._send(session)
                await asyncio.sleep(self.interval_s)

    async def _send(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.post(self._url, data=self.body(), headers=self._headers) as response:
                if response.status == 200:
                    self.counters["sent"] += 1
                    return
                detail = (await response.text())[:200]
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            detail = str(exc) or type(exc).__name__
        self.counters["failed"] += 1
        log.debug("heartbeat to %s failed: %s", self._url, detail)
