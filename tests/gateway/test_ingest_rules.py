"""The pure parts of the gateway: message verdicts, rate-limited logging, config checks."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.ingest.judge import Judge, judge_message
from gateway.mqtt.types import InboundMessage
from gateway.ratelimit import RateLimitedLog
from protocol.config import parse_gateway_config
from protocol.errors import ProtocolError
from protocol.records import Record, decode_record, encode_record, telemetry_record
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


TOPICS = st.sampled_from(
    [
        "edgefed/gw1/devices/s1/telemetry",
        "edgefed/gw1/devices/s2/telemetry",
        "edgefed/gw1/devices/x/telemetry",
        "edgefed/gw1/devices/s1/other",
        "edgefed/gw2/devices/s1/telemetry",
        "edgefed/gw1/devices/not a device/telemetry",
        "somewhere/else",
    ]
)
PAYLOADS = st.one_of(
    st.builds(lambda d, n: telemetry(d, n), st.sampled_from(["s1", "s2", "x"]), st.integers(0, 5)),
    st.sampled_from([b"{", b"[]", json.dumps({"v": 1}).encode(), telemetry("s1", 1, ts="1")]),
)


@given(
    st.lists(st.tuples(TOPICS, PAYLOADS, st.sampled_from([None, 20_000]))),
    st.lists(st.sampled_from([["*"], ["s*"], ["x", "s2"], []]), min_size=1, max_size=3),
)
def test_a_batch_is_judged_as_each_message_alone(messages, allow_lists):
    """Judge.judge_batch, remembering topics, gives what judge_message gives, also after the
    allow-list changed; a message the reader refused (oversize) is too_large, named by its device."""
    judge = Judge("gw1", allow_lists[0])
    batch = [
        InboundMessage(t, p, 1, i + 1, False, 1, oversize_bytes=o) for i, (t, p, o) in enumerate(messages)
    ]
    for allow in allow_lists:
        judge.set_allow(allow)
        for message, verdict in zip(batch, judge.judge_batch(batch, 123.5), strict=True):
            if message.oversize_bytes is not None:
                assert (verdict.record, verdict.reason) == (None, "too_large")
                assert verdict.device == judge.device_of(message.topic)
            else:
                assert verdict == judge_message("gw1", allow, message.topic, message.payload, 123.5)


@given(
    st.dictionaries(
        st.text(max_size=8),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=8,
        ),
        max_size=5,
    ),
    st.floats(min_value=0, max_value=4e9) | st.integers(0, 4_000_000_000),
)
def test_a_telemetry_record_has_the_bytes_of_its_record_model(body, received_ts):
    """telemetry_record skips the model (it runs per message) but gives its bytes exactly."""
    payload = json.dumps(body).encode()
    expected = encode_record(Record(kind="telemetry", device="s-1", received_ts=received_ts, body=body))
    assert telemetry_record("s-1", received_ts, payload) == expected


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
