"""Over-the-air model updates for one model name: learn of a new version (retained MQTT notice, or
polling ``GET /v1/models`` as a fallback), download it, verify its sha256, hand it to the
inference engine's swap; pin and unpin a version.

Owner: whoever calls `ModelUpdater.start()` calls `stop()`; the updater owns its one task and the
aiohttp session it made. `on_notice` may be called from the event loop at any time.

Policy: the wanted version is the pinned one if a pin is set, else the registry's latest (highest
seq). A notice only triggers an immediate check and, for its version, must agree on the sha256.
A version whose bytes were refused (hash mismatch, failed load or probe) is not retried with the
same hash; the old model keeps running.

Invariant: the engine is only ever handed an artifact whose bytes hash to the sha256 the
registry listed (and the notice named), and `pin` survives a restart (``pin.json`` in store_dir).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.camera.inference import InferenceEngine, SwapOutcome
from models.artifact import ArtifactError, ModelArtifact, artifact_from_bytes, load_artifact, save_artifact
from protocol.errors import ProtocolError
from protocol.events import ModelNotice, parse_model_notice
from runtime.tasks import cancel_and_wait


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
    last_error: str = ""


class ModelUpdater:
    def __init__(
        self,
        engine: InferenceEngine,
        *,
        name: str,
        cloud_url: str,
        store_dir: Path,
        token: str | None = None,
        poll_interval_s: float = 60.0,
        timeout_s: float = 30.0,
    ) -> None:
        self.engine, self.name, self.cloud_url = engine, name, cloud_url.rstrip("/")
        self.store_dir = store_dir / name
        self.poll_interval_s, self.timeout_s = poll_interval_s, timeout_s
        self.counters = UpdaterCounters()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._http: aiohttp.ClientSession | None = None
        self._notice: ModelNotice | None = None
        self._refused: set[tuple[str, str]] = set()  # (version, sha256)
        self._check_lock = asyncio.Lock()
        pin_file = self.store_dir / "pin.json"
        if pin_file.exists():
            engine.pin(json.loads(pin_file.read_text())["version"])

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("ModelUpdater already started")
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"model-updater-{self.name}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._http is not None:
            await self._http.close()
            self._http = None

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

    async def pin(self, version: str) -> SwapOutcome:
        self.engine.pin(version)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        (self.store_dir / "pin.json").write_text(json.dumps({"version": version}))
        return await self.check()

    async def unpin(self) -> SwapOutcome:
        self.engine.unpin()
        (self.store_dir / "pin.json").unlink(missing_ok=True)
        return await self.check()

    async def check(self) -> SwapOutcome:
        """Bring the engine to the wanted version (see the module docstring); the outcome as a value."""
        async with self._check_lock:
            try:
                entries = await self._list()
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.counters.poll_failures += 1
                self.counters.last_error = f"list: {exc!r}"[:300]
                return SwapOutcome(False, "", "unreachable", self.counters.last_error)
            wanted = self._wanted(entries)
            if wanted is None:
                return SwapOutcome(False, "", "no_version", "no matching version in the registry")
            if wanted["version"] == self.engine.active_version:
                return SwapOutcome(True, wanted["version"], "current")
            if (wanted["version"], wanted["sha256"]) in self._refused:
                return SwapOutcome(False, wanted["version"], "refused_before", self.counters.last_error)
            return await self._install(wanted)

    def _wanted(self, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
        pinned = self.engine.pinned
        if pinned is not None:
            return next((e for e in entries if e["version"] == pinned), None)
        return max(entries, key=lambda e: e["seq"], default=None)

    async def _list(self) -> list[dict[str, Any]]:
        assert self._http is not None, "start() first"
        self.counters.polls += 1
        async with self._http.get(
            f"{self.cloud_url}/v1/models", params={"name": self.name}, headers=self._headers
        ) as response:
            response.raise_for_status()
            return [e for e in (await response.json())["models"] if e["name"] == self.name]

    async def _install(self, entry: dict[str, Any]) -> SwapOutcome:
        version, sha = entry["version"], entry["sha256"]
        notice = self._notice
        try:
            if notice is not None and notice.version == version and notice.sha256 != sha:
                raise ArtifactError("hash_mismatch", f"notice sha256 {notice.sha256[:16]}... != registry")
            artifact = await self._fetch(version)
            if artifact.metadata.sha256 != sha:
                raise ArtifactError("hash_mismatch", "downloaded metadata names another sha256 than listed")
        except ArtifactError as exc:
            self.counters.refused += 1
            self.counters.last_error = f"{self.name}@{version}: {exc}"
            self._refused.add((version, sha))
            return SwapOutcome(False, version, exc.reason, exc.detail)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.counters.download_failures += 1
            self.counters.last_error = f"download {self.name}@{version}: {exc!r}"[:300]
            return SwapOutcome(False, version, "download_failed", self.counters.last_error)
        outcome = await self.engine.swap(artifact)
        if outcome.ok:
            self.counters.installed += 1
        elif outcome.reason != "pinned":
            self._refused.add((version, sha))
            self.counters.refused += 1
            self.counters.last_error = f"{self.name}@{version}: {outcome.reason}: {outcome.detail}"
        return outcome

    async def _fetch(self, version: str) -> ModelArtifact:
        """From the local cache if present and intact, else from the registry (then cached)."""
        folder = self.store_dir / version
        if (folder / "metadata.json").exists():
            try:
                return await asyncio.to_thread(load_artifact, folder)
            except ArtifactError:
                pass  # a damaged cache entry: fetch it again
        assert self._http is not None, "start() first"
        base = f"{self.cloud_url}/v1/models/{self.name}/{version}"
        async with self._http.get(base, headers=self._headers) as response:
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
        await asyncio.to_thread(save_artifact, folder, artifact)
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
