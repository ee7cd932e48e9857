"""FederatedClient: one gateway's side of federated training, as one asyncio task.

Each round: fetch the newest global model (GET .../model?have=V: a 304 costs no body), read new
samples from the private data log, train on the trainer's thread, encode the delta, and append it
as an ``update`` record to the *uplink* log, flushed durably before the round counts as done; the
existing uplink sends it in a batch (so an update survives outages and gateway restarts like any
record). A gateway trains again when a newer global version appears, or after ``retrain_after_s``
on the same version (so a fleet smaller than the cloud's buffer still makes progress).

Failures are values (``RoundOutcome.kind``); the loop backs off on them (``failing`` says why until
a round succeeds), and an unexpected exception in a round (a full uplink log, say) becomes an
``error`` outcome with ``last_error`` set, never the end of the loop; ``start`` clears both.
Invariant: one owner (the task started by ``start``, cancelled and awaited by ``stop``; ``start``
again after ``stop`` resumes with the same global model and residuals); every HTTP call has a
timeout; an update is appended only after its round finished completely.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import aiohttp
import numpy as np
import torch

from gateway.federated.encoder import CodecSpec, UpdateEncoder
from gateway.federated.lazy_client import CLIENT_COUNTERS
from gateway.federated.samples import SampleWindow
from gateway.federated.trainer import LocalResult, LocalTrainer, TrainingStopped
from gateway.storage.interface import RecordLog
from models.architectures import build_architecture, load_floating_state
from protocol.errors import ProtocolError
from protocol.federated import (
    GlobalModel,
    UpdateEnvelope,
    pack_payload,
    parse_global_model,
    split_payload,
)
from protocol.records import Record, encode_record
from runtime.backoff import Backoff
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


RoundKind = Literal[
    "sent", "up_to_date", "too_few_samples", "fetch_failed", "no_job", "wrong_model", "stopped", "error"
]
FAILED_ROUNDS = ("fetch_failed", "wrong_model", "error")  # the loop backs off after these


@dataclass(frozen=True)
class RoundOutcome:
    kind: RoundKind
    detail: str = ""
    version: int | None = None
    update_id: str | None = None
    payload_bytes: int = 0
    record_bytes: int = 0


def load_weights(document: GlobalModel) -> dict[str, torch.Tensor]:
    """The fp32 state dict a GlobalModel carries (ProtocolError if malformed)."""
    sections = split_payload(
        document.tensors, document.payload_b64, document.payload_sha256, max_bytes=64 << 20
    )
    state = {}
    for entry, data in zip(document.tensors, sections, strict=True):
        if entry.encoding != "fp32" or len(data) != 4 * entry.numel:
            raise ProtocolError("bad_payload", f"global tensor {entry.name} is not fp32 of its shape")
        state[entry.name] = torch.from_numpy(np.frombuffer(data, dtype="<f4").copy()).view(entry.shape)
    return state


class FederatedClient:
    def __init__(
        self,
        gateway_id: str,
        cloud_url: str,
        token: str | None,
        data_log: RecordLog,
        uplink_log: RecordLog,
        *,
        trainer: LocalTrainer,
        codec: CodecSpec | None = None,
        wake_uplink: Callable[[], None] | None = None,
        device: str = "federated",
        poll_interval_s: float = 1.0,
        retrain_after_s: float = 10.0,
        min_samples: int = 16,
        max_samples: int = 10_000,
        timeout_s: float = 10.0,
        retry_max_s: float = 30.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        expect_model: str | None = None,
        expect_arch: str | None = None,
    ) -> None:
        self.gateway_id = gateway_id
        self._url = f"{cloud_url.rstrip('/')}/v1/federated/gateways/{gateway_id}/model"
        self._token = token
        self._uplink_log = uplink_log
        self.samples = SampleWindow(data_log, max_samples)
        self.trainer = trainer
        self.encoder = UpdateEncoder(codec or CodecSpec())
        self._wake_uplink = wake_uplink
        self.device = device
        self.poll_interval_s, self.retrain_after_s = poll_interval_s, retrain_after_s
        self.min_samples, self.timeout_s = min_samples, timeout_s
        self._rng = rng or random.Random()
        self._retry = Backoff(poll_interval_s, max(retry_max_s, poll_interval_s), self._rng)
        self._clock = clock
        self.expect_model, self.expect_arch = expect_model, expect_arch
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._global: GlobalModel | None = None
        self._weights: dict[str, torch.Tensor] | None = None
        self._trained_version: int | None = None
        self._last_sent = float("-inf")
        self.counters = dict.fromkeys(CLIENT_COUNTERS, 0)
        self.last_outcome: RoundOutcome | None = None
        self.last_error: str | None = None

    @property
    def global_version(self) -> int | None:
        """The version of the global model this client holds; None before its first fetch."""
        return self._global.version if self._global is not None else None

    @property
    def failing(self) -> str | None:
        """Why the last round failed while the loop backs off before the next; None after a good one."""
        outcome = self.last_outcome
        if outcome is None or outcome.kind not in FAILED_ROUNDS:
            return None
        return f"{outcome.kind}: {outcome.detail}"

    async def start(self, *, run: bool = True) -> None:
        self.last_error = self.last_outcome = None  # a new run: what failed before is not its error
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        if run:
            self._task = asyncio.create_task(self._run(), name=f"federated-{self.gateway_id}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            try:
                outcome = await self.run_round()
            except Exception as exc:  # a round must never end the loop; say what went wrong and back off
                log.warning("federated round failed: %s: %s", type(exc).__name__, exc)
                self.counters["errors"] += 1
                outcome = RoundOutcome("error", f"{type(exc).__name__}: {exc}")
            self.last_outcome = outcome
            if outcome.kind in FAILED_ROUNDS:
                self.last_error = outcome.detail
                await asyncio.sleep(self._retry.failed())
            else:
                self._retry.succeeded()
                await asyncio.sleep(self.poll_interval_s)

    async def fetch(self) -> RoundOutcome | None:
        """Bring the global model up to date; an outcome only when that failed."""
        assert self._session is not None, "start() first"
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        params = {"have": str(self._global.version)} if self._global is not None else {}
        self.counters["fetches"] += 1
        try:
            async with self._session.get(self._url, headers=headers, params=params) as response:
                body = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.counters["fetch_failures"] += 1
            return RoundOutcome("fetch_failed", f"{type(exc).__name__}: {exc}")
        self.counters["fetch_bytes"] += len(body)
        if status == 304:
            return None
        if status == 404:
            return RoundOutcome("no_job", body.decode(errors="replace")[:200])
        if status != 200:
            self.counters["fetch_failures"] += 1
            return RoundOutcome("fetch_failed", f"HTTP {status}: {body[:200]!r}")
        try:
            document = parse_global_model(body)
        except ProtocolError as exc:
            self.counters["fetch_failures"] += 1
            return RoundOutcome("fetch_failed", f"global model: {exc}")
        wrong = self._wrong_model(document)
        if wrong:
            self.counters["wrong_model"] += 1
            return RoundOutcome("wrong_model", wrong, document.version)
        try:
            weights = load_weights(document)
        except ProtocolError as exc:
            self.counters["fetch_failures"] += 1
            return RoundOutcome("fetch_failed", f"global model: {exc}")
        self._global, self._weights = document, weights
        return None

    def _wrong_model(self, document: GlobalModel) -> str:
        """Why this gateway will not train ``document`` (its config names another model), or ""."""
        if self.expect_model is not None and document.model != self.expect_model:
            return f"the cloud's job trains {document.model!r}, this gateway expects {self.expect_model!r}"
        if self.expect_arch is not None and document.arch.kind != self.expect_arch:
            return f"the job's arch is {document.arch.kind!r}, this gateway allows {self.expect_arch!r}"
        return ""

    async def run_round(self) -> RoundOutcome:
        failed = await self.fetch()
        if failed is not None:
            return failed
        assert self._global is not None and self._weights is not None
        await self.samples.refresh()
        version = self._global.version
        if len(self.samples) < self.min_samples:
            return RoundOutcome("too_few_samples", f"{len(self.samples)} < {self.min_samples}", version)
        if version == self._trained_version and self._clock() - self._last_sent < self.retrain_after_s:
            return RoundOutcome("up_to_date", version=version)
        model = build_architecture(self._global.arch)
        load_floating_state(model, self._weights)
        x, y = self.samples.tensors()
        fetched_ts = time.time()
        try:
            result = await self.trainer.train(model, x, y, self._global.round)
        except TrainingStopped:
            return RoundOutcome("stopped", version=version)
        record, envelope = await self.trainer.run(self._envelope, result, version, fetched_ts)
        await self._uplink_log.append(record)
        await self._uplink_log.flush(wait=True)  # durable before the round counts as done
        if self._wake_uplink is not None:
            self._wake_uplink()
        self._trained_version, self._last_sent = version, self._clock()
        payload = sum(t.nbytes for t in envelope.tensors)
        self.counters["rounds"] += 1
        self.counters["updates_sent"] += 1
        self.counters["payload_bytes"] += payload
        self.counters["record_bytes"] += len(record)
        return RoundOutcome(
            "sent",
            version=version,
            update_id=envelope.update_id,
            payload_bytes=payload,
            record_bytes=len(record),
        )

    def _envelope(self, result: LocalResult, version: int, fetched_ts: float) -> tuple[bytes, UpdateEnvelope]:
        assert self._global is not None
        entries, sections = self.encoder.encode(result.tensors, result.state_names)
        b64, sha = pack_payload(sections)
        envelope = UpdateEnvelope(
            update_id=f"v{version}-{self._rng.getrandbits(48):012x}",
            model=self._global.model,
            base_version=version,
            samples=result.samples,
            local_steps=result.steps,
            fetched_ts=fetched_ts,
            trained_s=result.seconds,
            train_loss=result.loss,
            codec=self.encoder.spec.describe(),
            tensors=entries,
            payload_sha256=sha,
            payload_b64=b64,
        )
        record = encode_record(
            Record(
                kind="update",
                device=self.device,
                received_ts=time.time(),
                body=envelope.model_dump(mode="json"),
            )
        )
        return record, envelope
