"""The hint for a plain ``mqtt://`` connection to a broker that speaks TLS: "the broker at HOST:PORT
may expect TLS: use mqtts://" (runtime/tls_probe.py finds out).

Invariant: one ``TlsHint`` per adapter probes at most once, and only after a connection on a plain
URL ended before the CONNACK; it adds the hint to every such failure of its adapter, and the hint
is logged once per broker address in the process (gatewayd's data, control and camera connections
go to the same broker: one line, not three).
"""

from __future__ import annotations

import asyncio
import logging

from gateway.mqtt.types import MqttClosedBeforeConnack, MqttError, MqttSettings
from runtime.tls_probe import speaks_tls, tls_hint

log = logging.getLogger(__name__)

_logged: set[tuple[str, int]] = set()  # broker addresses whose hint this process has logged


class TlsHint:
    def __init__(self, settings: MqttSettings) -> None:
        self._settings = settings
        self._speaks_tls: bool | None = None  # None: not probed yet

    async def after(self, error: MqttError) -> str:
        """``"; <the hint>"`` to add to a failed connect's message, or ``""``."""
        if not isinstance(error, MqttClosedBeforeConnack):
            return ""
        host, port, tls = self._settings.host_port_tls
        if tls:
            return ""
        if self._speaks_tls is None:  # blocking, bounded by the probe's timeout: in a thread
            self._speaks_tls = await asyncio.get_running_loop().run_in_executor(None, speaks_tls, host, port)
        if not self._speaks_tls:
            return ""
        if (host, port) not in _logged:  # no await between the test and the add: one line
            _logged.add((host, port))
            log.warning("mqtt: %s", tls_hint(host, port))
        return f"; {tls_hint(host, port)}"
