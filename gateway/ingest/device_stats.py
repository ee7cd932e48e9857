"""The devices the ingest has actually heard from (``devices.list``, ``gatewayctl devices``): per
device id, when it last sent, how many messages, and what became of them (accepted, redelivered, or
rejected by reason), whether or not the allow-list lets it in: an unknown device that keeps
publishing shows up here, with its rejections.

Owner: the ingest's intake task records each message it judged (``record_device``); the control plane reads
(``view``). Both run on the event loop.

Invariant: at most ``capacity`` devices are kept, the most recently heard; each one pushed out is
counted in ``forgotten``, and each message whose topic names no device in ``unattributed``, so every
message recorded is in one device's ``messages`` or in one of those two counters.
"""

from __future__ import annotations

import collections
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import ProtocolError
from protocol.topics import parse_device_topic

DEVICE_CAPACITY = 1000


@dataclass
class DeviceSeen:
    first_ts: float
    last_ts: float
    messages: int = 0
    accepted: int = 0
    redelivered: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


class DeviceStats:
    def __init__(self, capacity: int = DEVICE_CAPACITY) -> None:
        self.capacity = capacity
        self._devices: collections.OrderedDict[str, DeviceSeen] = collections.OrderedDict()
        self.forgotten = 0  # devices pushed out to keep the most recent ``capacity``
        self.unattributed = 0  # messages on a topic that names no device

    def record(self, topic: str, ts: float, outcome: str) -> None:
        """One message on ``topic`` received at ``ts``: ``accepted``, ``redelivered`` or a reject reason."""
        try:
            device: str | None = parse_device_topic(topic).device_id
        except ProtocolError:
            device = None
        self.record_device(device, ts, outcome)

    def record_device(self, device: str | None, ts: float, outcome: str) -> None:
        """``record`` for a message whose topic named ``device`` (None: named none), parsed already."""
        if device is None:
            self.unattributed += 1
            return
        seen = self._devices.get(device)
        if seen is None:
            seen = self._devices[device] = DeviceSeen(first_ts=ts, last_ts=ts)
        else:
            self._devices.move_to_end(device)  # the most recently heard go last
        seen.last_ts = ts
        seen.messages += 1
        if outcome == "accepted":
            seen.accepted += 1
        elif outcome == "redelivered":
            seen.redelivered += 1
        else:
            seen.rejected[outcome] = seen.rejected.get(outcome, 0) + 1
        if len(self._devices) > self.capacity:
            self._devices.popitem(last=False)
            self.forgotten += 1

    def view(self, allow: Sequence[str]) -> dict[str, Any]:
        """Every kept device, most recently heard first, each marked ``allowed`` by ``allow`` (globs)."""
        devices = [
            {
                "device": device,
                "allowed": any(fnmatch.fnmatchcase(device, pattern) for pattern in allow),
                "first_ts": round(seen.first_ts, 3),
                "last_ts": round(seen.last_ts, 3),
                "messages": seen.messages,
                "accepted": seen.accepted,
                "redelivered": seen.redelivered,
                "rejected": dict(seen.rejected),
            }
            for device, seen in reversed(self._devices.items())
        ]
        return {
            "allow": list(allow),
            "devices": devices,
            "capacity": self.capacity,
            "forgotten": self.forgotten,
            "unattributed": self.unattributed,
        }
