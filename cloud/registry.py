"""The model registry: versioned ONNX artifacts under ``DATA_DIR/models/<name>/<version>/``
(its HTTP routes are ``cloud/api/registry.py``).

An entry is ``{"name", "version", "sha256", "size", "seq", "uploaded_ts", "lineage"}``; ``seq``
counts a name's uploads from 1, and "latest" means the highest seq.

Invariant: a version folder is visible (has ``registry.json``) only after its ONNX file and
metadata are durably written and the bytes hash to the metadata's sha256; a stored version is
never overwritten.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypedDict

from models.artifact import ModelArtifact, load_artifact, save_artifact
from protocol.events import ModelMetadata
from protocol.topics import check_id
from runtime.files import atomic_write

ENTRY_FILE = "registry.json"
# What ``store`` did: 201 stored, 200 already stored with the same hash, 409 stored with other bytes.
StoreStatus = Literal[201, 200, 409]


class RegistryEntry(TypedDict):
    """One stored version: its ``registry.json``, and an item of GET /v1/models."""

    name: str
    version: str
    sha256: str
    size: int
    seq: int
    uploaded_ts: float
    lineage: dict[str, Any] | None  # what produced it; None if uploaded by hand


class ModelRegistry:
    """Files under ``root``; one instance per process (the lock orders seq assignment).

    Listeners (``add_listener``) are told of every new version, whoever stores it: the upload
    route, a training job, the federated coordinator.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[ModelMetadata], None]] = []

    def add_listener(self, listener: Callable[[ModelMetadata], None]) -> None:
        """Call ``listener(metadata)`` (on the loop; it must not block) after each new version."""
        self._listeners.append(listener)

    def folder(self, name: str, version: str) -> Path:
        return self.root / check_id("model", name) / check_id("version", version)

    def entries(self, name: str | None = None) -> list[RegistryEntry]:
        names = (
            [name]
            if name
            else sorted(p.name for p in self.root.iterdir() if p.is_dir())
            if self.root.exists()
            else []
        )
        found: list[RegistryEntry] = []
        for each in names:
            folder = self.root / each
            if not folder.is_dir():
                continue
            for version_dir in folder.iterdir():
                entry_file = version_dir / ENTRY_FILE
                if entry_file.exists():
                    found.append(json.loads(entry_file.read_text()))
        return sorted(found, key=lambda e: (e["name"], e["seq"]))

    def entry(self, name: str, version: str) -> RegistryEntry | None:
        entry_file = self.folder(name, version) / ENTRY_FILE
        return json.loads(entry_file.read_text()) if entry_file.exists() else None

    def load(self, name: str, version: str) -> ModelArtifact:
        return load_artifact(self.folder(name, version))

    async def store(self, artifact: ModelArtifact) -> tuple[StoreStatus, RegistryEntry]:
        """(HTTP status, entry): 201 stored, 200 already stored with the same hash, 409 conflict."""
        metadata = artifact.metadata
        async with self._lock:
            existing = self.entry(metadata.name, metadata.version)
            if existing is not None:
                return (200 if existing["sha256"] == metadata.sha256 else 409), existing
            seq = 1 + max((e["seq"] for e in self.entries(metadata.name)), default=0)
            entry = RegistryEntry(
                name=metadata.name,
                version=metadata.version,
                sha256=metadata.sha256,
                size=metadata.size,
                seq=seq,
                uploaded_ts=time.time(),
                lineage=metadata.notes.get("lineage"),
            )
            await asyncio.to_thread(self._write, artifact, entry)
        for listener in self._listeners:
            listener(metadata)
        return 201, entry

    def _write(self, artifact: ModelArtifact, entry: RegistryEntry) -> None:
        folder = self.folder(artifact.name, artifact.version)
        if folder.exists():  # leftovers of a crash before registry.json: not a stored version
            shutil.rmtree(folder)
        save_artifact(folder, artifact)
        atomic_write(folder / ENTRY_FILE, json.dumps(entry).encode())
