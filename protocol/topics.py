"""MQTT topic layout. Every topic of a gateway lives under ``edgefed/<gateway_id>/``.

    edgefed/<gw>/devices/<device>/telemetry   device -> gateway, QoS 1, JSON `Telemetry`
    edgefed/<gw>/status                        gateway, retained, JSON (last will: offline)

The control-plane topics are added under the same prefix. Identifiers are restricted to
``[A-Za-z0-9_.-]`` so that they can never contain MQTT wildcards or separators.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from protocol.errors import ProtocolError

ROOT = "edgefed"
ID_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
_ID = re.compile(ID_PATTERN)


def check_id(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid gateway or device identifier, else raise ProtocolError."""
    if not _ID.fullmatch(value):
        raise ProtocolError("bad_id", f"{kind} id {value!r} must match {ID_PATTERN}")
    return value


def telemetry_topic(gateway_id: str, device_id: str) -> str:
    return f"{ROOT}/{check_id('gateway', gateway_id)}/devices/{check_id('device', device_id)}/telemetry"


def devices_subscription(gateway_id: str) -> str:
    """What a gateway subscribes to: everything under its devices prefix (unknown leaves are refused)."""
    return f"{ROOT}/{check_id('gateway', gateway_id)}/devices/#"


def status_topic(gateway_id: str) -> str:
    return f"{ROOT}/{check_id('gateway', gateway_id)}/status"


@dataclass(frozen=True)
class DeviceTopic:
    gateway_id: str
    device_id: str
    leaf: str


def parse_device_topic(topic: str) -> DeviceTopic:
    """Split ``edgefed/<gw>/devices/<device>/<leaf>``; raise ProtocolError("unknown_topic") otherwise."""
    parts = topic.split("/")
    if len(parts) != 5 or parts[0] != ROOT or parts[2] != "devices":
        raise ProtocolError("unknown_topic", f"topic {topic!r} is not edgefed/<gw>/devices/<device>/<leaf>")
    if not _ID.fullmatch(parts[1]) or not _ID.fullmatch(parts[3]):
        raise ProtocolError("unknown_topic", f"topic {topic!r} has an invalid gateway or device id")
    return DeviceTopic(gateway_id=parts[1], device_id=parts[3], leaf=parts[4])
