"""The log directory's whole-file replacements and segment removals, through the file layer (blocking).

Invariant: each returns only once what it did is durable, and leaves no state a crash could turn
into a lie: a replaced file is either the old one or the new one whole (tmp + fsync + rename +
directory fsync), and segments are removed oldest first, each removal durable before the next, so a
crash never leaves an older segment beside a hole where a newer one was. A failed fsync raises
``FsyncFailed`` (fatal: the caller fails the log, never retries); other errors (ENOSPC on a write)
are plain ``OSError``s the caller may retry.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gateway.storage.filelayer import FileLayer


class FsyncFailed(Exception):
    """An fsync (of a file or a directory) failed: the kernel may have dropped the dirty pages, so
    nothing written since the last good fsync can be trusted. Never retried."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(f"fsync failed: {cause}")
        self.cause = cause


def synced(sync: Callable[[], None]) -> None:
    """Run one fsync; its failure, whatever the errno (ENOSPC included), is ``FsyncFailed``."""
    try:
        sync()
    except OSError as exc:
        raise FsyncFailed(exc) from exc


def replace_durably(layer: FileLayer, directory: str, name: str, data: bytes) -> None:
    """Replace the file ``name`` in ``directory`` whole with ``data``."""
    path = os.path.join(directory, name)
    fd = layer.open(path + ".tmp", create=True)
    try:
        layer.truncate(fd, 0)
        layer.pwrite(fd, data, 0)
        synced(lambda: layer.fsync(fd))
    finally:
        layer.close(fd)
    layer.replace(path + ".tmp", path)
    synced(lambda: layer.fsync_dir(directory))


def unlink_in_order(layer: FileLayer, directory: str, paths: list[str]) -> None:
    """Remove ``paths`` (segments, oldest first); unsynced unlinks may persist in any order."""
    for path in paths:
        try:
            layer.unlink(path)
        except FileNotFoundError:
            pass
        synced(lambda: layer.fsync_dir(directory))
