"""The log directory's whole-file replacements and segment removals, through the file layer (blocking).

Invariant: each returns only once what it did is durable, and leaves no state a crash could turn
into a lie: a replaced file is either the old one or the new one whole (tmp + fsync + rename +
directory fsync), and segments are removed oldest first, each removal durable before the next, so a
crash never leaves an older segment beside a hole where a newer one was.
"""

from __future__ import annotations

import os

from gateway.storage.filelayer import FileLayer


def replace_durably(layer: FileLayer, directory: str, name: str, data: bytes) -> None:
    """Replace the file ``name`` in ``directory`` whole with ``data``."""
    path = os.path.join(directory, name)
    fd = layer.open(path + ".tmp", create=True)
    try:
        layer.truncate(fd, 0)
        layer.pwrite(fd, data, 0)
        layer.fsync(fd)
    finally:
        layer.close(fd)
    layer.replace(path + ".tmp", path)
    layer.fsync_dir(directory)


def unlink_in_order(layer: FileLayer, directory: str, paths: list[str]) -> None:
    """Remove ``paths`` (segments, oldest first); unsynced unlinks may persist in any order."""
    for path in paths:
        try:
            layer.unlink(path)
        except FileNotFoundError:
            pass
        layer.fsync_dir(directory)
