"""Per-stage checkpoints: ``<dir>/stage<S>/step<N>.pt``, written atomically, resumed when complete.

Each stage's replica 0 writes its own file (replicas hold identical weights after the flush).
A write goes to a temporary file that is fsynced, then renamed over the final name, and the folder
is fsynced: a crash leaves either no file or a whole one, never a torn one (a leftover ``.tmp``
is normal crash damage and ignored). A step is COMPLETE when every stage has a file for it.

Files hold CPU tensors whatever device trained (``save_stage`` copies them off a GPU) and load
onto the CPU (``load_stage``); ``load_state_dict`` then copies model weights onto the module's
device and ``Optimizer.load_state_dict`` moves the state to its parameters' device, so a job
checkpointed on a GPU resumes on a CPU and the other way round.

Invariant: ``latest_complete_step`` returns the largest step for which every stage has a file
(or None), so all ranks of a resumed job load weights from the same step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import torch

from runtime.files import atomic_writer

_STEP_RE = re.compile(r"^step(\d+)\.pt$")
T = TypeVar("T")


def stage_dir(root: str | Path, stage: int) -> Path:
    return Path(root) / f"stage{stage}"


def save_stage(root: str | Path, stage: int, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    folder = stage_dir(root, stage)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step{step:08d}.pt"
    with atomic_writer(final) as handle:
        torch.save(on_cpu(state), handle)
    # Older files go only after a newer one is whole; keep >= 2 so that a step some other stage
    # has not finished writing yet still has a complete predecessor.
    for old in stage_steps(root, stage)[:-keep]:
        (folder / f"step{old:08d}.pt").unlink(missing_ok=True)
    return final


def on_cpu(state: T) -> T:
    """``state`` with every tensor in its dicts, lists and tuples copied to the CPU (CPU ones kept)."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()  # type: ignore[return-value]
    if isinstance(state, dict):
        return type(state)((k, on_cpu(v)) for k, v in state.items())
    if isinstance(state, list | tuple):
        return type(state)(on_cpu(v) for v in state)
    return state


def stage_steps(root: str | Path, stage: int) -> list[int]:
    folder = stage_dir(root, stage)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for m in (_STEP_RE.match(p.name) for p in folder.iterdir()) if m)


def latest_complete_step(root: str | Path, n_stages: int) -> int | None:
    common: set[int] | None = None
    for stage in range(n_stages):
        steps = set(stage_steps(root, stage))
        common = steps if common is None else common & steps
    return max(common) if common else None


def load_stage(root: str | Path, stage: int, step: int) -> dict[str, Any]:
    return torch.load(stage_dir(root, stage) / f"step{step:08d}.pt", map_location="cpu", weights_only=False)
