"""The control plane's file on disk: ``<data_dir>/control/desired.json`` (a StoredControl).

Invariant: the file is always a whole old version or a whole new one. ``runtime.files.atomic_write``
writes a temporary file, fsyncs it, renames it over the target and fsyncs the directory, so a crash (or
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
from runtime.files import atomic_write, remove_leftovers

log = logging.getLogger(__name__)

STORE_NAME = "desired.json"


class ControlStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STORE_NAME

    def load(self) -> StoredControl | None:
        """The stored state, or None if there is none yet (or it was corrupt and has been moved aside)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_leftovers(self.path)  # writes that crashed before their rename: the file is still whole
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return StoredControl.model_validate_json(raw)
        except ValidationError as exc:
            aside = self.path.with_name(f"{STORE_NAME}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            log.error(
                "control: %s is not a valid control state (%s); moved to %s, starting from the config file",
                self.path,
                exc.errors()[0]["msg"],
                aside.name,
            )
            return None

    def save(self, stored: StoredControl) -> None:
        """Blocking: call from a thread. Raises OSError if the disk refuses; the old file then stands."""
        self.directory.mkdir(parents=True, exist_ok=True)
        document = json.dumps(stored.model_dump(mode="json"), sort_keys=True)
        atomic_write(self.path, document.encode(), mode=0o600)
