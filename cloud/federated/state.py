"""The federated job's durable state under ``<data_dir>/federated/``.

    weights-<version:08d>.f32   the global weights of one version (flat little-endian float32)
    state.json                  job, version, weights file, applied update ids, feed cursor, counters

Invariant: ``state.json`` names a weights file that is complete and fsynced (the weights are
written and fsynced first, then state.json is replaced atomically), so after any crash the state
is one whole version together with exactly the update ids applied to reach it; the feed resumes
from the saved cursor, so updates read but not yet aggregated are read (and buffered) again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from protocol.federated import FederatedJob
from runtime.files import atomic_write, fsync_dir

STATE_FILE = "state.json"
KEEP_WEIGHT_FILES = 2


@dataclass
class FederatedState:
    job: FederatedJob
    version: int
    weights: torch.Tensor = field(repr=False)
    version_ts: float
    applied: dict[str, dict[str, int]] = field(default_factory=dict)  # gateway -> {update_id: base_version}
    cursor: dict[str, tuple[int, int]] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def weights_name(version: int) -> str:
    return f"weights-{version:08d}.f32"


def save_state(folder: Path, state: FederatedState) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    name = weights_name(state.version)
    atomic_write(folder / name, state.weights.numpy().astype("<f4").tobytes())
    document = {
        "v": 1,
        "job": json.loads(state.job.model_dump_json()),
        "version": state.version,
        "weights_file": name,
        "version_ts": state.version_ts,
        "applied": state.applied,
        "cursor": {gw: list(pos) for gw, pos in state.cursor.items()},
        "counters": state.counters,
        "history": state.history,
    }
    atomic_write(folder / STATE_FILE, json.dumps(document).encode())
    fsync_dir(folder)
    old = sorted(p for p in folder.glob("weights-*.f32") if p.name != name)
    for path in old[: max(0, len(old) - (KEEP_WEIGHT_FILES - 1))]:
        path.unlink(missing_ok=True)


def load_state(folder: Path) -> FederatedState | None:
    path = folder / STATE_FILE
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    raw = (folder / doc["weights_file"]).read_bytes()
    weights = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())
    return FederatedState(
        job=FederatedJob.model_validate(doc["job"]),
        version=int(doc["version"]),
        weights=weights,
        version_ts=float(doc["version_ts"]),
        applied={gw: dict(ids) for gw, ids in doc["applied"].items()},
        cursor={gw: (int(p[0]), int(p[1])) for gw, p in doc["cursor"].items()},
        counters=doc.get("counters", {}),
        history=doc.get("history", []),
    )
