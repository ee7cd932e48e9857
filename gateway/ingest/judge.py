"""The ingest's judge: what becomes of each device message, a batch at a time (gateway/ingest/sensors.py).

``judge_message`` is the rule, pure: the topic must be a telemetry topic of this gateway, its device
allowed (``devices.allow``, globs) and the payload a valid ``Telemetry`` of that same device; then
the message becomes a telemetry record (protocol/records.py), else a rejection with its reason.
``Judge`` applies the same rule to a batch, remembering per topic what the topic part of the rule
said (a gateway hears the same few topics again and again) until the allow-list changes.

Invariant: ``Judge.judge_batch`` gives, message for message, the verdict ``judge_message`` gives
with the same allow-list and receive time.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.ingest.recent_samples import SampleKey
from gateway.mqtt.types import InboundMessage
from protocol.errors import ProtocolError
from protocol.records import telemetry_record
from protocol.telemetry import parse_telemetry
from protocol.topics import parse_device_topic

TOPICS_REMEMBERED = 4096  # then forgotten all at once: a topic costs a parse once per that many


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one message: append ``record``, or reject it for ``reason``. A record always
    comes with its ``sample`` key (how a redelivery of it is recognised). ``device``: the device its
    topic names, if it names one (the per-device figures count it there)."""

    record: bytes | None
    reason: str | None = None
    detail: str = ""
    sample: SampleKey | None = None
    telemetry: dict[str, Any] | None = None  # what the windows need: status and readings
    device: str | None = None


@dataclass(frozen=True, slots=True)
class _TopicRule:
    """What the topic part of the rule said: the device it names (None: none) and, when the topic
    alone rejects the message, the rejection."""

    device: str | None
    rejection: Verdict | None


def _topic_rule(gateway_id: str, allow: Sequence[str], topic: str) -> _TopicRule:
    try:
        where = parse_device_topic(topic)
    except ProtocolError as exc:
        return _TopicRule(None, Verdict(None, "unknown_topic", exc.detail))
    device = where.device_id
    if where.gateway_id != gateway_id or where.leaf != "telemetry":
        detail = f"topic {topic!r} is not a telemetry topic of {gateway_id}"
        return _TopicRule(device, Verdict(None, "unknown_topic", detail, device=device))
    if not any(fnmatch.fnmatchcase(device, pattern) for pattern in allow):
        detail = f"device {device!r} is not in devices.allow"
        return _TopicRule(device, Verdict(None, "unknown_device", detail, device=device))
    return _TopicRule(device, None)


def _payload_verdict(device: str, payload: bytes, received_ts: float) -> Verdict:
    """The payload part of the rule, for a message whose topic passed."""
    try:
        telemetry = parse_telemetry(payload)
    except ProtocolError as exc:
        return Verdict(None, exc.reason, f"device {device}: {exc.detail}", device=device)
    if telemetry.device != device:
        detail = f"payload device {telemetry.device!r} published on {device!r}'s topic"
        return Verdict(None, "device_mismatch", detail, device=device)
    return Verdict(
        telemetry_record(device, received_ts, payload),
        sample=(telemetry.device, telemetry.seq, telemetry.ts),
        telemetry={"status": telemetry.status, "readings": telemetry.readings},
        device=device,
    )


def judge_message(
    gateway_id: str, allow: Sequence[str], topic: str, payload: bytes, received_ts: float
) -> Verdict:
    """Pure: validate one device message and build its log record."""
    rule = _topic_rule(gateway_id, allow, topic)
    if rule.rejection is not None:
        return rule.rejection
    assert rule.device is not None, "a topic that passed names its device"
    return _payload_verdict(rule.device, payload, received_ts)


class Judge:
    def __init__(self, gateway_id: str, allow: Sequence[str]) -> None:
        self.gateway_id = gateway_id
        self._allow = list(allow)
        self._topics: dict[str, _TopicRule] = {}

    @property
    def allow(self) -> list[str]:
        return list(self._allow)

    def set_allow(self, allow: Sequence[str]) -> None:
        """Replace the allow-list (glob patterns); what was remembered per topic is forgotten."""
        self._allow = list(allow)
        self._topics.clear()

    def device_of(self, topic: str) -> str | None:
        """The device ``topic`` names, if any (whatever the rest of the rule says)."""
        return self._rule(topic).device

    def judge_batch(self, messages: Sequence[InboundMessage], received_ts: float) -> list[Verdict]:
        """A verdict per message, in order; a message refused by the MQTT reader (its payload never
        read) is rejected as too large."""
        verdicts = []
        for message in messages:
            rule = self._rule(message.topic)
            if message.oversize_bytes is not None:
                size = f"a {message.oversize_bytes}-byte packet > mqtt.max_packet_size"
                verdicts.append(Verdict(None, "too_large", f"{message.topic}: {size}", device=rule.device))
            elif rule.rejection is not None:
                verdicts.append(rule.rejection)
            else:
                assert rule.device is not None, "a topic that passed names its device"
                verdicts.append(_payload_verdict(rule.device, message.payload, received_ts))
        return verdicts

    def _rule(self, topic: str) -> _TopicRule:
        rule = self._topics.get(topic)
        if rule is None:
            if len(self._topics) >= TOPICS_REMEMBERED:
                self._topics.clear()
            rule = self._topics[topic] = _topic_rule(self.gateway_id, self._allow, topic)
        return rule
