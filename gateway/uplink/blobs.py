"""Large blobs (camera frames, model updates) on the gateway: a durable spool and a resumable uploader.

A blob travels as two things: its bytes, kept in the ``BlobSpool`` (a directory, one file per blob,
written whole: tmp + fsync + rename), and a log record that references it (``blob_record``: kind
"event", body ``{"blob": {"id", "size", "sha256", "content_type"}, ...}``). The record survives
outages like any other; the uplink (wire.py) uploads a record's blobs before the batch that
carries the record, so the cloud never holds a reference to a blob it has not committed.

``BlobUploader.upload(ref)`` sends a blob in chunks of ``chunk_bytes`` (``PUT ...?offset=N``; the last
with ``final=1`` and ``X-Sha256``). The first try of a blob that fits in one chunk (a camera frame)
is that one PUT, without asking first (the cloud answers a committed blob's PUT with a 200 no-op, a
partial one's with 409 and its offset; a blob found in the spool after a crash may so be sent twice,
never stored twice); a larger blob, and any retry, first asks how much the cloud holds (``GET
.../status``) and resumes there: a reset mid-upload, a
gateway restart or a cloudd restart costs at most the chunk in flight, never the blob. On a link
with a long round trip the asking is what costs, so ``upload_all`` sends up to ``concurrency``
blobs at once. Failures come back as values (the same
kinds as batches) and the uplink's backoff and retry-on-link-up apply; the same token bucket caps
the bandwidth. Invariant: a spool file is deleted only after the cloud said the blob is committed
with the same SHA-256.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.uplink.drain import TokenBucket
from gateway.uplink.outcome import OutcomeKind, UploadObserver
from protocol.records import Record, encode_record
from runtime.files import atomic_write

log = logging.getLogger(__name__)

_BLOB_MARK = b'"blob":{"id":'  # how encode_record writes a blob reference (compact JSON)
MAX_RESYNCS = 3  # offset mismatches in a row before giving up this attempt
RECENT_COMMITTED = 1024  # blobs known committed: a batch re-sent after a failure skips their status GET
RECENT_TRIED = 4096  # blobs this process tried to send: their next try asks the cloud's offset first


@dataclass(frozen=True)
class BlobRef:
    blob_id: str
    size: int
    sha256: str
    content_type: str = "application/octet-stream"

    def to_body(self) -> dict[str, Any]:
        return {
            "id": self.blob_id,
            "size": self.size,
            "sha256": self.sha256,
            "content_type": self.content_type,
        }


@dataclass(frozen=True)
class BlobOutcome:
    """``kind`` is "ok" or one of outcome.FAILURE_KINDS; ``detail`` says what happened."""

    kind: OutcomeKind
    detail: str = ""


def blob_record(device: str, received_ts: float, ref: BlobRef, **meta: Any) -> bytes:
    """The log record that references a spooled blob (``meta``: e.g. camera, frame number)."""
    return encode_record(
        Record(kind="event", device=device, received_ts=received_ts, body={"blob": ref.to_body(), **meta})
    )


def blob_refs(data: bytes) -> list[BlobRef]:
    """The blobs an encoded record references (a byte search first: most records have none)."""
    if _BLOB_MARK not in data:
        return []
    try:
        record = json.loads(data)
        blob = record["body"]["blob"] if record.get("kind") == "event" else None
        if not isinstance(blob, dict):
            return []
        return [
            BlobRef(
                str(blob["id"]),
                int(blob["size"]),
                str(blob["sha256"]),
                str(blob.get("content_type", "application/octet-stream")),
            )
        ]
    except (ValueError, KeyError, TypeError):
        return []


class BlobSpool:
    """Blobs waiting for upload, one file each, named by id. Blocking I/O: call from an executor
    (``put`` hashes and fsyncs) or accept a short block for small blobs."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, blob_id: str) -> Path:
        return self.directory / blob_id

    def put(
        self, data: bytes, blob_id: str | None = None, content_type: str = "application/octet-stream"
    ) -> BlobRef:
        """Store ``data`` durably (tmp + fsync + rename + dir fsync) and return its reference.

        The default id is the content's SHA-256 (first 40 hex digits), so the same bytes stored
        twice are one blob, and an id never names two different contents."""
        sha = hashlib.sha256(data).hexdigest()
        blob_id = blob_id or sha[:40]
        atomic_write(self.path(blob_id), data)
        return BlobRef(blob_id, len(data), sha, content_type)

    def read(self, blob_id: str, offset: int, size: int) -> bytes:
        with open(self.path(blob_id), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def exists(self, blob_id: str) -> bool:
        return self.path(blob_id).exists()

    def remove(self, blob_id: str) -> None:
        self.path(blob_id).unlink(missing_ok=True)

    def pending(self) -> int:
        return sum(1 for p in self.directory.iterdir() if not p.name.startswith("."))


class BlobUploader:
    def __init__(
        self,
        spool: BlobSpool,
        cloud_url: str,
        gateway_id: str,
        token: str | None,
        *,
        chunk_bytes: int = 256 * 1024,
        concurrency: int = 8,
        bucket: TokenBucket | None = None,
        monitor: UploadObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.spool = spool
        self._base = f"{cloud_url.rstrip('/')}/v1/gateways/{gateway_id}/blobs"
        self._token = token
        self.chunk_bytes = chunk_bytes
        self._slots = asyncio.Semaphore(concurrency)
        self._bucket = bucket or TokenBucket(None)
        self._monitor = monitor
        self._clock = clock
        self._committed: OrderedDict[str, str] = OrderedDict()  # blob id -> sha256, bounded (LRU)
        self._tried: OrderedDict[str, None] = OrderedDict()  # blob ids sent at least once, bounded (LRU)
        self.resumed_at: list[int] = []  # offsets > 0 an upload (re)started at, as the cloud reported
        self.counters: dict[str, float] = {  # all counts but throttled_s (seconds)
            "blobs_committed": 0,
            "blobs_already_committed": 0,
            "chunks_sent": 0,
            "bytes_sent": 0,
            "resumes": 0,
            "offset_resyncs": 0,
            "hash_mismatches": 0,
            "blobs_missing": 0,
            "unasked_puts": 0,
            "blob_conflicts": 0,
            "throttled_s": 0,
        }

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token is not None else {}

    async def upload_all(self, session: aiohttp.ClientSession, refs: list[BlobRef]) -> BlobOutcome:
        """Upload ``refs``, up to ``concurrency`` at a time; "ok" when every one is committed, else
        the first failure (the others went on: each is resumable, nothing of theirs is lost)."""

        async def one(ref: BlobRef) -> BlobOutcome:
            async with self._slots:
                return await self.upload(session, ref)

        unique = {ref.blob_id: ref for ref in refs}  # ids are content hashes: two records, one upload
        outcomes = await asyncio.gather(*(one(ref) for ref in unique.values()))
        return next((o for o in outcomes if o.kind != "ok"), BlobOutcome("ok"))

    async def upload(self, session: aiohttp.ClientSession, ref: BlobRef) -> BlobOutcome:
        """Make the cloud hold ``ref`` committed; "ok" also when it already did."""
        if self._committed.get(ref.blob_id) == ref.sha256:
            return BlobOutcome("ok")
        if ref.size <= self.chunk_bytes and ref.blob_id not in self._tried and self.spool.exists(ref.blob_id):
            self._tried[ref.blob_id] = None
            while len(self._tried) > RECENT_TRIED:
                self._tried.popitem(last=False)
            self.counters["unasked_puts"] += 1
            return await self._send_from(session, ref, 0)
        answer = await self._request(session, "GET", f"{self._base}/{ref.blob_id}/status", None)
        if isinstance(answer, BlobOutcome):
            return answer
        status, doc = answer
        if status != 200:
            return _failure(status, doc)
        if doc.get("committed"):
            return self._done(ref, doc, already=True)
        if not self.spool.exists(ref.blob_id):
            # Nothing to send and the cloud lacks it: the record goes up without its blob rather
            # than blocking the log forever (counted, logged; the record names the blob).
            self.counters["blobs_missing"] += 1
            log.error("uplink: blob %s is neither in the spool nor committed in the cloud", ref.blob_id)
            return BlobOutcome("ok", "missing")
        offset = int(doc.get("offset", 0))
        if offset > 0:
            self.resumed_at.append(offset)
            self.counters["resumes"] += 1
        return await self._send_from(session, ref, offset)

    async def _send_from(self, session: aiohttp.ClientSession, ref: BlobRef, offset: int) -> BlobOutcome:
        resyncs = 0
        while True:
            try:
                chunk = await asyncio.to_thread(self.spool.read, ref.blob_id, offset, self.chunk_bytes)
            except OSError as exc:  # the next try asks the cloud first, and finds the file or its absence
                return BlobOutcome("local", f"blob {ref.blob_id}: spool read failed: {exc}")
            final = offset + len(chunk) >= ref.size
            url = f"{self._base}/{ref.blob_id}?offset={offset}" + ("&final=1" if final else "")
            wait = self._bucket.delay_for(len(chunk))
            if wait > 0:
                self.counters["throttled_s"] += wait
                await asyncio.sleep(wait)
            answer = await self._request(session, "PUT", url, chunk, ref.sha256 if final else None)
            if isinstance(answer, BlobOutcome):
                return answer
            status, doc = answer
            if status == 200:
                self.counters["chunks_sent"] += 1
                self.counters["bytes_sent"] += len(chunk)
                if doc.get("committed"):
                    return self._done(ref, doc, already=False)
                offset, resyncs = int(doc["offset"]), 0
            elif status == 409 and doc.get("error") == "offset_mismatch" and resyncs < MAX_RESYNCS:
                offset, resyncs = int(doc.get("offset", 0)), resyncs + 1  # the cloud's offset wins
                self.counters["offset_resyncs"] += 1
                self.resumed_at.append(offset)
            elif status == 422:
                self.counters["hash_mismatches"] += 1  # the cloud discarded its partial: next try from 0
                return BlobOutcome("rejected_by_cloud", f"blob {ref.blob_id}: {doc.get('detail')}")
            else:
                return _failure(status, doc)

    def _done(self, ref: BlobRef, doc: dict[str, Any], already: bool) -> BlobOutcome:
        if doc.get("sha256") != ref.sha256:
            self.counters["blob_conflicts"] += 1
            log.error(
                "uplink: the cloud holds blob %s with sha256 %s, ours is %s; keeping our copy",
                ref.blob_id,
                doc.get("sha256"),
                ref.sha256,
            )
            return BlobOutcome("ok", "conflict")
        self.counters["blobs_already_committed" if already else "blobs_committed"] += 1
        self.spool.remove(ref.blob_id)
        self._committed[ref.blob_id] = ref.sha256
        while len(self._committed) > RECENT_COMMITTED:
            self._committed.popitem(last=False)
        return BlobOutcome("ok")

    async def _request(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        body: bytes | None,
        sha256: str | None = None,
    ) -> tuple[int, dict[str, Any]] | BlobOutcome:
        headers = self._headers()
        if sha256 is not None:
            headers["X-Sha256"] = sha256
        started = self._clock()
        # Reported to the link monitor when it ends, never when cancelled: a transfer the uplink
        # abandons says nothing of the link (reported failed, a batch's dozen blobs called a
        # working link down at once).
        try:
            async with session.request(method, url, data=body, headers=headers) as response:
                text = await response.text()
                status = response.status
                # a 409 offset_mismatch says where to resume in this header (docs/http-api.md)
                held = response.headers.get("Upload-Offset")
        except TimeoutError:
            self._observe(body, started, ok=False)
            return BlobOutcome("timeout", f"no answer from {url}")
        except aiohttp.ClientError as exc:
            self._observe(body, started, ok=False)
            return BlobOutcome("connection", f"{type(exc).__name__}: {exc}")
        self._observe(body, started, ok=True)
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {"detail": text[:200]}
        doc = doc if isinstance(doc, dict) else {}
        if held is not None and held.isdigit():
            doc.setdefault("offset", int(held))
        return status, doc

    def _observe(self, body: bytes | None, started: float, *, ok: bool) -> None:
        if self._monitor is not None and body:
            self._monitor.observe_upload(len(body), self._clock() - started, ok)


def _failure(status: int, doc: dict[str, Any]) -> BlobOutcome:
    detail = f"HTTP {status} {doc.get('error')}: {doc.get('detail')}"
    if status in (401, 403):
        return BlobOutcome("auth", detail)
    if status >= 500:
        return BlobOutcome("server_error", detail)
    if status in (400, 409, 413):
        return BlobOutcome("rejected_by_cloud", detail)
    return BlobOutcome("unexpected_status", detail)
