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
        data_dir = self.path.parent
        if data_dir.exists() and not data_dir.is_dir():
            raise StartupError(f"data_dir {data_dir} is not a directory")
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a parent that is a file, no permission, a read-only file system
            raise StartupError(f"data_dir {data_dir}: cannot create {self.path}: {exc.strerror}") from None
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

    def holder(self) -> str | None:
        """Who holds the lock now, tried and let go at once (``gatewayctl check``): the pid its holder
        wrote (``"?"`` if none), or None when it is free or was never made."""
        try:
            fd = os.open(self.path, os.O_RDONLY)  # never created, nor truncated, here
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)  # closing lets go of a lock this took
        return None

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
