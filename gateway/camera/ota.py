"""Over-the-air model updates for one model name: run the operator's pin if one is set, else what
cloudd assigns this gateway (``GET /v1/models/{name}/assignment?gateway={id}`` -> version, stage,
sha256, reason), never the registry's newest; download it, verify it, hand it to the engine's swap.

Owner: whoever calls `ModelUpdater.open()` calls `stop()`; the updater owns its one task (``start``)
and the aiohttp session ``open`` made. `on_notice` may be called from the event loop at any time.

Policy (``check``; each outcome a value, ``note`` says what a person should know):
- pinned: run the pinned version, held locally (downloaded before, or the factory version: pinnable
  offline) or downloaded (``GET /v1/models/{name}/{version}`` + ``/onnx``). Neither held nor
  obtainable, or refused: run the factory model, and say so (``note``, a WARNING log line).
- not pinned: run the assignment. No assignment to be had (cloudd unreachable, or a cloudd without
  the route answering 404): keep running what runs, and say so.
- A retained notice only triggers a check; for its version it must agree on the sha256.
- A (version, sha256) whose bytes were refused (hash, load, probe) is not tried again.
Every swap (a rollback is a swap to an older version) goes to ``on_swap`` as a ``ModelSwap`` (the
runner logs it and appends it to the log) and is remembered in ``running.json``.

Invariant: the engine is only handed the factory artifact or an artifact whose bytes hash to the
sha256 cloudd named for it (the assignment, the notice, the header and the metadata); the pin
persists (``pin.json``), and the running version is the pinned one unless ``note`` says why not.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.camera.inference import InferenceEngine, SwapOutcome
from gateway.camera.model_store import LocalModels, RunningNote
from models.artifact import ArtifactError, ModelArtifact, artifact_from_bytes
from protocol.errors import ProtocolError
from protocol.events import SHA256_PATTERN, VERSION_PATTERN, ModelNotice, ModelSwap, parse_model_notice
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass
class UpdaterCounters:
    notices: int = 0
    bad_notices: int = 0
    polls: int = 0
    poll_failures: int = 0
    downloads: int = 0
    download_failures: int = 0
    refused: int = 0
    installed: int = 0
    factory_fallbacks: int = 0
    last_error: str = ""


@dataclass(frozen=True)
class Target:
    """A version to run, its stage, and why (the swap record's reason)."""

    version: str
    stage: str | None
    reason: str
    sha256: str | None = None  # None: whatever the registry's metadata names (a pin)


class Unavailable(Exception):
    """The bytes of a version could not be had now (network, HTTP status): try again later."""


def parse_assignment(doc: Any, name: str) -> Target:
    """cloudd's assignment document as a target; ValueError naming the field."""
    if not isinstance(doc, dict):
        raise ValueError("assignment: not a JSON object")
    checks = {"name": f"^{re.escape(name)}$", "version": VERSION_PATTERN, "sha256": SHA256_PATTERN}
    for key, pattern in checks.items():
        if not isinstance(doc.get(key), str) or not re.match(pattern, doc[key]):
            raise ValueError(f"assignment.{key}: {doc.get(key)!r} does not match {pattern}")
    stage, reason = doc.get("stage"), doc.get("reason", "")
    if not isinstance(stage, str) or not isinstance(reason, str):
        raise ValueError("assignment.stage and assignment.reason must be strings")
    return Target(doc["version"], stage[:32], f"assignment: {reason}"[:300], doc["sha256"])


class ModelUpdater:
    def __init__(
        self,
        engine: InferenceEngine,
        local: LocalModels,
        *,
        gateway_id: str,
        cloud_url: str,
        on_swap: Callable[[ModelSwap], Awaitable[None]],
        token: str | None = None,
        poll_interval_s: float = 60.0,
        timeout_s: float = 30.0,
    ) -> None:
        self.engine, self.local, self.name = engine, local, local.name
        self.gateway_id, self.cloud_url = gateway_id, cloud_url.rstrip("/")
        self._on_swap = on_swap
        self.poll_interval_s, self.timeout_s = poll_interval_s, timeout_s
        self.counters = UpdaterCounters()
        self.pinned = local.pinned()
        self.stage: str | None = None  # the running version's
        self.note = ""  # why the running version is not what was asked for; "" when it is
        self.assignment: dict[str, Any] | None = None  # cloudd's last answer
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._http: aiohttp.ClientSession | None = None
        self._notice: ModelNotice | None = None
        self._refused: set[tuple[str, str]] = set()  # (version, sha256)
        self._check_lock = asyncio.Lock()

    async def open(self) -> None:
        if self._http is not None:
            raise RuntimeError("ModelUpdater already open")
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def start(self) -> None:
        """Check now and every ``poll_interval_s`` (or at a notice)."""
        if self._task is not None:
            raise RuntimeError("ModelUpdater already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"model-updater-{self.name}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def first_model(self) -> tuple[ModelArtifact, Target]:
        """What the engine starts with: the pinned version (fetched now if not held; the factory
        model, with a note, if it cannot be had), else the version that ran last if held, else the
        factory model."""
        if self.pinned is not None:
            target = Target(self.pinned, "pinned", "pin")
            try:
                return await self._obtain(target), target
            except (Unavailable, ArtifactError) as exc:
                self._say(f"pinned {self.pinned} is not available ({exc}); running the factory model")
                self.counters.factory_fallbacks += 1
        else:
            last = self.local.last_running()
            held = await self.local.load(last.version) if last is not None else None
            if last is not None and held is not None:
                return held, Target(last.version, last.stage, "restart")
        return await self.local.factory(), Target(self.local.factory_version, "factory", "factory model")

    async def start_engine(self) -> tuple[SwapOutcome, Target]:
        """Start the engine on ``first_model``'s choice; one that does not load gives way to the
        factory model (with a note). The outcome is the factory model's then."""
        artifact, target = await self.first_model()
        outcome = await self.engine.start(artifact)
        if not outcome.ok and target.stage != "factory":
            why = f"{outcome.reason}: {outcome.detail}"[:200]
            self._say(f"{artifact.version} does not load ({why}); running the factory model")
            self.counters.factory_fallbacks += 1
            target = Target(self.local.factory_version, "factory", "factory model")
            outcome = await self.engine.swap(await self.local.factory())
        if outcome.ok:
            self.stage = target.stage
            await asyncio.to_thread(self.local.set_running, RunningNote(target.version, target.stage))
        return outcome, target

    def on_notice(self, payload: bytes) -> None:
        """A retained notice arrived on ``edgefed/<gw>/models/<name>``: check now."""
        try:
            notice = parse_model_notice(payload)
        except ProtocolError as exc:
            self.counters.bad_notices += 1
            self.counters.last_error = f"notice: {exc}"
            return
        if notice.name != self.name:
            self.counters.bad_notices += 1
            return
        self.counters.notices += 1
        self._notice = notice
        self._wake.set()

    async def pin(self, version: str | None) -> SwapOutcome:
        """Pin ``version`` (None: follow the assignment again), persisted, and act on it now."""
        self.pinned = version
        await asyncio.to_thread(self.local.set_pin, version)
        return await self.check()

    async def check(self) -> SwapOutcome:
        """Bring the engine to the wanted version (see the module docstring); the outcome as a value."""
        async with self._check_lock:
            target = await self._target()
            if isinstance(target, SwapOutcome):
                return target
            active = self.engine.active_artifact
            if active is not None and (active.version, active.metadata.sha256) == (
                target.version,
                target.sha256 or active.metadata.sha256,
            ):
                if self.stage != target.stage:  # the same version, promoted (or now pinned)
                    self.stage = target.stage
                    note = RunningNote(target.version, self.stage)
                    await asyncio.to_thread(self.local.set_running, note)
                self._say("")
                return SwapOutcome(True, target.version, "current")
            if target.sha256 is not None and (target.version, target.sha256) in self._refused:
                return SwapOutcome(False, target.version, "refused_before", self.counters.last_error)
            try:
                artifact = await self._obtain(target)
            except ArtifactError as exc:
                self._refuse(target, exc.reason, exc.detail, None)
                outcome = SwapOutcome(False, target.version, exc.reason, exc.detail)
                return await self._unavailable(target, outcome)
            except Unavailable as exc:
                self.counters.download_failures += 1
                self.counters.last_error = f"download {self.name}@{target.version}: {exc}"[:300]
                outcome = SwapOutcome(False, target.version, "download_failed", str(exc))
                return await self._unavailable(target, outcome)
            outcome = await self._swap(artifact, target)
            if not outcome.ok:
                self._refuse(target, outcome.reason, outcome.detail, artifact.metadata.sha256)
                return await self._unavailable(target, outcome)
            return outcome

    async def _target(self) -> Target | SwapOutcome:
        if self.pinned is not None:
            return Target(self.pinned, "pinned", "pin")
        try:
            target = parse_assignment(await self._assignment(), self.name)
        except (aiohttp.ClientError, TimeoutError, Unavailable, ValueError) as exc:
            self.counters.poll_failures += 1
            self.counters.last_error = f"assignment: {exc!r}"[:300]
            running = self.engine.active_version
            self._say(f"no assignment from cloudd ({str(exc)[:200]}); keeping {self.name}@{running}")
            return SwapOutcome(False, running or "", "no_assignment", self.note)
        return target

    async def _assignment(self) -> Any:
        assert self._http is not None, "open() first"
        self.counters.polls += 1
        url = f"{self.cloud_url}/v1/models/{self.name}/assignment"
        params = {"gateway": self.gateway_id}
        async with self._http.get(url, params=params, headers=self._headers) as response:
            if response.status != 200:
                raise Unavailable(f"HTTP {response.status} {(await response.text())[:200]}")
            document = await response.json()
        self.assignment = document if isinstance(document, dict) else None
        return document

    async def _swap(self, artifact: ModelArtifact, target: Target, note: str = "") -> SwapOutcome:
        """Swap ``artifact`` in; once it runs, ``note`` is what to know about it (before ``on_swap``,
        which shows it)."""
        was = self.engine.active_version
        outcome = await self.engine.swap(artifact)
        if not outcome.ok:
            return outcome
        self.counters.installed += 1
        self.stage = target.stage
        self._say(note)
        await asyncio.to_thread(self.local.set_running, RunningNote(artifact.version, target.stage))
        swap = {"name": self.name, "from": was, "to": artifact.version, "reason": target.reason}
        await self._on_swap(ModelSwap.model_validate({**swap, "stage": target.stage, "ts": time.time()}))
        return outcome

    async def _unavailable(self, target: Target, outcome: SwapOutcome) -> SwapOutcome:
        """``target`` cannot run: a pin falls back to the factory model; an assignment keeps what runs."""
        why = f"{outcome.reason}: {outcome.detail}"[:200]
        if target.stage != "pinned":
            self._say(f"assigned {target.version} cannot run ({why}); keeping {self.engine.active_version}")
            return outcome
        factory = self.local.factory_version
        self._say(f"pinned {target.version} is not available ({why}); running the factory model {factory}")
        if self.engine.active_version != factory:
            self.counters.factory_fallbacks += 1
            fallback = Target(factory, "factory", f"factory fallback: pinned {target.version}: {why}")
            await self._swap(await self.local.factory(), fallback, self.note)
        elif self.stage != "factory":  # already running it (pinned before): it now runs as the fallback
            self.stage = "factory"
            await asyncio.to_thread(self.local.set_running, RunningNote(factory, self.stage))
        return outcome

    def _refuse(self, target: Target, reason: str, detail: str, sha256: str | None) -> None:
        """Count a refusal; bytes of a known sha256 are not tried again."""
        self.counters.refused += 1
        self.counters.last_error = f"{self.name}@{target.version}: {reason}: {detail}"[:300]
        known = target.sha256 or sha256
        if known is not None:
            self._refused.add((target.version, known))

    def _say(self, note: str) -> None:
        if note and note != self.note:
            log.warning("models: %s: %s", self.name, note)
        self.note = note

    async def _obtain(self, target: Target) -> ModelArtifact:
        """The artifact of ``target``: held locally, else downloaded, verified and kept.
        ArtifactError: bytes to refuse; Unavailable: nothing to be had now."""
        held = await self.local.load(target.version, target.sha256)
        if held is not None:
            return held
        notice = self._notice
        named = notice is not None and notice.version == target.version
        if notice is not None and named and target.sha256 not in (None, notice.sha256):
            raise ArtifactError("hash_mismatch", f"notice sha256 {notice.sha256[:16]}... != assignment")
        try:
            artifact = await self._fetch(target.version)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(f"{exc!r}"[:300]) from None
        if target.sha256 is not None and artifact.metadata.sha256 != target.sha256:
            raise ArtifactError("hash_mismatch", "the registry's metadata names another sha256 than assigned")
        await self.local.save(artifact)
        return artifact

    async def _fetch(self, version: str) -> ModelArtifact:
        assert self._http is not None, "open() first"
        base = f"{self.cloud_url}/v1/models/{self.name}/{version}"
        async with self._http.get(base, headers=self._headers) as response:
            if response.status == 404:
                raise Unavailable(f"{self.name}@{version} is not in the registry (HTTP 404)")
            response.raise_for_status()
            metadata_json = await response.read()
        async with self._http.get(f"{base}/onnx", headers=self._headers) as response:
            response.raise_for_status()
            onnx_bytes = await response.read()
            header_sha = response.headers.get("X-Model-Sha256")
        self.counters.downloads += 1
        artifact = artifact_from_bytes(metadata_json, onnx_bytes)  # raises on a hash mismatch
        if header_sha is not None and header_sha != artifact.metadata.sha256:
            raise ArtifactError("hash_mismatch", "X-Model-Sha256 header disagrees with the metadata")
        return artifact

    async def _run(self) -> None:
        while True:
            await self.check()
            self._wake.clear()
            try:
                async with asyncio.timeout(self.poll_interval_s):  # not wait_for: 3.11 may swallow a cancel
                    await self._wake.wait()
            except TimeoutError:
                pass

    def status(self) -> dict[str, Any]:
        return {
            "pinned": self.pinned,
            "stage": self.stage,
            "note": self.note,
            "assignment": self.assignment,
            **{k: v for k, v in vars(self.counters).items()},
        }
