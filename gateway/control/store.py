"""The control plane's file on disk: ``<data_dir>/control/desired.json`` (a StoredControl).

Invariant: the file is always a whole old version or a whole new one. ``atomic_write`` writes a
temporary file, fsyncs it, renames it over the target and fsyncs the directory, so a crash (or
power loss) at any moment leaves one of the two. A leftover temporary file is crash debris and is
removed silently at load; a file that does not parse is corruption: it is moved aside, reported,
and the gateway starts from its config file.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from pydantic import ValidationError

from protocol.control import StoredControl

log = logging.getLogger(__name__)

STORE_NAME = "desired.json"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: tmp + fsync + rename + fsync(dir). Blocking (use a thread)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class ControlStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STORE_NAME

    def load(self) -> StoredControl | None:
        """The stored state, or None if there is none yet (or it was corrupt and has been moved aside)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        if tmp.exists():
            tmp.unlink()  # a write that crashed before its rename: the old file is still whole
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return StoredControl.model_validate_json(raw)
        except ValidationError as exc:
            aside = self.path.with_name(f"{STORE_NAME}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("control: %s is not a valid control state (%s); moved to %s, starting from the "
                      "config file", self.path, exc.errors()[0]["msg"], aside.name)
            return None

    def save(self, stored: StoredControl) -> None:
        """Blocking: call from a thread. Raises OSError if the disk refuses; the old file then stands."""
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(stored.model_dump(mode="json"), sort_keys=True).encode())
