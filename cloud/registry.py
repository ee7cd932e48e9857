"""The model registry: versioned ONNX artifacts under ``DATA_DIR/models/<name>/<version>/``
(its HTTP routes are ``cloud/api/registry.py``).

An entry is ``{"name", "version", "sha256", "size", "seq", "uploaded_ts", "lineage", "track",
"evaluation", "factory", "stage"}``; ``seq`` counts a name's uploads from 1. ``track`` is "central"
or "federated" (federated rounds: listed only when asked for); ``evaluation`` is the quality gate's
verdict (``cloud/rollout/gate.py``; None for versions uploaded by hand and the factory model);
``stage`` is not stored in the entry but read from the name's lifecycle (``cloud/rollout/
lifecycle.py``), which ``change_lifecycle`` alone changes. Entries written before tracks and
evaluations read as track "central", evaluation None, factory False.

Invariant: a version folder is visible (has ``registry.json``) only after its ONNX file and
metadata are durably written and the bytes hash to the metadata's sha256; a stored version is
never overwritten nor deleted; lifecycle changes and seq assignment are serialized by one lock,
across processes too (an asyncio lock, then an exclusive ``flock`` on ``DATA_DIR/models/.lock``):
cloudd replicas sharing the data directory (docs/cloud.md, "Replicas") never number two versions
alike nor lose a lifecycle change.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar, cast

from cloud.rollout.lifecycle import Lifecycle, read_lifecycle, write_lifecycle
from models.artifact import METADATA_FILE, ModelArtifact, load_artifact, save_artifact
from protocol.events import ModelMetadata, parse_model_metadata
from protocol.topics import check_id
from runtime.files import atomic_write

ENTRY_FILE = "registry.json"
LOCK_FILE = ".lock"  # a file, so never listed as a model name (names() lists folders)
LOCK_WAIT_S = 60.0  # another replica storing a large model holds it while it writes
# What ``store`` did: 201 stored, 200 already stored with the same hash, 409 stored with other bytes.
StoreStatus = Literal[201, 200, 409]
Track = Literal["central", "federated"]
TRACKS = ("central", "federated")
T = TypeVar("T")


class RegistryEntry(TypedDict):
    """One stored version: its ``registry.json``, and an item of GET /v1/models."""

    name: str
    version: str
    sha256: str
    size: int
    seq: int
    uploaded_ts: float
    lineage: dict[str, Any] | None  # what produced it; None if uploaded by hand
    track: Track
    evaluation: dict[str, Any] | None  # the quality gate's verdict; None: not evaluated
    factory: bool  # the model shipped in models/artifacts/: never archived by a rollback, always pinnable
    stage: str  # from the lifecycle, filled in when read


def _read_entry(entry_file: Path) -> RegistryEntry:
    """An entry file as an entry; one written before tracks and evaluations gets their defaults."""
    raw = {"track": "central", "evaluation": None, "factory": False, "stage": "candidate"}
    raw.update(json.loads(entry_file.read_text()))
    return cast(RegistryEntry, raw)


def _try_lock(path: Path) -> int | None:
    """The fd holding an exclusive flock on ``path``, or None if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class ModelRegistry:
    """Files under ``root``; one instance per process (the lock orders seq assignment).

    Listeners (``add_listener``) are told of every new version, whoever stores it: the upload
    route, a training job, the federated coordinator.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[ModelMetadata], None]] = []
        self._lifecycle_listeners: list[Callable[[str], None]] = []

    @asynccontextmanager
    async def _serialised(self) -> AsyncIterator[None]:
        """This process's lock, then every process's (polled without blocking, so a cancelled
        caller never leaves a lock taken behind it)."""
        async with self._lock:
            async with asyncio.timeout(LOCK_WAIT_S):
                fd = _try_lock(self.root / LOCK_FILE)
                while fd is None:
                    await asyncio.sleep(0.02)  # another replica holds it: its changes take milliseconds
                    fd = _try_lock(self.root / LOCK_FILE)
            try:
                yield
            finally:
                os.close(fd)  # releases the flock

    def add_listener(self, listener: Callable[[ModelMetadata], None]) -> None:
        """Call ``listener(metadata)`` (on the loop; it must not block) after each new version."""
        self._listeners.append(listener)

    def add_lifecycle_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` (on the loop; it must not block) after each lifecycle change."""
        self._lifecycle_listeners.append(listener)

    def metadata(self, name: str, version: str) -> ModelMetadata:
        return parse_model_metadata((self.folder(name, version) / METADATA_FILE).read_bytes())

    def folder(self, name: str, version: str) -> Path:
        return self.root / check_id("model", name) / check_id("version", version)

    def entries(self, name: str | None = None, track: str | None = None) -> list[RegistryEntry]:
        """Entries by name then seq, each with its stage; only ``track``'s when given."""
        found = self._stored_entries(name)
        lifecycles = {n: self.lifecycle(n, found) for n in {e["name"] for e in found}}
        for entry in found:
            entry["stage"] = lifecycles[entry["name"]].stage(entry["version"])
        return [e for e in found if track is None or e["track"] == track]

    def lifecycle(self, name: str, stored: list[RegistryEntry] | None = None) -> Lifecycle:
        """The name's stages, aliases and events (a name stored before stages: migrated on read)."""
        stored = self._stored_entries(name) if stored is None else stored
        central = [e["version"] for e in stored if e["name"] == name and e["track"] == "central"]
        return read_lifecycle(self.root / check_id("model", name), central)

    async def change_lifecycle(self, name: str, change: Callable[[Lifecycle], T]) -> T:
        """Apply ``change`` (which may raise, changing nothing) to the name's lifecycle and persist it."""
        async with self._serialised():
            state = self.lifecycle(name)
            result = change(state)
            await asyncio.to_thread(write_lifecycle, self.root / check_id("model", name), state)
        for listener in self._lifecycle_listeners:
            listener(name)
        return result

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.exists() else []

    def factory_version(self, name: str) -> str | None:
        return next((e["version"] for e in self._stored_entries(name) if e["factory"]), None)

    def _stored_entries(self, name: str | None = None) -> list[RegistryEntry]:
        names = [name] if name else self.names()
        found: list[RegistryEntry] = []
        for each in names:
            folder = self.root / each
            if not folder.is_dir():
                continue
            for version_dir in folder.iterdir():
                entry_file = version_dir / ENTRY_FILE
                if entry_file.exists():
                    found.append(_read_entry(entry_file))
        return sorted(found, key=lambda e: (e["name"], e["seq"]))

    def entry(self, name: str, version: str) -> RegistryEntry | None:
        entry_file = self.folder(name, version) / ENTRY_FILE
        if not entry_file.exists():
            return None
        entry = _read_entry(entry_file)
        entry["stage"] = self.lifecycle(name).stage(version)
        return entry

    def load(self, name: str, version: str) -> ModelArtifact:
        return load_artifact(self.folder(name, version))

    async def store(
        self,
        artifact: ModelArtifact,
        *,
        track: Track = "central",
        evaluation: dict[str, Any] | None = None,
        factory: bool = False,
    ) -> tuple[StoreStatus, RegistryEntry]:
        """(HTTP status, entry): 201 stored (stage candidate), 200 already stored with the same hash,
        409 conflict."""
        metadata = artifact.metadata
        async with self._serialised():
            existing = self.entry(metadata.name, metadata.version)
            if existing is not None:
                return (200 if existing["sha256"] == metadata.sha256 else 409), existing
            seq = 1 + max((e["seq"] for e in self._stored_entries(metadata.name)), default=0)
            entry = RegistryEntry(
                name=metadata.name,
                version=metadata.version,
                sha256=metadata.sha256,
                size=metadata.size,
                seq=seq,
                uploaded_ts=time.time(),
                lineage=metadata.notes.get("lineage"),
                track=track,
                evaluation=evaluation,
                factory=factory,
                stage="candidate",
            )
            # the lifecycle is read (migrated) before the new version is visible, so it stays a candidate
            state = self.lifecycle(metadata.name)
            state.record(
                {"ts": entry["uploaded_ts"], "action": "stored", "version": entry["version"], "track": track}
                | ({"promotable": evaluation["promotable"]} if evaluation else {})
            )
            await asyncio.to_thread(self._write, artifact, entry)
            await asyncio.to_thread(write_lifecycle, self.root / metadata.name, state)
        for listener in self._listeners:
            listener(metadata)
        return 201, entry

    def _write(self, artifact: ModelArtifact, entry: RegistryEntry) -> None:
        folder = self.folder(artifact.name, artifact.version)
        if folder.exists():  # leftovers of a crash before registry.json: not a stored version
            shutil.rmtree(folder)
        save_artifact(folder, artifact)
        stored = {k: v for k, v in entry.items() if k != "stage"}  # the stage lives in the lifecycle
        atomic_write(folder / ENTRY_FILE, json.dumps(stored).encode())
