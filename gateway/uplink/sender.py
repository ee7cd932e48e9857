"""Store-and-forward to the cloud: one task reads the log, POSTs batches, trims what the cloud stored.

Invariant: the log is trimmed only up to the ``last_lsn`` of a batch the cloud answered 200 with a
matching ``BatchAck``; a batch is retried (same records, same Idempotency-Key) until it is, so
nothing is ever dropped on the way up. Failures back off exponentially with jitter; a 401/403
backs off to the maximum at once (an operator must fix the token) and a 400 is logged with the
cloud's own words. The task wakes at once when new records become durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from pydantic import ValidationError

from gateway.ratelimit import RateLimitedLog
from gateway.storage.interface import RecordLog
from protocol.batch import BatchAck, encode_batch, idempotency_key
from protocol.config import UplinkConfig

log = logging.getLogger(__name__)

IDLE_WAKE_S = 5.0  # look at the log at least this often even without a wake-up
FAILURE_KINDS = ("connection", "timeout", "server_error", "auth", "rejected_by_cloud",
                 "unexpected_status", "bad_ack")


def next_backoff(previous_s: float, initial_s: float, max_s: float) -> float:
    """Pure: the next base delay after a failure (doubling, capped)."""
    return min(max_s, max(initial_s, previous_s * 2))


def jittered(delay_s: float, rng: random.Random) -> float:
    """Pure given ``rng``: a delay in [delay/2, delay], so gateways retrying together spread out."""
    return delay_s * (0.5 + 0.5 * rng.random())


@dataclass(frozen=True)
class Outcome:
    """The result of one POST, as a value: ``kind`` is "ok" or one of FAILURE_KINDS."""

    kind: str
    detail: str = ""
    ack: BatchAck | None = None


def read_token(token: str | None, token_file: Path | None) -> str | None:
    if token is not None:
        return token
    if token_file is not None:
        return Path(token_file).read_text().strip()
    return None


class Uplink:
    def __init__(self, record_log: RecordLog, gateway_id: str, config: UplinkConfig,
                 rng: random.Random | None = None) -> None:
        self._log = record_log
        self.gateway_id = gateway_id
        self._config = config
        self._url = f"{config.cloud_url.rstrip('/')}/v1/gateways/{gateway_id}/batches"
        self._token = read_token(config.token, config.token_file)
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._warn = RateLimitedLog(log)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.state = "idle"
        self.last_error = ""
        self.last_success_ts = 0.0
        self.counters = {"batches_sent": 0, "records_uploaded": 0, "bytes_uploaded": 0, "attempts": 0}
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_KINDS, 0)

    def wake(self) -> None:
        """New durable records: send them now rather than at the next idle check."""
        self._wake.set()

    async def start(self) -> None:
        if self._token is None:
            log.warning("uplink: no uplink.token or uplink.token_file; the cloud will refuse uploads")
        timeout = aiohttp.ClientTimeout(total=self._config.timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout)
        self._task = asyncio.create_task(self._run(), name="uplink")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.state = "stopped"

    @property
    def backlog(self) -> int:
        return self._log.durable_lsn - self._log.trimmed_lsn

    async def _run(self) -> None:
        cfg = self._config
        delay = 0.0
        while True:
            if self.backlog <= 0:
                self.state = "idle"
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), IDLE_WAKE_S)
                continue
            outcome = await self.send_one_batch()
            if outcome.kind == "ok":
                delay = 0.0
                self.state = "sending"
                continue
            self.failures[outcome.kind] += 1
            self.last_error = f"{outcome.kind}: {outcome.detail}"
            self.state = "backoff"
            if outcome.kind == "auth":
                delay = cfg.backoff_max_s
                log.error("uplink: the cloud refused our token (%s); fix uplink.token; retrying in %.0fs",
                          outcome.detail, delay)
            else:
                delay = next_backoff(delay, cfg.backoff_initial_s, cfg.backoff_max_s)
                self._warn.warning(outcome.kind, "uplink: batch failed (%s: %s); retrying in %.1fs",
                                   outcome.kind, outcome.detail, delay)
            await asyncio.sleep(jittered(delay, self._rng))

    async def send_one_batch(self) -> Outcome:
        """Read one batch from the oldest untrimmed record, POST it, trim on success."""
        cfg = self._config
        entries: list[tuple[int, bytes]] = []
        size = 0
        async for lsn, data in self._log.read(self._log.trimmed_lsn + 1):
            if entries and (len(entries) >= cfg.batch_max_records
                            or size + len(data) + 32 > cfg.batch_max_bytes):
                break
            entries.append((lsn, data))
            size += len(data) + 32
        if not entries:
            return Outcome("ok")
        first, last = entries[0][0], entries[-1][0]
        body = encode_batch(self.gateway_id, self._log.log_id, entries)
        outcome = await self._post(body, idempotency_key(self.gateway_id, self._log.log_id, first, last))
        if outcome.kind == "ok":
            assert outcome.ack is not None
            if outcome.ack.first_lsn != first or outcome.ack.last_lsn != last:
                return Outcome("bad_ack", f"sent {first}-{last}, cloud acked "
                                          f"{outcome.ack.first_lsn}-{outcome.ack.last_lsn}")
            await self._log.trim(last)
            self.counters["batches_sent"] += 1
            self.counters["records_uploaded"] += len(entries)
            self.counters["bytes_uploaded"] += len(body)
            self.last_success_ts = time.time()
        return outcome

    async def _post(self, body: bytes, key: str) -> Outcome:
        assert self._session is not None, "start() first"
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        self.counters["attempts"] += 1
        try:
            async with self._session.post(self._url, data=body, headers=headers) as response:
                text = await response.text()
                status = response.status
        except TimeoutError:
            return Outcome("timeout", f"no answer from {self._url} within {self._config.timeout_s}s")
        except aiohttp.ClientError as exc:
            return Outcome("connection", f"{type(exc).__name__}: {exc}")
        return classify_response(status, text)


def classify_response(status: int, text: str) -> Outcome:
    """Pure: turn the cloud's answer into an Outcome."""
    if status == 200:
        try:
            return Outcome("ok", ack=BatchAck.model_validate_json(text))
        except ValidationError as exc:
            return Outcome("bad_ack", f"200 with a body that is not a BatchAck: {exc.errors()[0]['msg']}")
    if status in (401, 403):
        return Outcome("auth", f"HTTP {status}")
    if status == 400:
        try:
            error = json.loads(text)
            detail = f"{error.get('error')}: {error.get('detail')}"
        except (ValueError, AttributeError):
            detail = text[:300]
        return Outcome("rejected_by_cloud", f"HTTP 400 {detail}")
    if status >= 500:
        return Outcome("server_error", f"HTTP {status}")
    return Outcome("unexpected_status", f"HTTP {status}: {text[:200]}")
