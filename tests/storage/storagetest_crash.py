"""Power-loss crash states from a RecordingFileLayer trace (ALICE / SQLite-VFS style).

Invariant: a built state keeps every write that an fsync of its file (or, for names, of its
directory) covered before the cut; of the rest it keeps any subset, applied in any order, each
possibly torn (only a prefix of it reached the disk).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from gateway.storage.filelayer import Op


@dataclass
class _File:
    durable: bytearray = field(default_factory=bytearray)
    pending: list[Op] = field(default_factory=list)
    name_durable: bool = False
    unlinked: bool = False  # unlinked, but the directory was not synced since


def _apply(content: bytearray, op: Op, keep: int | None = None) -> None:
    if op.kind == "truncate":
        del content[op.offset :]
        content.extend(bytes(max(0, op.offset - len(content))))
        return
    data = op.data if keep is None else op.data[:keep]
    end = op.offset + len(data)
    if len(content) < end:
        content.extend(bytes(end - len(content)))
    content[op.offset : end] = data


def _torn_length(rng: random.Random, size: int) -> int:
    if size <= 1:
        return 0
    if rng.random() < 0.5 and size > 512:
        return rng.randrange(0, size, 512)  # sector-granular tear
    return rng.randrange(0, size)


def build_crash_state(
    trace: list[Op], cut: int, rng: random.Random, source: Path, target: Path, reorder: bool = True
) -> dict[str, int]:
    """Write the files a power cut after ``trace[:cut]`` could leave into ``target``.
    Returns the largest value of each mark tag seen before the cut."""
    files: dict[str, _File] = {}
    displaced: dict[str, _File] = {}  # replace() target's old file, until the directory is synced
    marks: dict[str, int] = {}
    for op in trace[:cut]:
        if op.kind == "create":
            files[op.path] = _File()
        elif op.kind in ("write", "truncate"):
            files[op.path].pending.append(op)
        elif op.kind == "fsync":
            model = files[op.path]
            for pending in model.pending:
                _apply(model.durable, pending)
            model.pending.clear()
        elif op.kind == "fsync_dir":
            for path in [p for p, m in files.items() if os.path.dirname(p) == op.path]:
                files[path].name_durable = True
                if files[path].unlinked:
                    del files[path]
            displaced = {p: m for p, m in displaced.items() if os.path.dirname(p) != op.path}
        elif op.kind == "unlink":
            files[op.path].unlinked = True
        elif op.kind == "replace":
            if op.other in files and op.other not in displaced:
                displaced[op.other] = files[op.other]
            files[op.other] = files.pop(op.path)
            files[op.other].name_durable = False
        elif op.kind == "mark":
            marks[op.other] = max(marks.get(op.other, 0), op.offset)
    target.mkdir(parents=True, exist_ok=True)
    for path, model in files.items():
        if op_path_kept(model, rng):
            chosen = model
        elif path in displaced:
            chosen = displaced[path]
        else:
            continue
        content = bytearray(chosen.durable)
        pending = [p for p in chosen.pending if rng.random() < 0.6]
        if reorder:
            rng.shuffle(pending)
        for op in pending:
            torn = op.kind == "write" and rng.random() < 0.3
            _apply(content, op, _torn_length(rng, len(op.data)) if torn else None)
        (target / os.path.relpath(path, source)).write_bytes(bytes(content))
    return marks


def op_path_kept(model: _File, rng: random.Random) -> bool:
    if model.unlinked:
        return rng.random() < 0.5
    return model.name_durable or rng.random() < 0.5
