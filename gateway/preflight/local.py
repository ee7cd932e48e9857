"""The checks of ``gatewayctl check`` that need no network: the config, the extras it needs, the data
dir, its lock, the disk under it, and the HTTP port.

Invariant: they look and change nothing: the only file made is a probe, removed at once; the lock is
tried without waiting and let go at once; the port is bound and closed at once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from gateway.control.wiring import base_from_file
from gateway.datadir import DataDirLock, record_log_dir
from gateway.extras import SECTION_EXTRA, missing_extras, missing_modules, module_installed, needs_extra
from gateway.preflight.outcome import Check, size
from protocol.config import GatewayConfig, load_gateway_config, parse_listen
from protocol.errors import ProtocolError


def check_config(path: Path) -> tuple[Check, GatewayConfig | None]:
    """The file validates as gatewayd reads it (the file alone, then as the control plane's base)."""
    try:
        config = load_gateway_config(path)
        base_from_file(config)
    except ProtocolError as exc:  # ControlError included
        return Check("config", "FAIL", f"{path}: {exc.detail}"), None
    return Check("config", "OK", f"{path}: gateway {config.gateway_id}, data_dir {config.data_dir}"), config


def check_extras(config: GatewayConfig, installed: Callable[[str], bool] = module_installed) -> Check:
    """Each section the config enables has its extra installed (else gatewayd refuses to start)."""
    refused = missing_extras(config, installed)
    if refused:
        return Check("extras", "FAIL", "; ".join(refused))
    missing = missing_modules(SECTION_EXTRA["camera"], installed)
    if config.camera is not None and missing:  # [camera] is there but off: enabling it would fail
        return Check(
            "extras", "WARN", f"[camera] is off; enabling it fails: {needs_extra('camera', missing)}"
        )
    camera_on = config.camera is not None and config.camera.enabled
    enabled = [name for name, on in (("[camera]", camera_on), ("[training]", config.training.enabled)) if on]
    if not enabled:
        return Check("extras", "OK", "no section that needs an extra is enabled (the core install runs it)")
    return Check("extras", "OK", f"{', '.join(enabled)}: their extras are installed")


def nearest_existing(path: Path) -> Path:
    """``path``, or the nearest folder above it that exists (where gatewayd would create it)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe_write(folder: Path) -> str | None:
    """Write, fsync and remove a small file in ``folder``; the error, or None if that worked."""
    try:
        fd, name = tempfile.mkstemp(prefix=".gatewayctl-check-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        os.write(fd, b"check\n")
        os.fsync(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
        os.unlink(name)
    return None


def check_data_dir(config: GatewayConfig) -> Check:
    """The data dir exists and takes writes, or can be made (its nearest existing parent takes writes)."""
    data_dir = config.data_dir
    if data_dir.exists():
        if not data_dir.is_dir():
            return Check("data_dir", "FAIL", f"{data_dir} is not a directory")
        error = _probe_write(data_dir)
        if error is not None:
            return Check("data_dir", "FAIL", f"{data_dir} is not writable: {error}")
        return Check("data_dir", "OK", f"{data_dir} exists and is writable")
    parent = nearest_existing(data_dir)
    if not parent.is_dir():
        return Check("data_dir", "FAIL", f"{data_dir} cannot be made: {parent} is not a directory")
    error = _probe_write(parent)
    if error is not None:
        return Check("data_dir", "FAIL", f"{data_dir} cannot be made: {parent} is not writable: {error}")
    return Check(
        "data_dir", "OK", f"{data_dir} does not exist yet; gatewayd will make it ({parent} is writable)"
    )


def check_lock(config: GatewayConfig) -> tuple[Check, bool]:
    """Whether a gatewayd holds the data dir now; and True if one does."""
    lock = DataDirLock(config.data_dir)
    try:
        holder = lock.holder()
    except OSError as exc:
        return Check("lock", "FAIL", f"cannot open {lock.path}: {exc.strerror or exc}"), False
    if holder is None:
        return Check("lock", "OK", f"no gatewayd runs on {config.data_dir}"), False
    detail = f"a gatewayd runs on {config.data_dir} (pid {holder}, {lock.path}); a second one would not start"
    return Check("lock", "WARN", detail), True


def _bytes_in(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*") if folder.is_dir() else ():
        with contextlib.suppress(FileNotFoundError):  # a segment the running gatewayd trimmed meanwhile
            total += path.stat().st_size if path.is_file() else 0
    return total


def check_disk(config: GatewayConfig) -> Check:
    """The disk under the data dir has room for what the log may still grow by (``log.max_bytes``)."""
    where = nearest_existing(config.data_dir)
    try:
        used = _bytes_in(record_log_dir(config))
        free = shutil.disk_usage(where).free
    except OSError as exc:
        return Check("disk", "WARN", f"cannot measure {where}: {exc.strerror or exc}")
    room = max(0, config.log.max_bytes - used)
    budget = f"log.max_bytes {size(config.log.max_bytes)}, {size(used)} used"
    if free < room:
        detail = f"{size(free)} free on {where}, but the log may grow by {size(room)} ({budget})"
        return Check("disk", "WARN", detail + ": the disk fills first")
    return Check("disk", "OK", f"{size(free)} free on {where}; the log may grow by {size(room)} ({budget})")


def check_http(config: GatewayConfig, gatewayd_running: bool) -> Check:
    """The status port (``http.listen``) can be listened on; in use is expected while gatewayd runs."""
    try:
        with socket.create_server(parse_listen(config.http.listen)):  # valid: the config was validated
            pass
    except OSError as exc:
        if gatewayd_running:
            return Check("http", "OK", f"{config.http.listen} in use, by the running gatewayd presumably")
        return Check("http", "FAIL", f"http.listen {config.http.listen}: {exc.strerror or exc}")
    return Check("http", "OK", f"{config.http.listen} is free")
