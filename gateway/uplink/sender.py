"""Store-and-forward to the cloud: one task reads the log, POSTs batches, trims what the cloud stored.

Invariant: a record leaves the log only when the cloud acknowledged it: the log is trimmed only up
to the end of the contiguous run of acknowledged LSNs (``drain.AckedRanges``), and a batch is
retried until the cloud answers 200 with a matching ``BatchAck``, so nothing is ever dropped on
the way up. Batches may carry non-contiguous LSNs (in increasing order); the cloud keeps LSN
intervals, so a batch re-sent after a restart stores nothing twice.

Draining (docs/gateway.md, "Uplink drain"): what to send next, the live tail or the backlog (alerts,
then summaries, then raw data) or both in one batch, and the bookkeeping of what the cloud
acknowledged, are chooser.py's; this module sends, retries and trims.

Pipeline: while backlog batches are in flight, the next backlog batch is chosen and sent beside
them, up to ``in_flight_batches`` at once, so that a long round trip (a frame's blobs, then its
records) is not paid once per batch. A batch with live records goes alone (the live tail is in one
batch at a time). A batch sent beside an alert batch uploads its blobs at once but POSTs its records
only once the alert batch was acknowledged (and not at all if it failed): the cloud stores every
alert before anything sent after it. Acknowledgements may come out of order; the log is still trimmed
only to the end of the contiguous acknowledged run. After a failure the uplink lets what is in flight
finish, then backs off; a failed batch's records go back to the backlog (a retransmit of a batch the
cloud did store is a duplicate it acknowledges).

Short up windows: a batch that failed on the link (refused, timed out) is retried after at most
``OUTAGE_RETRY_MAX_S`` (jittered), whatever the link monitor says, so a link that is up for two
seconds carries data in them; a retry also happens at once when the monitor sees the link come
back (``link_changed``), and a request that was in flight while the monitor held the link down is
abandoned then if it was sent before the probe that saw the return (through a black hole it would
wait for its whole timeout; sent again, it is a duplicate the cloud acknowledges, and a blob resumes
at the cloud's offset; one sent after that probe went out on a working link and is kept). A request
outstanding for the monitor's ``stall_after_s`` (of the bytes of every request in flight: they share
the link) is reported as a stall (``stalls``), once: that is
how a black hole is seen in a few seconds rather than at the request's timeout. Other failures back off
exponentially up to ``backoff_max_s``; a 503 with a ``Retry-After`` waits at least that long (up
to twice it, jittered); a 401/403 backs off to the maximum at once (an operator must
fix the token) and a 400 is logged with the cloud's own words. An optional token bucket caps the uplink's
bandwidth. Every upload is reported to the link monitor.

Producers that hold records out of the log until they can go at once (the camera's frames for the
cloud, gateway/camera/handoff.py) register with ``add_before_batch``: their hook appends what they
hold before the uplink chooses its next batch, but only while the uplink is not backing off from a
failure (a record that cannot leave is better held where its producer can take it back), and for at
most ``PRODUCER_WAIT_S``: a log that makes the append wait (full under policy "hold", a slow disk)
waits for the uplink to trim, so the uplink gives up on the hook and sends (the producer keeps what
it had not appended).

Full log (policy "drop_oldest"): the uplink follows the log's trim point past a drop (the backlog
forgets what is gone); what the drop lost, and the LogGap records that tell the cloud, are gaps.py's.
Damage in the log (``LogCorrupted``): the uplink sends what is before it and stops there, never
uploading or trimming past it (damage_stop.py; state "corrupt").
Each POST's result is a value (outcome.py's ``Outcome``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Literal

import aiohttp

from gateway.ratelimit import RateLimitedLog
from gateway.storage.interface import LogCorrupted, RecordLog, TrimFailed
from gateway.uplink.blobs import BlobRef, BlobSpool, BlobUploader, blob_refs
from gateway.uplink.chooser import Batch, BatchChooser, Limits
from gateway.uplink.damage_stop import DamageStop
from gateway.uplink.drain import TokenBucket, runs_of
from gateway.uplink.gaps import GapRecords, lost_in_flight, unacked_runs
from gateway.uplink.outcome import FAILURE_KINDS, LINK_FAILURES, Outcome, UploadObserver, post
from gateway.uplink.stalls import StallWatch
from protocol.batch import encode_batch, idempotency_key
from protocol.config import UplinkConfig
from runtime.backoff import Backoff
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

IDLE_WAKE_S = 5.0  # look at the log at least this often even without a wake-up
# Inside a request the uplink may abandon, that request's abandon event: a link return it reports
# itself does not abandon it
_OWN_REQUEST: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "uplink_own_request", default=None
)
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
    ) -> None:
        self._log = record_log
        self.gateway_id = gateway_id
        self._config = config
        self._url = f"{config.cloud_url.rstrip('/')}/v1/gateways/{gateway_id}/batches"
        self._token = read_token(config.token, config.token_file)
        self._retry = Backoff(config.backoff_initial_s, config.backoff_max_s, rng)
        self._rng = rng or random.Random()
        outage_max = min(config.backoff_max_s, OUTAGE_RETRY_MAX_S)
        self._outage_retry = Backoff(min(config.backoff_initial_s, outage_max), outage_max, rng)
        self._monitor = monitor
        self._clock = clock
        self._bucket = TokenBucket(config.bandwidth_cap_Bps, config.bandwidth_burst_bytes)
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
                bucket=self._bucket,
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
        self._wake = asyncio.Event()
        self._link_up = asyncio.Event()  # wakes a backoff wait
        # per request in flight: set to end it when the link returns (link_changed), and when it was sent
        self._requests: dict[asyncio.Event, float] = {}
        self._depth = config.in_flight_batches
        self._warn = RateLimitedLog(log)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._before_batch: list[Callable[[], Awaitable[None]]] = []
        self._in_flight: dict[int, list[tuple[int, int]]] = {}  # id(batch) -> its LSN runs, while sent
        self._stalls = StallWatch(monitor, clock, self._stalled)
        self._gap_records = GapRecords(record_log, gateway_id)
        self.damage_stop = DamageStop()
        self._synced = False
        self.state: UplinkState = "idle"
        self.last_error = ""
        self.last_success_ts = 0.0
        self.counters: dict[str, float] = {  # all counts but throttled_s (seconds)
            "batches_sent": 0,
            "records_uploaded": 0,
            "bytes_uploaded": 0,
            "attempts": 0,
            "link_up_wakeups": 0,
            "pipelined_batches": 0,  # batches sent while others were in flight
            "abandoned_on_link_return": 0,
            "stalls": 0,
            "before_batch_errors": 0,
            "before_batch_timeouts": 0,
            "throttled_s": 0,
            "blob_refs_without_spool": 0,
            "drops_followed": 0,
            "gap_records": 0,
            "trim_failures": 0,
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
                self.counters["before_batch_timeouts"] += 1
            except Exception:  # a producer's bug must not end the uplink
                self.counters["before_batch_errors"] += 1
                log.exception("uplink: a producer's before-batch hook failed")

    def wake(self) -> None:
        """New durable records: send them now rather than at the next idle check."""
        self._wake.set()

    def link_changed(self, up: bool) -> None:
        """The link monitor's verdict changed. Back up: retry now rather than when the backoff ends,
        and abandon a request that waited while it was down, unless that request's own answer is
        what brought the link back or it was sent after the probe that did."""
        if up:
            self._link_up.set()
            self._wake.set()
            own = _OWN_REQUEST.get()
            for returned, sent_at in self._requests.items():
                if returned is not own and self._sent_before_the_return(sent_at):
                    returned.set()

    def _sent_before_the_return(self, sent_at: float) -> bool:
        """Whether a request sent at ``sent_at`` was sent before the observation that saw the link
        return went out. One sent after it went out on a working link: it is not stuck, and
        abandoning it would throw away a round trip of a link that may be slow."""
        evidence_s = self._monitor.return_round_trip_s if self._monitor is not None else 0.0
        return self._clock() - sent_at > evidence_s

    async def start(self, *, run: bool = True) -> None:
        """Open the HTTP session and start the sending task (``run=False``: tests drive it by
        ``send_one_batch``)."""
        if self._token is None:
            log.warning("uplink: no uplink.token or uplink.token_file; the cloud will refuse uploads")
        timeout = aiohttp.ClientTimeout(total=self._config.timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout)
        self._sync_with_log()
        if run:
            self._task = asyncio.create_task(self._run(), name="uplink")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.state = "stopped"

    @property
    def backlog(self) -> int:
        """Records in the log the cloud has not acknowledged."""
        return max(0, self._log.durable_lsn - self._log.trimmed_lsn - self.chooser.acked.count)

    def acknowledged(self, lsn: int) -> bool:
        """Whether the cloud has acknowledged ``lsn`` (trimmed, or in an acknowledged range)."""
        return lsn <= self._log.trimmed_lsn or self.chooser.acked.contains(lsn)

    @property
    def figures(self) -> dict[str, float]:
        """The sender's counters, the chooser's and the damage stop's, for /status and /metrics."""
        return {**self.counters, **self.chooser.counters, **self.damage_stop.figures()}

    def _sync_with_log(self) -> None:
        """Start from the log's trim point; everything untrimmed is sent again (idempotent)."""
        if self._synced:
            return
        self.chooser.start_at(self._log.trimmed_lsn)
        self._log.set_unacked_view(self._unacked)
        self._synced = True

    def _unacked(self, first: int, last: int) -> list[tuple[int, int]]:
        in_flight = sorted(run for runs in self._in_flight.values() for run in runs)
        return unacked_runs(self.chooser.acked, in_flight, first, last)

    def _follow_drops(self) -> None:
        """The log dropped segments (policy "drop_oldest"): what is gone is neither backlog nor live."""
        trimmed = self._log.trimmed_lsn
        if trimmed <= self.chooser.acked.trimmed:
            return
        self.counters["drops_followed"] += 1
        self._gap_records.forget_dropped(trimmed, self.chooser.acked)
        self.chooser.follow_drops(trimmed)

    async def _count_lost(self, failed: list[tuple[int, int]]) -> None:
        lost = lost_in_flight(self.chooser.acked, failed, self._log.trimmed_lsn)  # before the await
        if lost:
            await self._log.add_lost(lost)

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
                batch = await self._next_batch(in_flight=bool(sending))
            if batch is not None and not batch.entries:  # a scan slice ran: go round again
                continue
            if batch is not None:
                self.counters["pipelined_batches"] += bool(sending)
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
                await self._settle_and_trim()
                await self._back_off(failed[-1])
                continue
            await self._settle_and_trim()
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
            self.counters["link_up_wakeups"] += 1

    # -- choosing what to send -----------------------------------------------------------------
    async def _next_batch(self, *, in_flight: bool = False) -> Batch | None:
        """The chooser's next batch, once the log's drops are followed and their gaps recorded; an
        empty "scan" batch (go round again) when a read has just reached damage. ``in_flight``:
        other batches are being sent (chooser.py: only a backlog batch may join them)."""
        self._sync_with_log()
        self._follow_drops()
        self.counters["gap_records"] += await self._gap_records.write()
        self.damage_stop.consider(self._log.damage, self._log.trimmed_lsn, self.chooser)
        try:
            durable = self.damage_stop.readable_upto(self._log.durable_lsn)
            return await self.chooser.next_batch(durable, in_flight=in_flight)
        except LogCorrupted as exc:
            self.damage_stop.consider([exc.damage], self._log.trimmed_lsn, self.chooser)
            return Batch("scan", [])

    # -- sending -------------------------------------------------------------------------------
    async def send_one_batch(self) -> Outcome:
        """Choose and send one batch (as the loop would); "ok" with nothing to send is "ok"."""
        await self._producers_append()
        batch = await self._next_batch()
        while batch is not None and not batch.entries and batch.source == "scan":
            batch = await self._next_batch()
        if batch is None or not batch.entries:
            return Outcome("ok")
        outcome = await self._send(batch)
        await self._settle_and_trim()
        return outcome

    async def _send(self, batch: Batch, after: list[asyncio.Task[Outcome]] | None = None) -> Outcome:
        """Send one batch: its transfer (which a returning link may abandon; its records only after
        the batches ``after`` were acknowledged), then, once the cloud acknowledged it, its
        bookkeeping (no await between the answer and the booking). The trim is the caller's
        (``_settle_and_trim``: one at a time, whatever is in flight)."""
        key = id(batch)
        self._in_flight[key] = runs_of(lsn for lsn, _ in batch.entries)
        try:
            outcome = await self._unless_link_returns(self._transfer(batch, after or []))
            if outcome.kind == "ok":
                outcome = self._acknowledged(batch, outcome)
        except Exception as exc:  # a bug or a local fault must not end the uplink: count, retry
            log.exception("uplink: sending a batch failed on the gateway's side")
            outcome = Outcome("local", f"{type(exc).__name__}: {exc}")  # its records go back (below)
        finally:
            in_flight = self._in_flight.pop(key)
        if outcome.kind != "ok":
            self.chooser.failed(batch)
            await self._count_lost(in_flight)
        return outcome

    async def _settle_and_trim(self) -> None:
        await self._gap_records.settle(self.chooser.acked)
        await self._trim()

    async def _unless_link_returns(self, sending: Coroutine[None, None, Outcome]) -> Outcome:
        """``sending``'s outcome, or a "connection" failure if a probe sent after the request sees
        the link come back first (the link went down while the request waited: it may be stuck on a
        connection the outage left dead). A return that the request's own answer showed the monitor
        (``_OWN_REQUEST``) does not abandon that request; a link that stays up never "returns"."""
        link_returned = asyncio.Event()
        self._requests[link_returned] = self._clock()
        context = contextvars.copy_context()
        context.run(_OWN_REQUEST.set, link_returned)  # its blob uploads (gather's tasks) copy this context
        request = asyncio.create_task(sending, name="uplink-request", context=context)
        returned = asyncio.create_task(link_returned.wait(), name="uplink-link-returned")
        try:
            await asyncio.wait((request, returned), return_when=asyncio.FIRST_COMPLETED)
        finally:
            del self._requests[link_returned]
            await cancel_and_wait(returned)
            if not request.done():
                await cancel_and_wait(request)
        if request.cancelled():
            self.counters["abandoned_on_link_return"] += 1
            return Outcome("connection", "abandoned: the link came back while this request waited")
        return request.result()

    async def _transfer(self, batch: Batch, after: list[asyncio.Task[Outcome]]) -> Outcome:
        """The batch's blobs, then (once ``after`` were acknowledged) the batch, on the wire; the
        cloud's answer."""
        entries = batch.entries
        refs = [ref for _, data in entries for ref in blob_refs(data)]
        key = id(batch)
        self._stalls.began(key, sum(len(data) for _, data in entries) + sum(r.size for r in refs))
        try:
            return await self._blobs_then_batch(entries, refs, after)
        finally:
            self._stalls.ended(key)

    def _stalled(self) -> None:
        self.counters["stalls"] += 1
        assert self._monitor is not None
        self._monitor.observe_stall()

    async def _blobs_then_batch(
        self, entries: list[tuple[int, bytes]], refs: list[BlobRef], after: list[asyncio.Task[Outcome]]
    ) -> Outcome:
        first, last = entries[0][0], entries[-1][0]
        blob_failure = await self._upload_blobs(refs)
        if blob_failure is not None:
            return blob_failure
        if after:
            await asyncio.wait(after)  # never cancels them: they are the loop's
            failed = next((o for o in (t.result() for t in after) if o.kind != "ok"), None)
            if failed is not None:
                return Outcome(failed.kind, f"not sent: the alert batch before it failed ({failed.detail})")
        body = encode_batch(self.gateway_id, self._log.log_id, entries)
        wait = self._bucket.delay_for(len(body))
        if wait > 0:
            self.counters["throttled_s"] += wait
            await asyncio.sleep(wait)
        started = self._clock()
        outcome = await self._post(body, idempotency_key(self.gateway_id, self._log.log_id, first, last))
        if self._monitor is not None:
            self._monitor.observe_upload(
                len(body), self._clock() - started, outcome.kind not in LINK_FAILURES
            )
        if outcome.kind == "ok":
            self.counters["bytes_uploaded"] += len(body)
        return outcome

    def _acknowledged(self, batch: Batch, outcome: Outcome) -> Outcome:
        """Book a batch the cloud answered 200 (no await: the log never sees it half booked);
        "bad_ack" if the answer is for other LSNs."""
        entries = batch.entries
        first, last = entries[0][0], entries[-1][0]
        assert outcome.ack is not None
        if outcome.ack.first_lsn != first or outcome.ack.last_lsn != last:
            return Outcome(
                "bad_ack", f"sent {first}-{last}, cloud acked {outcome.ack.first_lsn}-{outcome.ack.last_lsn}"
            )
        self.chooser.acknowledged(batch)
        # Counted when the cloud acknowledged it, before the trim's await: a reader that sees the
        # log trimmed also sees the batch counted.
        self.counters["batches_sent"] += 1
        self.counters["records_uploaded"] += len(entries)
        self.last_success_ts = time.time()
        return outcome

    async def _upload_blobs(self, refs: list[BlobRef]) -> Outcome | None:
        """Upload the blobs the batch's records reference, before the records (blobs.py docstring)."""
        assert self._session is not None, "start() first"
        if self.blobs is None:
            self.counters["blob_refs_without_spool"] += len(refs)
            return None
        outcome = await self.blobs.upload_all(self._session, refs)
        return None if outcome.kind == "ok" else Outcome(outcome.kind, outcome.detail)

    async def _trim(self) -> None:
        acked = self.chooser.acked
        point = acked.trim_point()
        if point > self._log.trimmed_lsn:
            acked.trimmed_to(point)  # before the await: ``backlog`` never counts a run twice
            try:
                await self._log.trim(point)
            except TrimFailed as exc:  # the batch is stored all the same; the next trim tries again
                self.counters["trim_failures"] += 1
                self._warn.warning("trim", "uplink: %s", exc)

    async def _post(self, body: bytes, key: str) -> Outcome:
        assert self._session is not None, "start() first"
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        self.counters["attempts"] += 1
        return await post(self._session, self._url, body, headers, self._config.timeout_s)
