"""The gateway's data dir: one daemon at a time (an flock), and the durable log inside it.

Invariant: while a ``DataDirLock`` is held no other gatewayd uses the data dir; ``open_record_log``
is the one place the daemon's durable log is built.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gateway.storage.epoch_log import EpochLog
from protocol.config import GatewayConfig


class StartupError(Exception):
    """A condition that prevents starting, with a one-line message for the operator (exit 2)."""


class DataDirLock:
    """An exclusive flock on ``<data_dir>/gatewayd.lock``, held for the daemon's life."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "gatewayd.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartupError(
                f"data dir {self.path.parent} is in use by another gatewayd (lock {self.path} is held)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def record_log_dir(config: GatewayConfig) -> Path:
    """Where the daemon's durable log lives."""
    return config.data_dir / "log"


def open_record_log(config: GatewayConfig) -> EpochLog:
    """The one place the daemon's durable log is built."""
    return EpochLog(
        record_log_dir(config),
        segment_bytes=config.log.segment_bytes,
        max_bytes=config.log.max_bytes,
        full_policy=config.log.full_policy,
        scrub_interval_s=config.log.scrub_interval_s,
        scrub_rate_Bps=config.log.scrub_rate_Bps,
    )
