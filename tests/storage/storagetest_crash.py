"""Power-loss crash states from a RecordingFileLayer trace (ALICE / SQLite-VFS style).

A state can start from a directory (``base``: a crash state whose recovery was traced), so a crash
during or after recovery is a crash state of the recovery's own trace.

Invariant: a built state keeps every write that an fsync of its file (or, for names, of its
directory) covered before the cut, and every file of ``base`` as it was; of the rest it keeps any
subset, applied in any order, each possibly torn: a prefix of it (at byte or 512-byte sector
granularity) or any subset of the 512-byte sectors it touches (a disk writes a sector whole or not
at all, and the sectors of one write in any order).
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


SECTOR = 512


def _apply(content: bytearray, op: Op, pieces: list[tuple[int, int]] | None = None) -> None:
    """Apply ``op``; for a torn write only ``pieces`` of its data (start, end), the rest never written."""
    if op.kind == "truncate":
        del content[op.offset :]
        content.extend(bytes(max(0, op.offset - len(content))))
        return
    for start, end in [(0, len(op.data))] if pieces is None else pieces:
        at = op.offset + start
        if len(content) < op.offset + end:
            content.extend(bytes(op.offset + end - len(content)))
        content[at : op.offset + end] = op.data[start:end]


def _torn_pieces(rng: random.Random, op: Op) -> list[tuple[int, int]]:
    """What of a torn write reached the disk: a prefix (byte or sector granular), or a random subset
    of the file's 512-byte sectors it touches."""
    size = len(op.data)
    first_boundary = -op.offset % SECTOR
    cuts = [0, *range(first_boundary or SECTOR, size, SECTOR), size]
    sectors = list(zip(cuts, cuts[1:], strict=False))
    mode = rng.random()
    if mode < 1 / 3 or len(sectors) < 2:
        return [(0, rng.randrange(size))] if size > 1 else []
    if mode < 2 / 3:
        return sectors[: rng.randrange(len(sectors))]
    return [sector for sector in sectors if rng.random() < 0.5]


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
    trace: list[Op],
    cut: int,
    rng: random.Random,
    source: Path,
    target: Path,
    reorder: bool = True,
    base: Path | None = None,
) -> dict[str, int]:
    """Write the files a power cut after ``trace[:cut]`` could leave into ``target``; ``trace`` ran on
    ``source``, which held the files of ``base`` (durable) when it began, if given.
    Returns the largest value of each mark tag seen before the cut."""
    disk = _Disk()
    for path in base.iterdir() if base is not None else ():
        disk.files[str(source / path.name)] = _File(bytearray(path.read_bytes()), name_durable=True)
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
        _apply(content, op, _torn_pieces(rng, op) if torn else None)
    return bytes(content)


def op_path_kept(model: _File, rng: random.Random) -> bool:
    if model.unlinked:
        return rng.random() < 0.5
    return model.name_durable or rng.random() < 0.5
