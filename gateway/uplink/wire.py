"""One uplink batch on the wire: its blobs, then its records, POSTed; the cloud's answer as a value.

Owns the uplink's HTTP session, its token bucket's use and the requests in flight. Invariant: a
batch's records are POSTed only after every blob they reference was committed in the cloud, and,
for a batch sent beside alert batches, only after those were acknowledged (never if one failed);
every request ends in an ``Outcome`` (outcome.py), a request abandoned on the link's return
included, and every POST is reported to the link monitor. A batch's body goes gzipped
(``uplink.compress_level``); the monitor, the bandwidth cap, stall deadlines and ``bytes_uploaded``
count the bytes on the wire.

Abandoned on the link's return: when the monitor sees the link come back (``link_returned``), a
request that was in flight while it was down is ended as a "connection" failure if it was sent
before the probe that saw the return (through a black hole it would wait for its whole timeout;
sent again, it is a duplicate the cloud acknowledges, and a blob resumes at the cloud's offset). One
sent after that probe went out on a working link and is kept, and a return that the request's own
answer showed the monitor (``_OWN_REQUEST``) never abandons that request. A request outstanding for
the monitor's ``stall_after_s`` (of the bytes of every request in flight) is reported as a stall
(stalls.py), once: that is how a black hole is seen in a few seconds rather than at its timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import zlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

import aiohttp

from gateway.storage.interface import RecordLog
from gateway.uplink.blobs import BlobRef, BlobUploader, blob_refs
from gateway.uplink.chooser import Batch
from gateway.uplink.drain import TokenBucket
from gateway.uplink.outcome import LINK_FAILURES, AnswerObserver, Outcome, UploadObserver, post
from gateway.uplink.stalls import StallWatch
from protocol.batch import encode_batch, idempotency_key
from protocol.config import UplinkConfig
from runtime.tasks import cancel_and_wait

# Inside a request the uplink may abandon, that request's abandon event: a link return it reports
# itself does not abandon it
_OWN_REQUEST: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "uplink_own_request", default=None
)


@dataclass(frozen=True)
class WireBody:
    """A batch's body as it goes on the wire."""

    data: bytes
    encoded_bytes: int  # before compression
    encoding: str | None  # its Content-Encoding; None: as encoded


class BatchWire:
    def __init__(
        self,
        record_log: RecordLog,
        gateway_id: str,
        config: UplinkConfig,
        token: str | None,
        *,
        bucket: TokenBucket,
        blobs: BlobUploader | None,
        monitor: UploadObserver | None,
        clock: Callable[[], float],
        on_answer: AnswerObserver | None = None,
    ) -> None:
        self._log = record_log
        self._gateway_id = gateway_id
        self._url = f"{config.cloud_url.rstrip('/')}/v1/gateways/{gateway_id}/batches"
        self._timeout_s = config.timeout_s
        self._compress_level = config.compress_level
        self._token = token
        self._bucket = bucket
        self._blobs = blobs
        self._monitor = monitor
        self._clock = clock
        self._on_answer = on_answer
        self._session: aiohttp.ClientSession | None = None
        # per request in flight: set to end it when the link returns, and when it was sent
        self._requests: dict[asyncio.Event, float] = {}
        self._stalls = StallWatch(monitor, clock, self._stalled)
        self.counters: dict[str, float] = {  # all counts but throttled_s (seconds)
            "bytes_uploaded": 0,  # on the wire: compressed
            "bytes_encoded": 0,  # the same batches' bodies before compression
            "attempts": 0,
            "abandoned_on_link_return": 0,
            "stalls": 0,
            "throttled_s": 0,
            "blob_refs_without_spool": 0,
        }

    def open(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def link_returned(self) -> None:
        """The monitor saw the link come back: abandon the requests that waited while it was down
        (module docstring)."""
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

    async def send(self, batch: Batch, after: list[asyncio.Task[Outcome]]) -> Outcome:
        """Send ``batch`` (its records only after the batches ``after`` were acknowledged), unless
        the link's return abandons it first; the cloud's answer, not yet checked against the batch."""
        return await self._unless_link_returns(self._transfer(batch, after))

    async def _unless_link_returns(self, sending: Coroutine[None, None, Outcome]) -> Outcome:
        """``sending``'s outcome, or a "connection" failure if a probe sent after the request sees
        the link come back first (the link went down while the request waited: it may be stuck on a
        connection the outage left dead); a link that stays up never "returns"."""
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
        entries = batch.entries
        refs = [ref for _, data in entries for ref in blob_refs(data)]
        body = self._body(entries)
        key = id(batch)
        self._stalls.began(key, len(body.data) + sum(r.size for r in refs))
        try:
            return await self._blobs_then_batch(entries, body, refs, after)
        finally:
            self._stalls.ended(key)

    def _body(self, entries: list[tuple[int, bytes]]) -> WireBody:
        encoded = encode_batch(self._gateway_id, self._log.log_id, entries)
        if self._compress_level == 0:
            return WireBody(encoded, len(encoded), None)
        # wbits 31: the gzip container, which Content-Encoding: gzip names
        packer = zlib.compressobj(self._compress_level, zlib.DEFLATED, 31)
        return WireBody(packer.compress(encoded) + packer.flush(), len(encoded), "gzip")

    def _stalled(self) -> None:
        self.counters["stalls"] += 1
        assert self._monitor is not None
        self._monitor.observe_stall()

    async def _blobs_then_batch(
        self,
        entries: list[tuple[int, bytes]],
        body: WireBody,
        refs: list[BlobRef],
        after: list[asyncio.Task[Outcome]],
    ) -> Outcome:
        first, last = entries[0][0], entries[-1][0]
        blob_failure = await self._upload_blobs(refs)
        if blob_failure is not None:
            return blob_failure
        if after:
            await asyncio.wait(after)  # never cancels them: they are the uplink loop's
            failed = next((o for o in (t.result() for t in after) if o.kind != "ok"), None)
            if failed is not None:
                return Outcome(failed.kind, f"not sent: the alert batch before it failed ({failed.detail})")
        wait = self._bucket.delay_for(len(body.data))
        if wait > 0:
            self.counters["throttled_s"] += wait
            await asyncio.sleep(wait)
        started = self._clock()
        outcome = await self._post(body, idempotency_key(self._gateway_id, self._log.log_id, first, last))
        if self._monitor is not None:
            self._monitor.observe_upload(
                len(body.data), self._clock() - started, outcome.kind not in LINK_FAILURES
            )
        if outcome.kind == "ok":
            self.counters["bytes_uploaded"] += len(body.data)
            self.counters["bytes_encoded"] += body.encoded_bytes
        return outcome

    async def _upload_blobs(self, refs: list[BlobRef]) -> Outcome | None:
        """Upload the blobs the batch's records reference, before the records (blobs.py docstring)."""
        assert self._session is not None, "open() first"
        if self._blobs is None:
            self.counters["blob_refs_without_spool"] += len(refs)
            return None
        outcome = await self._blobs.upload_all(self._session, refs)
        return None if outcome.kind == "ok" else Outcome(outcome.kind, outcome.detail)

    async def _post(self, body: WireBody, key: str) -> Outcome:
        assert self._session is not None, "open() first"
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        if body.encoding is not None:
            headers["Content-Encoding"] = body.encoding
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        self.counters["attempts"] += 1
        began = self._clock()
        outcome = await post(self._session, self._url, body.data, headers, self._timeout_s)
        if self._on_answer is not None:
            self._on_answer(outcome, self._clock() - began)
        return outcome
