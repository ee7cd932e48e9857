"""MQTT topic layout. Every topic of a gateway lives under ``edgefed/<gateway_id>/``.

    edgefed/<gw>/devices/<device>/telemetry   device -> gateway, QoS 1, JSON `Telemetry`
    edgefed/<gw>/status                        gateway, retained, JSON (last will: offline)
    edgefed/<gw>/placement                     gateway, retained, JSON: placement plan + decisions
    edgefed/<gw>/control/request/<op>          operator -> gateway, QoS 1, JSON request (protocol/control.py)
    edgefed/<gw>/control/response/<name>       gateway -> operator, QoS 1, JSON ControlResponse
    edgefed/<gw>/services/<service>/config     gateway, retained: the service's desired config + revision
    edgefed/<gw>/services/<service>/state      gateway, retained: its ServiceState (protocol/control.py) + why
    edgefed/<gw>/services/<service>/events     gateway, not retained: one event per accepted change

Identifiers are restricted to ``[A-Za-z0-9_.-]`` so that they can never contain MQTT wildcards or
separators. Operation names (``config.set``) follow the same rule.
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


def is_valid_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


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


# --- control plane (docs/mqtt-api.md) ---------------------------------------------------------------


def control_request_topic(gateway_id: str, op: str) -> str:
    return f"{ROOT}/{check_id('gateway', gateway_id)}/control/request/{check_id('operation', op)}"


def control_request_subscription(gateway_id: str) -> str:
    return f"{ROOT}/{check_id('gateway', gateway_id)}/control/request/+"


def control_response_prefix(gateway_id: str) -> str:
    """Responses go only under this prefix (the broker's ACL lets a gateway publish nowhere else)."""
    return f"{ROOT}/{check_id('gateway', gateway_id)}/control/response/"


def control_response_topic(gateway_id: str, name: str) -> str:
    return control_response_prefix(gateway_id) + check_id("response", name)


def is_control_response_topic(gateway_id: str, topic: str) -> bool:
    """True if ``topic`` is ``edgefed/<gw>/control/response/<id>``, one level, no wildcards."""
    prefix = control_response_prefix(gateway_id)
    return topic.startswith(prefix) and _ID.fullmatch(topic[len(prefix) :]) is not None


def control_op_of(gateway_id: str, topic: str) -> str | None:
    """The ``<op>`` of a request topic of this gateway (not checked against the known ops), else None."""
    prefix = f"{ROOT}/{gateway_id}/control/request/"
    if not topic.startswith(prefix) or "/" in topic[len(prefix) :]:
        return None
    return topic[len(prefix) :]


def service_topic(gateway_id: str, service: str, leaf: str) -> str:
    """``edgefed/<gw>/services/<service>/<leaf>``, leaf one of config | state | events."""
    if leaf not in ("config", "state", "events"):
        raise ProtocolError("unknown_topic", f"service topic leaf {leaf!r} is not config, state or events")
    return f"{ROOT}/{check_id('gateway', gateway_id)}/services/{check_id('service', service)}/{leaf}"


def placement_topic(gateway_id: str) -> str:
    """``edgefed/<gw>/placement``: gateway, retained, JSON: the current plan and recent decisions."""
    return f"{ROOT}/{check_id('gateway', gateway_id)}/placement"


def model_notice_topic(gateway_id: str, name: str) -> str:
    """``edgefed/<gw>/models/<name>``: the retained ModelNotice of a model's newest version."""
    return f"{ROOT}/{check_id('gateway', gateway_id)}/models/{check_id('model', name)}"


def camera_events_topic(gateway_id: str, camera_id: str) -> str:
    """``edgefed/<gw>/events/<camera>``: one InferenceEvent (+ frame reference) per inferred frame, QoS 0."""
    return f"{ROOT}/{check_id('gateway', gateway_id)}/events/{check_id('camera', camera_id)}"
