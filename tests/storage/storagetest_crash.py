"""Power-loss crash states from a RecordingFileLayer trace (ALICE / SQLite-VFS style).

Invariant: a built state keeps every write that an fsync of its file (or, for names, of its
directory) covered before the cut; of the rest it keeps any subset, applied in any order, each
possibly torn (only a prefix of it reached the disk).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
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


@dataclass
class _Disk:
    """The files a trace has built so far: what an fsync made durable, and what is still pending."""

    files: dict[str, _File] = field(default_factory=dict)
    # a replace() target's old file: what the name holds if the rename is lost (until a dir sync)
    displaced: dict[str, _File] = field(default_factory=dict)
    marks: dict[str, int] = field(default_factory=dict)  # tag -> largest value marked

    def create(self, op: Op) -> None:
        self.files[op.path] = _File()

    def write(self, op: Op) -> None:  # a write or a truncate: pending until its file is fsynced
        self.files[op.path].pending.append(op)

    def fsync(self, op: Op) -> None:
        model = self.files[op.path]
        for pending in model.pending:
            _apply(model.durable, pending)
        model.pending.clear()

    def fsync_dir(self, op: Op) -> None:
        for path in [p for p, m in self.files.items() if os.path.dirname(p) == op.path]:
            self.files[path].name_durable = True
            if self.files[path].unlinked:
                del self.files[path]
        self.displaced = {p: m for p, m in self.displaced.items() if os.path.dirname(p) != op.path}

    def unlink(self, op: Op) -> None:
        self.files[op.path].unlinked = True

    def replace(self, op: Op) -> None:
        if op.other in self.files and op.other not in self.displaced:
            self.displaced[op.other] = self.files[op.other]
        self.files[op.other] = self.files.pop(op.path)
        self.files[op.other].name_durable = False

    def mark(self, op: Op) -> None:
        self.marks[op.other] = max(self.marks.get(op.other, 0), op.offset)


# op kind -> how it changes the disk model (kinds not listed leave it as it is)
_REPLAY: dict[str, Callable[[_Disk, Op], None]] = {
    "create": _Disk.create,
    "write": _Disk.write,
    "truncate": _Disk.write,
    "fsync": _Disk.fsync,
    "fsync_dir": _Disk.fsync_dir,
    "unlink": _Disk.unlink,
    "replace": _Disk.replace,
    "mark": _Disk.mark,
}


def build_crash_state(
    trace: list[Op], cut: int, rng: random.Random, source: Path, target: Path, reorder: bool = True
) -> dict[str, int]:
    """Write the files a power cut after ``trace[:cut]`` could leave into ``target``.
    Returns the largest value of each mark tag seen before the cut."""
    disk = _Disk()
    for op in trace[:cut]:
        replay = _REPLAY.get(op.kind)
        if replay is not None:
            replay(disk, op)
    target.mkdir(parents=True, exist_ok=True)
    for path, model in disk.files.items():
        survivor = _surviving_file(model, disk.displaced.get(path), rng)
        if survivor is not None:
            (target / os.path.relpath(path, source)).write_bytes(_content_after_cut(survivor, rng, reorder))
    return disk.marks


def _surviving_file(model: _File, displaced: _File | None, rng: random.Random) -> _File | None:
    """The file a name holds after the cut: its latest file if the name survived, else the file a
    replace() displaced (if any)."""
    return model if op_path_kept(model, rng) else displaced


def _content_after_cut(model: _File, rng: random.Random, reorder: bool) -> bytes:
    """The durable bytes, then a random subset of the pending writes, possibly reordered and torn."""
    content = bytearray(model.durable)
    survivors = [op for op in model.pending if rng.random() < 0.6]
    if reorder:
        rng.shuffle(survivors)
    for op in survivors:
        torn = op.kind == "write" and rng.random() < 0.3
        _apply(content, op, _torn_length(rng, len(op.data)) if torn else None)
    return bytes(content)


def op_path_kept(model: _File, rng: random.Random) -> bool:
    if model.unlinked:
        return rng.random() < 0.5
    return model.name_durable or rng.random() < 0.5
