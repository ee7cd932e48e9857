"""FederatedCoordinator: the mechanism that drives an ``Aggregator`` over the update records in the store.

Owns one single-thread executor ("federated") and one asyncio task (the poll loop). All federated
state (buffer, counters, global weights) is touched only on that thread; the event loop reads
immutable snapshots (``model_document``, ``status``) that the thread publishes after each step,
so no lock is needed and the loop never waits for torch.

Each poll: read new update records (``UpdateFeed``), skip any (gateway, update_id) already applied
or buffered (counted as duplicates), decode and validate (refusals counted by reason), let the
aggregator admit or fail each, then aggregate while the aggregator is ready. Each aggregate is a
new version: weights and the applied ids are saved together (state.py) and, every ``onnx_every``
versions, exported to ONNX, evaluated by the quality gate (``cloud/rollout/gate.py``: the digits
test split, against the name's production) and stored in the model registry (``cloud/registry.py``)
on track "federated", as a candidate.

Invariant: an update id is applied at most once: it is added to ``applied`` in the same durable
state write that makes the version it contributed to visible, and an id in ``applied`` or in the
buffer is never admitted again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import torch

from cloud.federated.aggregate import apply_delta
from cloud.federated.decode import Refused, decode_update
from cloud.federated.feed import FeedItem, Position, UpdateFeed
from cloud.federated.layout import Layout, build_model
from cloud.federated.state import FederatedState, load_state, save_state
from cloud.federated.strategies import Aggregator, ClientUpdate, Failure, make_aggregator
from cloud.registry import ModelRegistry
from cloud.rollout.gate import HeldOut
from cloud.rollout.verdict import GateConfig
from models.architectures import input_shape, load_floating_state
from models.artifact import ModelArtifact, load_artifact
from protocol.errors import ProtocolError
from protocol.federated import FederatedJob, GlobalModel, TensorEntry, pack_payload, parse_update
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)
HISTORY = 100
FAILURES_KEPT = 1000  # failures since the last aggregation, kept as values (older ones only counted)


def _new_counters() -> dict[str, Any]:
    return {
        "received": 0,
        "applied": 0,
        "duplicates": 0,
        "refused": {},
        "payload_bytes": 0,
        "record_bytes": 0,
        "bytes_by_codec": {},
        "staleness": {},
        "participants": {},
        "onnx_exported": 0,
        "onnx_failed": 0,
    }


class FederatedCoordinator:
    def __init__(
        self,
        data_dir: Path,
        *,
        clock: Callable[[], float] = time.time,
        on_version: Callable[[int], None] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.folder = self.data_dir / "federated"
        self.clock = clock
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="federated")
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._state: FederatedState | None = None
        self._aggregator: Aggregator | None = None
        self._layout: Layout | None = None
        self._feed: UpdateFeed | None = None
        self._buffer: list[tuple[ClientUpdate, Position]] = []
        self._failures: list[Failure] = []
        self._exports: list[tuple[int, torch.Tensor]] = []
        self._on_version = on_version
        self.registry: ModelRegistry | None = None  # set by the route group (cloud/api/federated.py)
        self.gate = GateConfig()  # set by the route group from cloudd's config
        self._held_out: HeldOut | None = None  # the gate's rows, loaded at the first export
        self.model_document: tuple[int, bytes] | None = None
        self.status: dict[str, Any] = {"v": 1, "job": None}

    # -- lifecycle (event loop) ----------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load)
        self._task = asyncio.create_task(self._run(), name="federated-poll")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def set_job(self, job: FederatedJob) -> bool:
        """Start ``job`` (a new global model at version 0); False if it is already the running job."""
        changed = await asyncio.get_running_loop().run_in_executor(self._executor, self._set_job, job)
        self._wake.set()
        return changed

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            interval = self._state.job.poll_interval_s if self._state is not None else 1.0
            self._wake.clear()
            await wait_event(self._wake, interval)
            if self._state is None:
                continue
            try:
                await loop.run_in_executor(self._executor, self._poll_once)
                await self._export_pending(loop)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or a disk error: logged, the next poll tries again
                log.exception("federated: poll failed")

    async def _export_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        exports, self._exports = self._exports, []
        for version, weights in exports:
            try:
                artifact = await loop.run_in_executor(self._executor, self._export, version, weights)
                if self.registry is not None:
                    production = self.registry.lifecycle(artifact.name).production
                    baseline = self.registry.folder(artifact.name, production) if production else None
                    evaluation = await loop.run_in_executor(
                        self._executor, self._evaluate, artifact, baseline
                    )
                    await self.registry.store(artifact, track="federated", evaluation=evaluation)
                await loop.run_in_executor(self._executor, self._count, "onnx_exported")
            except Exception as exc:
                await loop.run_in_executor(self._executor, self._count, "onnx_failed")
                log.error("federated: ONNX export of version %d failed: %s", version, exc)

    # -- on the federated thread ---------------------------------------------------------------
    def _load(self) -> None:
        state = load_state(self.folder)
        if state is not None:
            self._install(state)
            log.info("federated: resumed job %s at version %d", state.job.model, state.version)

    def _install(self, state: FederatedState) -> None:
        torch.set_num_threads(1)
        self._state = state
        self._aggregator = make_aggregator(state.job)
        self._layout = Layout.of(build_model(state.job.arch))
        self._feed = UpdateFeed(self.data_dir, state.cursor)
        self._buffer, self._failures = [], []
        self._publish()

    def _set_job(self, job: FederatedJob) -> bool:
        if self._state is not None and self._state.job == job:
            return False
        torch.manual_seed(job.seed)
        model = build_model(job.arch)
        feed = UpdateFeed(self.data_dir)
        feed.skip_to_end()  # records stored so far belong to an earlier job
        state = FederatedState(
            job=job,
            version=0,
            weights=Layout.of(model).flatten(model.state_dict()),
            version_ts=self.clock(),
            cursor=dict(feed.cursor),
            counters=_new_counters(),
        )
        save_state(self.folder, state)
        self._install(state)
        self._queue_export(state)
        return True

    def _poll_once(self) -> None:
        assert self._state is not None and self._feed is not None and self._aggregator is not None
        items = self._feed.poll()
        for item in items:
            self._handle(item)
        aggregated = False
        while self._buffer and self._aggregator.ready(
            [u for u, _ in self._buffer], self._state.version, self.clock() - self._state.version_ts
        ):
            self._aggregate()
            aggregated = True
        if items or aggregated:
            self._publish()

    def _handle(self, item: FeedItem) -> None:
        state = self._state
        assert state is not None and self._aggregator is not None and self._layout is not None
        counters = state.counters
        counters["received"] += 1
        counters["record_bytes"] += item.line_bytes
        if item.record is None:
            return self._refuse(item.gateway, "corrupt_line", "a stored line did not parse")
        try:
            envelope = parse_update(item.record.get("body"))
        except ProtocolError as exc:
            return self._refuse(item.gateway, exc.reason, exc.detail)
        key = envelope.update_id
        if key in state.applied.get(item.gateway, {}) or any(
            u.gateway == item.gateway and u.update_id == key for u, _ in self._buffer
        ):
            counters["duplicates"] += 1
            return None
        flat = decode_update(envelope, state.job.model, self._layout, state.job.max_update_bytes)
        if isinstance(flat, Refused):
            return self._refuse(item.gateway, flat.reason, flat.detail)
        payload_bytes = sum(t.nbytes for t in envelope.tensors)
        counters["payload_bytes"] += payload_bytes
        codec = counters["bytes_by_codec"].setdefault(envelope.codec, {"updates": 0, "payload_bytes": 0})
        codec["updates"] += 1
        codec["payload_bytes"] += payload_bytes
        update = ClientUpdate(item.gateway, key, envelope.base_version, envelope.samples, flat, payload_bytes)
        failure = self._aggregator.admit(update, state.version, [u for u, _ in self._buffer])
        if failure is not None:
            if len(self._failures) < FAILURES_KEPT:
                self._failures.append(failure)
            return self._refuse(item.gateway, failure.reason, failure.detail)
        self._buffer.append((update, item.position))
        return None

    def _refuse(self, gateway: str, reason: str, detail: str) -> None:
        assert self._state is not None
        refused = self._state.counters["refused"]
        refused[reason] = refused.get(reason, 0) + 1
        self._participant(gateway)["refused"] += 1
        log.warning("federated: refused an update from %s (%s: %s)", gateway, reason, detail[:200])

    def _participant(self, gateway: str) -> dict[str, Any]:
        assert self._state is not None
        return self._state.counters["participants"].setdefault(
            gateway,
            {
                "applied": 0,
                "refused": 0,
                "payload_bytes": 0,
                "last_staleness": None,
                "last_applied_version": None,
            },
        )

    def _aggregate(self) -> None:
        state, aggregator = self._state, self._aggregator
        assert state is not None and aggregator is not None
        updates = [u for u, _ in self._buffer]
        assert self._layout is not None
        mask = self._layout.state_mask
        result = aggregator.aggregate(updates, self._failures, state.version, mask)
        assert result is not None  # the buffer is not empty
        state.weights = apply_delta(state.weights, result.step, state.job.server_lr, mask)
        state.version += 1
        state.version_ts = self.clock()
        counters = state.counters
        for update, staleness in zip(updates, result.staleness, strict=True):
            state.applied.setdefault(update.gateway, {})[update.update_id] = update.base_version
            who = self._participant(update.gateway)
            who["applied"] += 1
            who["payload_bytes"] += update.payload_bytes
            who["last_staleness"] = staleness
            who["last_applied_version"] = state.version
            counters["staleness"][str(staleness)] = counters["staleness"].get(str(staleness), 0) + 1
        counters["applied"] += len(updates)
        self._prune_applied()
        state.history = (
            state.history
            + [
                {
                    "version": state.version,
                    "ts": state.version_ts,
                    "updates": len(updates),
                    "gateways": sorted(set(result.gateways)),
                    "staleness_max": max(result.staleness),
                    "staleness_mean": sum(result.staleness) / len(result.staleness),
                    "clipped": result.clipped,
                    "failures": result.failures,
                }
            ]
        )[-HISTORY:]
        self._buffer, self._failures = [], []
        state.cursor = dict(self._feed.cursor) if self._feed is not None else {}
        save_state(self.folder, state)
        self._queue_export(state)
        if self._on_version is not None:
            self._on_version(state.version)

    def _prune_applied(self) -> None:
        """Forget ids too stale to be admitted again anyway (keeps ``applied`` bounded)."""
        assert self._state is not None
        horizon = self._state.version - self._state.job.max_staleness - 1
        for ids in self._state.applied.values():
            for update_id in [i for i, base in ids.items() if base < horizon]:
                del ids[update_id]

    def _queue_export(self, state: FederatedState) -> None:
        every = state.job.onnx_every
        if every and state.version % every == 0:
            self._exports.append((state.version, state.weights.clone()))

    def _export(self, version: int, weights: torch.Tensor) -> ModelArtifact:
        from models.export import export_artifact

        assert self._state is not None and self._layout is not None
        arch = self._state.job.arch
        model = build_model(arch)
        load_floating_state(model, self._layout.unflatten(weights))
        model.eval()
        shape = input_shape(arch)
        example = torch.zeros(1, *shape)
        with torch.no_grad():
            classes = int(model(example).shape[-1])  # a classifier: gateways train it with cross-entropy
        return export_artifact(
            model,
            example,
            name=self._state.job.model,
            version=str(version),
            input_spec={"name": "input", "shape": [None, *shape], "preprocess": "none"},
            postprocess="softmax_labels",
            labels=[str(i) for i in range(classes)],
            notes={"federated_version": version, "aggregator": self._state.job.aggregator},
        )

    def _evaluate(self, artifact: ModelArtifact, baseline: Path | None) -> dict[str, Any]:
        """The quality gate, as for a central job: on the digits test split, against production. An
        architecture that does not take digits has no held-out rows here: not promotable, said so."""
        import numpy as np

        from cloud.rollout.gate import digits_held_out, evaluate

        assert self._state is not None
        if self._held_out is None:
            self._held_out = digits_held_out(0)
        held = self._held_out
        arch = self._state.job.arch
        shape = tuple(input_shape(arch))
        if shape != tuple(held.x.shape[1:]):
            held = HeldOut(np.empty((0, *shape), np.float32), None, f"no held-out data for {arch.kind}")
        return evaluate(artifact, load_artifact(baseline) if baseline else None, held, self.gate)

    def _count(self, name: Literal["onnx_exported", "onnx_failed"]) -> None:
        if self._state is not None:
            self._state.counters[name] = self._state.counters.get(name, 0) + 1
            self._publish()

    def _publish(self) -> None:
        state, layout = self._state, self._layout
        assert state is not None and layout is not None and self._aggregator is not None
        if self.model_document is None or self.model_document[0] != state.version:
            parts = layout.unflatten(state.weights)
            sections = [parts[name].numpy().astype("<f4").tobytes() for name in layout.names]
            b64, sha = pack_payload(sections)
            document = GlobalModel(
                model=state.job.model,
                arch=state.job.arch,
                version=state.version,
                round=self._aggregator.round_config(),
                payload_sha256=sha,
                payload_b64=b64,
                tensors=[
                    TensorEntry(name=n, shape=list(s), encoding="fp32", nbytes=len(d))
                    for n, s, d in zip(layout.names, layout.shapes, sections, strict=True)
                ],
            )
            self.model_document = (state.version, document.model_dump_json().encode())
        self.status = status_document(state, len(self._buffer), self.clock())


def status_document(state: FederatedState, buffered: int, now: float) -> dict[str, Any]:
    """The GET /v1/federated/status JSON (pure: state in, document out)."""
    counters = state.counters
    hist = {int(k): v for k, v in counters.get("staleness", {}).items()}
    n = sum(hist.values())
    return {
        "v": 1,
        "job": state.job.model_dump(mode="json"),
        "model": state.job.model,
        "aggregator": state.job.aggregator,
        "version": state.version,
        "rounds": state.version,
        "version_age_s": max(0.0, now - state.version_ts),
        "buffered": buffered,
        "updates": {k: counters.get(k, 0) for k in ("received", "applied", "duplicates")}
        | {
            "refused": dict(counters.get("refused", {})),
            "refused_total": sum(counters.get("refused", {}).values()),
        },
        "bytes": {
            "payload": counters.get("payload_bytes", 0),
            "records": counters.get("record_bytes", 0),
            "by_codec": counters.get("bytes_by_codec", {}),
        },
        "staleness": {
            "histogram": {str(k): hist[k] for k in sorted(hist)},
            "mean": (sum(k * v for k, v in hist.items()) / n) if n else None,
            "max": max(hist) if hist else None,
        },
        "participants": [
            {"gateway": gw, **info} for gw, info in sorted(counters.get("participants", {}).items())
        ],
        "onnx": {"exported": counters.get("onnx_exported", 0), "failed": counters.get("onnx_failed", 0)},
        "history": state.history[-20:],
    }
