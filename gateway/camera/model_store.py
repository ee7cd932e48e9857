"""The versions of one model this gateway holds, and what it was told to run: the factory artifact
(shipped with the code, ``models/artifacts/<model>`` or ``[camera] artifact_dir``; never deleted),
the versions it downloaded (``<store>/<name>/<version>/``), the pin (``pin.json``) and the version
that ran last with its stage (``running.json``), so a restart starts where the last run ended.

Owner: the camera's ``ModelUpdater`` (gateway/camera/ota.py); blocking file work runs in threads.

Invariant: ``load`` returns only an intact artifact (its bytes hash to its metadata's sha256) of the
version asked for, and of the sha256 asked for when one is given; the factory version is always
loadable, offline included, so it can always be pinned and fallen back to.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from models.artifact import METADATA_FILE, ArtifactError, ModelArtifact, load_artifact, save_artifact
from protocol.events import parse_model_metadata
from runtime.files import atomic_write


@dataclass(frozen=True)
class RunningNote:
    """What ran last: the version and its stage (``running.json``)."""

    version: str
    stage: str | None


class LocalModels:
    def __init__(self, store_dir: Path, name: str, factory_dir: Path) -> None:
        """``factory_dir`` must hold a readable metadata.json (ArtifactError otherwise): a gateway
        without its factory model has nothing to fall back to."""
        self.folder = store_dir / name
        self.name, self.factory_dir = name, factory_dir
        try:
            self.factory_version = parse_model_metadata((factory_dir / METADATA_FILE).read_bytes()).version
        except (OSError, ValueError) as exc:
            raise ArtifactError("unreadable", f"factory model {factory_dir}: {exc}") from None

    # --- what to run ------------------------------------------------------------------------------

    def pinned(self) -> str | None:
        return _read(self.folder / "pin.json", "version")

    def set_pin(self, version: str | None) -> None:
        if version is None:
            (self.folder / "pin.json").unlink(missing_ok=True)
        else:
            _write(self.folder / "pin.json", {"version": version})

    def last_running(self) -> RunningNote | None:
        version = _read(self.folder / "running.json", "version")
        return None if version is None else RunningNote(version, _read(self.folder / "running.json", "stage"))

    def set_running(self, note: RunningNote) -> None:
        _write(self.folder / "running.json", {"version": note.version, "stage": note.stage})

    # --- the bytes --------------------------------------------------------------------------------

    async def load(self, version: str, sha256: str | None = None) -> ModelArtifact | None:
        """The held artifact of ``version`` (and ``sha256``), downloaded or factory; None if not held
        (or damaged: then it is fetched again)."""
        for folder in (self.folder / version, self.factory_dir):
            if not (folder / METADATA_FILE).exists():
                continue
            try:
                artifact = await asyncio.to_thread(load_artifact, folder)
            except ArtifactError:
                continue  # a damaged cache entry: fetch it again
            if artifact.version == version and sha256 in (None, artifact.metadata.sha256):
                return artifact
        return None

    async def factory(self) -> ModelArtifact:
        return await asyncio.to_thread(load_artifact, self.factory_dir)

    async def save(self, artifact: ModelArtifact) -> None:
        await asyncio.to_thread(save_artifact, self.folder / artifact.version, artifact)


def default_artifact_dir(model: str) -> Path:
    """The artifact shipped with the code: ``models/artifacts/<model>``."""
    import models

    return Path(models.__file__).resolve().parent / "artifacts" / model


def _read(path: Path, key: str) -> str | None:
    try:
        value = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None  # absent, or torn by a crash before atomic writes: as if never written
    return value if isinstance(value, str) else None


def _write(path: Path, value: dict[str, str | None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(value).encode())
