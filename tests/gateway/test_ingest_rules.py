"""The pure parts of the gateway: message verdicts, rate-limited logging, config checks."""

from __future__ import annotations

import json
import logging

import pytest

from gateway.ingest.judge import judge_message
from gateway.ratelimit import RateLimitedLog
from protocol.config import parse_gateway_config
from protocol.errors import ProtocolError
from protocol.records import decode_record
from tests.harness.gatewayd import telemetry


def judge(topic: str, payload: bytes, allow=("*",)):
    return judge_message("gw1", list(allow), topic, payload, 123.5)


def test_valid_message_becomes_a_telemetry_record():
    verdict = judge("edgefed/gw1/devices/s1/telemetry", telemetry("s1", 7))
    assert verdict.reason is None
    record = decode_record(verdict.record)
    assert (record.kind, record.device, record.received_ts) == ("telemetry", "s1", 123.5)
    assert record.body["seq"] == 7


def test_each_rejection_reason():
    assert judge("edgefed/gw1/devices/s1/other", telemetry("s1", 0)).reason == "unknown_topic"
    assert judge("edgefed/gw2/devices/s1/telemetry", telemetry("s1", 0)).reason == "unknown_topic"
    assert judge("edgefed/gw1/devices/s1", telemetry("s1", 0)).reason == "unknown_topic"
    unknown = judge("edgefed/gw1/devices/x/telemetry", telemetry("x", 0), allow=["s*"])
    assert unknown.reason == "unknown_device"
    assert judge("edgefed/gw1/devices/s1/telemetry", b" " * 20000).reason == "too_large"
    assert judge("edgefed/gw1/devices/s1/telemetry", b"{").reason == "not_json"
    invalid = judge("edgefed/gw1/devices/s1/telemetry", json.dumps({"v": 1}).encode())
    assert invalid.reason == "invalid" and "device" in invalid.detail
    assert judge("edgefed/gw1/devices/s1/telemetry", telemetry("s2", 0)).reason == "device_mismatch"


def test_telemetry_types_are_strict():
    """Another JSON type is refused, naming the field: never converted (``true`` is not 1)."""
    for field, value in (("v", True), ("v", 1.0), ("seq", 7.0), ("seq", "7"), ("ts", "1")):
        body = {**json.loads(telemetry("s1", 7)), field: value}
        verdict = judge("edgefed/gw1/devices/s1/telemetry", json.dumps(body).encode())
        assert verdict.reason == "invalid" and verdict.detail.startswith(f"device s1: {field}: "), (
            field,
            value,
            verdict.detail,
        )
    wrong = judge("edgefed/gw1/devices/s1/telemetry", telemetry("s1", 7, readings={"temperature_c": True}))
    assert wrong.reason == "invalid" and "readings.temperature_c" in wrong.detail


def test_rate_limited_log_reports_what_it_suppressed(caplog):
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("t"), interval_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert limited.warning("a", "first")
        assert not limited.warning("a", "second")
        assert not limited.warning("a", "third")
        assert limited.warning("b", "other key")
        now[0] = 11.0
        assert limited.warning("a", "fourth")
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "first" and messages[1] == "other key"
    assert "2 more like this suppressed" in messages[2]


@pytest.mark.parametrize("value", [16_639, 268_435_456, "17k"])
def test_max_packet_size_out_of_range_is_refused_naming_the_field(value):
    data = {"gateway_id": "gw1", "data_dir": "d", "mqtt": {"max_packet_size": value}}
    with pytest.raises(ProtocolError) as info:
        parse_gateway_config(data)
    assert info.value.detail.startswith("mqtt.max_packet_size: ")
