"""The systemd notify protocol, done by hand (no dependency): datagrams to ``$NOTIFY_SOCKET``.

``READY=1`` once started, ``RELOADING=1``/``READY=1`` around a SIGHUP reload, ``STOPPING=1`` when
stopping, ``STATUS=...`` for ``systemctl status``, and ``WATCHDOG=1`` every half ``$WATCHDOG_USEC``
from a task on the daemon's event loop: if the loop hangs, the pings stop and systemd restarts us.

Invariant: without ``$NOTIFY_SOCKET`` every call is a no-op, and a failed send is counted and never
raised: the service manager's absence or hiccup must not stop the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def notify_address(env: Mapping[str, str]) -> str | None:
    """The socket path from ``NOTIFY_SOCKET``; a leading ``@`` means the abstract namespace (``\\0``)."""
    path = env.get("NOTIFY_SOCKET")
    if not path:
        return None
    return "\0" + path[1:] if path.startswith("@") else path


def watchdog_interval_s(env: Mapping[str, str], pid: int) -> float | None:
    """Half of ``WATCHDOG_USEC`` (systemd's advice), if the watchdog is on for this process."""
    usec = env.get("WATCHDOG_USEC")
    owner = env.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if owner and owner.isdigit() and int(owner) != pid:
        return None
    return int(usec) / 2e6


class SystemdNotifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = notify_address(env)
        self.watchdog_s = watchdog_interval_s(env, os.getpid())
        self.sent = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; False (counted) if it could not be sent."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall("\n".join(fields).encode())
        except OSError as exc:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning("sd_notify to %r failed (%d so far): %s", self.address, self.failures, exc)
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> None:
        self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> None:
        monotonic_usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def stopping(self, status: str = "") -> None:
        self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def start_watchdog(self, healthy: Callable[[], bool] = lambda: True) -> None:
        """Ping every half interval while ``healthy()``; the caller owns the task (``stop_watchdog``)."""
        if self.address is None or self.watchdog_s is None or self._task is not None:
            return
        self._task = asyncio.create_task(self._watchdog(healthy), name="sd-watchdog")

    async def _watchdog(self, healthy: Callable[[], bool]) -> None:
        assert self.watchdog_s is not None
        while True:
            if healthy():
                self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s)

    async def stop_watchdog(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
