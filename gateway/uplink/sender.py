"""Store-and-forward to the cloud: one task reads the log, sends batches, trims what the cloud stored.

Invariant: a record leaves the log only when the cloud acknowledged it, and a batch is retried until
the cloud answers 200 with a matching ``BatchAck``, so nothing is ever dropped on the way up. The
books (what to send next, what was acknowledged, the trim, drops and damage) are ledger.py's; a
batch on the wire (blobs, then records; abandoned when the link returns; stalls) is wire.py's; this
module runs the loop: the pipeline of batches in flight, the retries and back-off, the producers'
hooks. Batches may carry non-contiguous LSNs (in increasing order); the cloud keeps LSN intervals,
so a batch re-sent after a restart stores nothing twice.

Draining (docs/gateway.md, "Uplink drain"): what to send next, the live tail or the backlog (alerts,
then summaries, then raw data) or both in one batch, is chooser.py's.

Pipeline: while backlog batches are in flight, the next backlog batch is chosen and sent beside
them, up to ``in_flight_batches`` at once, so that a long round trip (a frame's blobs, then its
records) is not paid once per batch. A batch with live records goes alone (the live tail is in one
batch at a time). A batch sent beside an alert batch uploads its blobs at once but POSTs its records
only once the alert batch was acknowledged (and not at all if it failed): the cloud stores every
alert before anything sent after it. After a failure the uplink lets what is in flight finish, then
backs off; a failed batch's records go back to the backlog (a retransmit of a batch the cloud did
store is a duplicate it acknowledges).

Short up windows: a batch that failed on the link (refused, timed out) is retried after at most
``OUTAGE_RETRY_MAX_S`` (jittered), whatever the link monitor says, so a link that is up for two
seconds carries data in them; a retry also happens at once when the monitor sees the link come
back (``link_changed``). Other failures back off exponentially up to ``backoff_max_s``; a 503 with
a ``Retry-After`` waits at least that long (up to twice it, jittered); a 401/403 backs off to the
maximum at once (an operator must fix the token) and a 400 is logged with the
cloud's own words. An optional token bucket caps the uplink's bandwidth (blobs and batches share
it). Each POST's result is a value (outcome.py's ``Outcome``).

Producers that hold records out of the log until they can go at once (the camera's frames for the
cloud, gateway/camera/handoff.py) register with ``add_before_batch``: their hook appends what they
hold before the uplink chooses its next batch, but only while the uplink is not backing off from a
failure (a record that cannot leave is better held where its producer can take it back), and for at
most ``PRODUCER_WAIT_S``: a log that makes the append wait (full under policy "hold", a slow disk)
waits for the uplink to trim, so the uplink gives up on the hook and sends (the producer keeps what
it had not appended).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from gateway.ratelimit import RateLimitedLog
from gateway.storage.interface import RecordLog
from gateway.uplink.blobs import BlobSpool, BlobUploader
from gateway.uplink.chooser import Batch, BatchChooser, Limits
from gateway.uplink.drain import TokenBucket
from gateway.uplink.ledger import UplinkLedger
from gateway.uplink.outcome import FAILURE_KINDS, LINK_FAILURES, AnswerObserver, Outcome, UploadObserver
from gateway.uplink.wire import BatchWire
from protocol.config import UplinkConfig
from runtime.backoff import Backoff
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

IDLE_WAKE_S = 5.0  # look at the log at least this often even without a wake-up
PRODUCER_WAIT_S = 1.0  # longest a before-batch hook may hold the uplink (module docstring)
OUTAGE_RETRY_MAX_S = 1.0  # longest wait after a link failure: a short up window is never slept through
UplinkState = Literal["idle", "sending", "backoff", "corrupt", "stopped"]  # /status "uplink.state"
PIPELINED = ("alert", "summary", "raw")  # sources of batches another backlog batch may be sent beside


def read_token(token: str | None, token_file: Path | None) -> str | None:
    if token is not None:
        return token
    if token_file is not None:
        return Path(token_file).read_text().strip()
    return None


def _may_pipeline(batch: Batch) -> bool:
    """Whether another backlog batch may be sent beside ``batch`` (module docstring)."""
    return batch.source in PIPELINED and not batch.live


class Uplink:
    def __init__(
        self,
        record_log: RecordLog,
        gateway_id: str,
        config: UplinkConfig,
        rng: random.Random | None = None,
        *,
        monitor: UploadObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
        blob_spool: BlobSpool | None = None,
        on_answer: AnswerObserver | None = None,
    ) -> None:
        self.gateway_id = gateway_id
        self._config = config
        self._token = read_token(config.token, config.token_file)
        self._retry = Backoff(config.backoff_initial_s, config.backoff_max_s, rng)
        self._rng = rng or random.Random()
        outage_max = min(config.backoff_max_s, OUTAGE_RETRY_MAX_S)
        self._outage_retry = Backoff(min(config.backoff_initial_s, outage_max), outage_max, rng)
        bucket = TokenBucket(config.bandwidth_cap_Bps, config.bandwidth_burst_bytes)
        if blob_spool is None and config.blob_dir is not None:
            blob_spool = BlobSpool(config.blob_dir)
        # Blobs share the batches' token bucket (one cap for the link) and feed the same monitor.
        self.blobs = (
            BlobUploader(
                blob_spool,
                config.cloud_url,
                gateway_id,
                self._token,
                chunk_bytes=config.blob_chunk_bytes,
                concurrency=config.blob_concurrency,
                bucket=bucket,
                monitor=monitor,
                clock=clock,
            )
            if blob_spool is not None
            else None
        )
        self.chooser = BatchChooser(
            record_log,
            Limits(config.batch_max_records, config.batch_max_bytes),
            {"alert": config.drain_alerts, "summary": config.drain_summaries, "raw": config.drain_raw},
            config.backlog_threshold_records,
        )
        self._ledger = UplinkLedger(record_log, gateway_id, self.chooser)
        self.damage_stop = self._ledger.damage_stop
        self._wire = BatchWire(
            record_log,
            gateway_id,
            config,
            self._token,
            bucket=bucket,
            blobs=self.blobs,
            monitor=monitor,
            clock=clock,
            on_answer=on_answer,
        )
        self._wake = asyncio.Event()
        self._link_up = asyncio.Event()  # wakes a backoff wait
        self._depth = config.in_flight_batches
        self._warn = RateLimitedLog(log)
        self._task: asyncio.Task[None] | None = None
        self._before_batch: list[Callable[[], Awaitable[None]]] = []
        self.state: UplinkState = "idle"
        self.last_error = ""
        self._loop_counters: dict[str, float] = {
            "link_up_wakeups": 0,
            "pipelined_batches": 0,  # batches sent while others were in flight
            "before_batch_errors": 0,
            "before_batch_timeouts": 0,
        }
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_KINDS, 0)  # by FailureKind

    def add_before_batch(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook()`` before each batch is chosen, unless backing off (module docstring)."""
        self._before_batch.append(hook)

    async def _producers_append(self) -> None:
        if self.state == "backoff":
            return
        for hook in self._before_batch:
            try:
                async with asyncio.timeout(PRODUCER_WAIT_S):
                    await hook()
            except TimeoutError:
                self._loop_counters["before_batch_timeouts"] += 1
            except Exception:  # a producer's bug must not end the uplink
                self._loop_counters["before_batch_errors"] += 1
                log.exception("uplink: a producer's before-batch hook failed")

    def wake(self) -> None:
        """New durable records: send them now rather than at the next idle check."""
        self._wake.set()

    def link_changed(self, up: bool) -> None:
        """The link monitor's verdict changed. Back up: retry now rather than when the backoff ends,
        and abandon the requests that waited while it was down (wire.py)."""
        if up:
            self._link_up.set()
            self._wake.set()
            self._wire.link_returned()

    async def start(self, *, run: bool = True) -> None:
        """Open the HTTP session and start the sending task (``run=False``: tests drive it by
        ``send_one_batch``)."""
        if self._token is None:
            log.warning("uplink: no uplink.token or uplink.token_file; the cloud will refuse uploads")
        self._wire.open()
        self._ledger.sync_with_log()
        if run:
            self._task = asyncio.create_task(self._run(), name="uplink")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self._wire.close()
        self.state = "stopped"

    @property
    def backlog(self) -> int:
        """Records in the log the cloud has not acknowledged."""
        return self._ledger.backlog

    def acknowledged(self, lsn: int) -> bool:
        """Whether the cloud has acknowledged ``lsn`` (trimmed, or in an acknowledged range)."""
        return self._ledger.acknowledged(lsn)

    @property
    def live_waits(self) -> bool:
        """Whether a record appended now waits before it is sent: the uplink backs off from a failure,
        or a backlog goes first (chooser.py's ``live_held``)."""
        return self.state == "backoff" or self.chooser.live_held

    @property
    def last_success_ts(self) -> float:
        return self._ledger.last_success_ts

    @property
    def counters(self) -> dict[str, float]:
        """The loop's, the ledger's and the wire's counters (a copy; all counts but throttled_s)."""
        return {**self._loop_counters, **self._ledger.counters, **self._wire.counters}

    @property
    def figures(self) -> dict[str, float]:
        """The sender's counters, the chooser's and the damage stop's, for /status and /metrics."""
        return {**self.counters, **self.chooser.counters, **self.damage_stop.figures()}

    # -- the loop ------------------------------------------------------------------------------
    async def _run(self) -> None:
        sending: dict[asyncio.Task[Outcome], Batch] = {}
        try:
            await self._pipeline(sending)
        finally:  # stopped: what is in flight ends with the uplink (its records stay in the log)
            for task in sending:
                await cancel_and_wait(task)

    async def _pipeline(self, sending: dict[asyncio.Task[Outcome], Batch]) -> None:
        while True:
            if not sending:
                await self._producers_append()
            batch = None
            if len(sending) < self._depth and all(_may_pipeline(b) for b in sending.values()):
                batch = await self._ledger.next_batch(in_flight=bool(sending))
            if batch is not None and not batch.entries:  # a scan slice ran: go round again
                continue
            if batch is not None:
                self._loop_counters["pipelined_batches"] += bool(sending)
                self.state = "sending"
                alerts = [task for task, sent in sending.items() if sent.source == "alert"]
                sending[asyncio.create_task(self._send(batch, alerts), name="uplink-batch")] = batch
                continue
            if not sending:
                self.state = "corrupt" if self.damage_stop.damage is not None else "idle"
                self._wake.clear()
                await wait_event(self._wake, IDLE_WAKE_S)
                continue
            done, _ = await asyncio.wait(sending, return_when=asyncio.FIRST_COMPLETED)
            failed = [task.result() for task in done if task.result().kind != "ok"]
            for task in done:
                del sending[task]
            if failed:  # let the rest finish, then back off once
                if sending:
                    rest, _ = await asyncio.wait(sending)
                    failed += [task.result() for task in rest if task.result().kind != "ok"]
                    sending.clear()
                await self._ledger.settle_and_trim()
                await self._back_off(failed[-1])
                continue
            await self._ledger.settle_and_trim()
            self._retry.succeeded()
            self._outage_retry.succeeded()
            self.state = "sending"

    async def _back_off(self, outcome: Outcome) -> None:
        self.failures[outcome.kind] += 1
        self.last_error = f"{outcome.kind}: {outcome.detail}"
        self.state = "backoff"
        if outcome.kind == "auth":  # no retry storm against a refusal
            delay = self._retry.longest()
        elif outcome.kind in LINK_FAILURES:  # a cheap retry: a short up window must not be missed
            delay = self._outage_retry.failed()
        else:
            delay = self._retry.failed()
        if outcome.retry_after_s is not None:
            # A busy cloud said when it has room: sooner only adds refused POSTs to its load (a
            # thousand gateways' fast retries took the CPU its store needed, bench/fleet.py); spread
            # over up to twice that, so the fleet does not come back at one instant.
            delay = max(delay, outcome.retry_after_s * (1 + self._rng.random()))
        if outcome.kind == "auth":
            log.error(
                "uplink: the cloud refused our token (%s); fix uplink.token; retrying in %.0fs",
                outcome.detail,
                delay,
            )
        else:
            self._warn.warning(
                outcome.kind,
                "uplink: batch failed (%s: %s); retrying in %.1fs",
                outcome.kind,
                outcome.detail,
                delay,
            )
        await self._wait_to_retry(delay)

    async def _wait_to_retry(self, delay_s: float) -> None:
        """Sleep ``delay_s``, or less if the link monitor sees the link come back."""
        self._link_up.clear()
        if await wait_event(self._link_up, delay_s):
            self._loop_counters["link_up_wakeups"] += 1

    # -- sending -------------------------------------------------------------------------------
    async def send_one_batch(self) -> Outcome:
        """Choose and send one batch (as the loop would); "ok" with nothing to send is "ok"."""
        await self._producers_append()
        batch = await self._ledger.next_batch()
        while batch is not None and not batch.entries and batch.source == "scan":
            batch = await self._ledger.next_batch()
        if batch is None or not batch.entries:
            return Outcome("ok")
        outcome = await self._send(batch)
        await self._ledger.settle_and_trim()
        return outcome

    async def _send(self, batch: Batch, after: list[asyncio.Task[Outcome]] | None = None) -> Outcome:
        """Send one batch (wire.py), then book the cloud's answer (ledger.py). The trim is the
        caller's (``settle_and_trim``: one at a time, whatever is in flight)."""
        self._ledger.sending(batch)
        try:
            outcome = self._ledger.answered(batch, await self._wire.send(batch, after or []))
        except Exception as exc:  # a bug or a local fault must not end the uplink: count, retry
            log.exception("uplink: sending a batch failed on the gateway's side")
            outcome = Outcome("local", f"{type(exc).__name__}: {exc}")  # its records go back (below)
        finally:
            self._ledger.not_sending(batch)
        if outcome.kind != "ok":
            await self._ledger.failed(batch)
        return outcome
