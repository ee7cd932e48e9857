"""A registry written before stages (entries without track or evaluation, no lifecycle file) reads as
before for gateways: its latest central version is production, the others candidates."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from cloud.registry import ModelRegistry
from models.artifact import save_artifact
from tests.harness.models import scene_variant


def old_entry(root: Path, version: str, seq: int) -> None:
    artifact = scene_variant(version)
    folder = root / "scene" / version
    save_artifact(folder, artifact)
    entry = {
        "name": "scene",
        "version": version,
        "sha256": artifact.metadata.sha256,
        "size": artifact.metadata.size,
        "seq": seq,
        "uploaded_ts": time.time(),
        "lineage": None,
    }
    (folder / "registry.json").write_text(json.dumps(entry))


async def test_old_entries_migrate_on_first_read(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for seq, version in enumerate(("a", "b", "c"), start=1):
        old_entry(root, version, seq)
    registry = ModelRegistry(root)
    entries = registry.entries("scene")
    assert [(e["version"], e["stage"], e["track"], e["evaluation"]) for e in entries] == [
        ("a", "candidate", "central", None),
        ("b", "candidate", "central", None),
        ("c", "production", "central", None),
    ]
    assert not (root / "scene" / "lifecycle.json").exists()  # reading writes nothing
    status, entry = await registry.store(scene_variant("d"))
    assert status == 201 and entry["stage"] == "candidate"
    state = registry.lifecycle("scene")
    assert state.production == "c" and state.stage("d") == "candidate"
    assert [e["action"] for e in state.events] == ["migrated", "stored"]
    assert json.loads((root / "scene" / "d" / "registry.json").read_text())["track"] == "central"


async def test_two_registries_on_one_folder_never_number_two_versions_alike(tmp_path):
    """As two cloudd replicas sharing the data directory: each has its own registry (its own asyncio
    lock), the folder's flock serialises them."""
    one, two = ModelRegistry(tmp_path / "models"), ModelRegistry(tmp_path / "models")
    versions = [f"v{i}" for i in range(8)]
    results = await asyncio.gather(
        *((one if i % 2 else two).store(scene_variant(v)) for i, v in enumerate(versions))
    )
    assert [status for status, _ in results] == [201] * len(versions)
    entries = one.entries("scene")
    assert sorted(e["seq"] for e in entries) == list(range(1, len(versions) + 1))
    events = [e for e in one.lifecycle("scene").events if e["action"] == "stored"]
    assert sorted(e["version"] for e in events) == sorted(versions)  # no change lost
