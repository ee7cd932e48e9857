"""Durable file writes: a file is replaced whole or not at all, and the replacement survives a crash.

    atomic_writer(path)   a context manager yielding a binary file; on a clean exit its bytes are
                          fsynced, renamed over ``path`` and the folder is fsynced
    atomic_write(path, b) the same for bytes in hand
    fsync_dir(folder)     make a folder's entries (a create, a rename, an unlink) durable
    remove_leftovers(path) remove the temporary files of writes of ``path`` that crashed

Invariant: after any crash ``path`` holds a whole old version or a whole new one. The temporary
file is ``.<name>.<random>.tmp`` in the same folder (a rename never crosses a file system, and
concurrent writers never share one); a leftover one is normal crash damage that readers ignore,
and one left by a failed write is removed at once. All of it blocks: call it from a thread.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from glob import escape as glob_escape
from pathlib import Path
from typing import BinaryIO


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """fsync a directory, so that the entries created, renamed or removed in it are durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file that replaces it only when the block ends cleanly.

    ``mode`` is the new file's permission bits (0o600 for secrets). An exception inside the block
    leaves ``path`` as it was and removes the temporary file.
    """
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_dir(target.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` durably (see ``atomic_writer``)."""
    with atomic_writer(path, mode) as handle:
        handle.write(data)


def remove_leftovers(path: str | os.PathLike[str]) -> int:
    """Remove the temporary files that crashed writes of ``path`` left behind; return how many.

    Only for a single-writer file whose writer is not running (at startup): a temporary file then
    belongs to a write that never reached its rename, so the file itself is still whole.
    """
    target = Path(path)
    removed = 0
    for leftover in target.parent.glob(f".{glob_escape(target.name)}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
            removed += 1
    return removed
