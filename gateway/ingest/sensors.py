"""Sensor ingest: device telemetry from MQTT into the log, acknowledged only once it is durable.

Owns two tasks: *intake* (takes the messages the MQTT adapter has queued, a batch at a time, judges
them (gateway/ingest/judge.py), appends accepted ones to the log, and runs the sensor service's edge
tasks on them: gateway/ingest/windows.py) and *flusher* (closes a log epoch every
``flush_interval_ms``, or sooner when many messages wait, and acknowledges that epoch's messages, in
one write, once the log says it is durable). No task and no lock per message: a batch costs one
turn of the loop, an epoch one write of PUBACKs.

Invariant (the ack rule, docs/architecture.md): a QoS 1 message is acknowledged to the broker only
after the epoch holding its record is durable, and acks go out in arrival order. Rejected messages
are queued for ack in the same order as accepted ones, so they are acked with the epoch they
arrived in. A record refused because the log is full is rejected ("log_full") and still acked:
policy "reject" refuses new data, loudly and counted. Nothing a device sends stops the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.ingest.device_stats import DeviceStats
from gateway.ingest.judge import Judge, Verdict
from gateway.ingest.recent_samples import RecentSamples
from gateway.ingest.windows import SensorWindows
from gateway.mqtt.adapter import InboundMessage, MqttAdapter
from gateway.placement.execution import ServiceSides
from gateway.ratelimit import RateLimitedLog
from gateway.storage.interface import LogCorrupted, LogFailed, LogFull, RecordLog
from protocol.derived import SensorParams
from protocol.topics import devices_subscription
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

EAGER_FLUSH_MESSAGES = 1000  # close the epoch early when this many messages wait for their ack
INTAKE_BATCH = 1000  # messages judged and appended per turn of the intake, at most
WINDOW_TICK_S = 0.25  # how often, at most, silent devices' windows are checked for closing
DURABILITY_WARN_S = 30.0  # an fsync slower than this is logged (and waited for again)
REJECT_REASONS = (
    "unknown_topic",
    "unknown_device",
    "too_large",
    "not_json",
    "invalid",
    "device_mismatch",
    "log_full",
)


class SensorIngest:
    def __init__(
        self,
        adapter: MqttAdapter,
        record_log: RecordLog,
        gateway_id: str,
        allow: Sequence[str],
        flush_interval_ms: int,
        on_durable: Callable[[], None] = lambda: None,
        on_fatal: Callable[[BaseException], None] = lambda exc: None,
        clock: Callable[[], float] = time.time,
        sensor_params: SensorParams | None = None,
        sides: Callable[[], ServiceSides] = lambda: ServiceSides.edge("sensor"),
    ) -> None:
        self._adapter = adapter
        self._log = record_log
        self.gateway_id = gateway_id
        self._judge = Judge(gateway_id, allow)
        self._interval_s = flush_interval_ms / 1000
        self._on_durable = on_durable
        self._on_fatal = on_fatal
        self._clock = clock
        self._awaiting_ack: list[InboundMessage] = []  # arrival order; appended to after the log append
        self._appended_since_flush = 0
        self._flush_now = asyncio.Event()
        self._stopping = False
        self._failed = False
        self._intake: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._warn = RateLimitedLog(log)
        self.accepted = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self.acked = 0
        self.epochs = 0
        self.redelivered = 0  # samples already in the log, delivered again by the broker
        self.devices = DeviceStats()  # who sent what, allowed or not (devices.list)
        self._recent = RecentSamples()
        self.windows = SensorWindows(record_log, gateway_id, sensor_params or SensorParams(), sides, clock)
        self._last_tick = 0.0

    def set_allow(self, allow: Sequence[str]) -> None:
        """Replace the device allow-list (glob patterns); takes effect from the next batch."""
        self._judge.set_allow(allow)

    async def start(self) -> None:
        newest = max(self._log.trimmed_lsn + 1, self._log.durable_lsn - self._recent.capacity + 1)
        try:
            seeded = await self._recent.seed(self._log.read(newest))
        except LogCorrupted as exc:  # the log counts and reports it; samples past it may come twice
            log.warning("ingest: recent samples not all known from the log: %s", exc)
            seeded = len(self._recent)
        log.info("ingest: %d recent samples known from the log (redeliveries of them are skipped)", seeded)
        await self._run_windows(self.windows.follow)  # the start marker, before any telemetry
        self._adapter.subscribe(devices_subscription(self.gateway_id), qos=1)
        self._intake = asyncio.create_task(self._intake_loop(), name="ingest-intake")
        self._flusher = asyncio.create_task(self._flusher_loop(), name="ingest-flusher")

    async def stop(self) -> None:
        """Stop taking messages at once, then flush and ack what was taken.

        The caller bounds it (runtime/shutdown.py); cut short, what is not yet acked stays unacked.
        Messages that reach the adapter from now on are never taken nor acked: the broker redelivers
        them to the next run. The subscription stays, so the broker keeps queueing for the session
        while the gateway is down (an UNSUBSCRIBE would make it drop what devices publish meanwhile).
        """
        await cancel_and_wait(self._intake)
        self._intake = None
        log.info("ingest: intake stopped; %d messages to flush and ack", len(self._awaiting_ack))
        await self._run_windows(self.windows.close)  # the open windows end with this run
        self._stopping = True
        self._flush_now.set()
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            await flusher  # a deadline around stop() cancels it with the caller: nothing more is acked

    # --- intake ----------------------------------------------------------------------------------

    async def _intake_loop(self) -> None:
        while True:
            batch = await self._adapter.receive_batch(WINDOW_TICK_S, INTAKE_BATCH)
            await self._run_windows(self.windows.follow)  # a new plan: switch before this input
            if batch:
                await self._take(batch)
                await asyncio.sleep(0)  # the flusher, the reader and the rest get a turn between batches
            if self._clock() - self._last_tick >= WINDOW_TICK_S:
                self._last_tick = self._clock()
                await self._run_windows(self.windows.tick)

    async def _run_windows(self, step: Callable[[], Awaitable[int]]) -> None:
        """Run one step of the sensor windows; what it appends is made durable with the next epoch."""
        if self._failed:
            return
        try:
            self._appended_since_flush += await step()
        except LogFailed as exc:
            self._fail(exc)

    async def _take(self, batch: list[InboundMessage]) -> None:
        """Judge a batch (one receive time for all: they were read together), append its records,
        then queue each message for its ack, in arrival order."""
        received_ts = self._clock()
        for message, verdict in zip(batch, self._judge.judge_batch(batch, received_ts), strict=True):
            outcome: str | None = None  # for the device's figures: accepted, redelivered or the reason
            if verdict.sample in self._recent:
                self.redelivered += 1  # already durable or in the open epoch: ack it with this epoch
                outcome = "redelivered"
            elif verdict.record is not None and not self._failed:
                try:
                    lsn = await self._log.append(verdict.record)
                except LogFull as exc:
                    verdict = Verdict(
                        None, "log_full", f"log full, policy reject: {exc}", device=verdict.device
                    )
                except LogFailed as exc:
                    self._fail(exc)
                    return  # this message and the rest of the batch: never acked, the broker keeps them
                else:
                    self.accepted += 1
                    outcome = "accepted"
                    self._appended_since_flush += 1
                    assert verdict.sample is not None and verdict.telemetry is not None, "a record's Verdict"
                    self._recent.remember(verdict.sample)
                    await self._observe(lsn, verdict.sample[0], received_ts, verdict.telemetry)
            if verdict.reason is not None:
                self.rejected[verdict.reason] = self.rejected.get(verdict.reason, 0) + 1
                self._warn.warning(
                    verdict.reason, "ingest: rejected (%s): %s", verdict.reason, verdict.detail
                )
                outcome = outcome or verdict.reason
            if outcome is not None:  # None: the log has failed, this message is not taken
                self.devices.record_device(verdict.device, received_ts, outcome)
            self._awaiting_ack.append(message)
        if len(self._awaiting_ack) >= EAGER_FLUSH_MESSAGES:
            self._flush_now.set()

    async def _observe(self, lsn: int, device: str, received_ts: float, telemetry: dict[str, Any]) -> None:
        """The windows see a record just appended (``_run_windows`` without a step made per message)."""
        try:
            self._appended_since_flush += await self.windows.observe(lsn, device, received_ts, telemetry)
        except LogFailed as exc:
            self._fail(exc)

    # --- flusher ---------------------------------------------------------------------------------

    async def _flusher_loop(self) -> None:
        while not self._stopping:
            await wait_event(self._flush_now, self._interval_s)
            self._flush_now.clear()
            if self._awaiting_ack or self._appended_since_flush:
                await self._flush_and_ack()
        await self._flush_and_ack()  # the last epoch, at shutdown

    async def _flush_and_ack(self) -> None:
        if self._failed:
            return
        # Take the ack list before closing the epoch: every message in it has its record (if any)
        # in this epoch or an earlier one, so acking after durability can never run ahead of it.
        to_ack, self._awaiting_ack = self._awaiting_ack, []
        appended, self._appended_since_flush = self._appended_since_flush, 0
        try:
            epoch = await self._log.flush()
            while True:
                try:
                    async with asyncio.timeout(DURABILITY_WARN_S):
                        await asyncio.shield(epoch.durable)
                    break
                except TimeoutError:
                    log.warning(
                        "ingest: epoch %d not durable after %.0fs (slow disk?)",
                        epoch.number,
                        DURABILITY_WARN_S,
                    )
        except LogFailed as exc:
            self._fail(exc)
            return
        self.epochs += 1
        self.acked += self._adapter.ack_many(to_ack)  # one write for the epoch's PUBACKs
        if appended:
            self._on_durable()

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            log.critical("ingest: the log failed (%s); nothing more is acknowledged", exc)
            self._on_fatal(exc)

    def stats(self) -> dict[str, int]:
        # rejections per reason are exported separately (a labelled counter), so no total here
        return {
            "accepted": self.accepted,
            "acked": self.acked,
            "redelivered": self.redelivered,
            "epochs": self.epochs,
            "awaiting_ack": len(self._awaiting_ack),
            "windows_open": len(self.windows.book),
            **{f"window_{name}": value for name, value in self.windows.counters.items()},
        }
