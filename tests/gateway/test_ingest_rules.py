"""The pure parts of the gateway: message verdicts, rate-limited logging."""

from __future__ import annotations

import json
import logging

from gateway.ingest.sensors import judge_message
from gateway.ratelimit import RateLimitedLog
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
