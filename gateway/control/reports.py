"""What the control plane's read-only operations report about the running gateway, beside its
config: ``status.get`` (the ``/status`` document), ``log.errors`` (the recent log lines:
gateway/control/recent_log.py) and ``devices.list`` (the devices the ingest heard from, beside the
allow-list: gateway/ingest/device_stats.py).

Invariant: reading changes nothing: no config, no revision, no counter of the gateway's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.control.recent_log import RecentLog
from gateway.ingest.device_stats import DeviceStats
from protocol.control import DevicesListRequest, LogErrorsRequest, StatusRequest


@dataclass(frozen=True)
class GatewayReports:
    recent: RecentLog
    status: Callable[[], dict[str, Any]]
    devices: DeviceStats

    def read(self, request: object, allow: Sequence[str]) -> dict[str, Any]:
        """The answer to a read-only request about the gateway; ``allow``: the sensor's allow-list now."""
        if isinstance(request, LogErrorsRequest):
            return self.recent.read(request.level, request.limit, request.after)
        if isinstance(request, DevicesListRequest):
            return self.devices.view(allow)
        assert isinstance(request, StatusRequest), f"not a report: {type(request).__name__}"
        return self.status()
