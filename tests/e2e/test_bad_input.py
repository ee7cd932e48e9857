"""Foundation, bad input: each kind of bad device message is rejected and counted, the daemon keeps
running, and everything accepted before and after reaches the cloud."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from protocol.batch import encode_batch, idempotency_key
from protocol.records import telemetry_record
from protocol.telemetry import MAX_TELEMETRY_BYTES
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until

TOPIC = "edgefed/gw1/devices/sensor-1/telemetry"

BAD = {
    "not_json": (TOPIC, b"\x00\x01 definitely not json"),
    "invalid": (TOPIC, telemetry("sensor-1", 100, ts="noon")),  # wrong type
    # over the payload limit, under mqtt.max_packet_size (beyond it: tests/gateway/test_packet_limit.py)
    "too_large": (TOPIC, b"{" + b" " * MAX_TELEMETRY_BYTES + b"}"),
    "unknown_topic": ("edgefed/gw1/devices/sensor-1/firmware", telemetry("sensor-1", 101)),
    "unknown_device": ("edgefed/gw1/devices/intruder-7/telemetry", telemetry("intruder-7", 0)),
}
MISSING_FIELDS = json.dumps({"v": 1, "device": "sensor-1", "seq": 102}).encode()  # no ts, no readings
LOOSE_TYPES = [telemetry("sensor-1", 103, v=True), telemetry("sensor-1", 104, v=1.0)]  # not the integer 1


def test_each_bad_message_is_counted_and_nothing_accepted_is_lost(mosquitto, cloudd, tmp_path):
    config, port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=cloudd.url,
        token=cloudd.token_for("gw1"),
        extra='[devices]\nallow = ["sensor-*"]\n',
    )
    gateway = Gatewayd(config, port).wait_ready()
    try:
        publish(mosquitto.port, [(TOPIC, telemetry("sensor-1", seq)) for seq in range(10)])
        publish(mosquitto.port, [*BAD.values(), (TOPIC, MISSING_FIELDS), *((TOPIC, m) for m in LOOSE_TYPES)])
        publish(mosquitto.port, [(TOPIC, telemetry("sensor-1", seq)) for seq in range(10, 20)])
        wait_until(lambda: len(cloudd.telemetry("gw1")) >= 20, 120, "20 valid records in the cloud")
        status = gateway.status()
        rejected = status["ingest"]["rejected_by_reason"]
        expected = dict.fromkeys(BAD, 1) | {"invalid": 4}  # the wrong types and the missing fields
        assert {reason: rejected[reason] for reason in expected} == expected
        assert status["ingest"]["accepted"] == 20
        assert gateway.proc.poll() is None, "gatewayd must keep running"
        seqs = sorted(r.record["body"]["seq"] for r in cloudd.telemetry("gw1"))
        assert seqs == list(range(20))
    finally:
        gateway.kill()


def test_batch_with_wrong_token_is_refused_and_nothing_stored(cloudd):
    body = encode_batch("gw1", "ab" * 8, [(1, telemetry_record("sensor-1", 1.0, telemetry("sensor-1", 0)))])
    request = urllib.request.Request(
        f"{cloudd.url}/v1/gateways/gw1/batches",
        data=body,
        method="POST",
        headers={
            "Authorization": "Bearer wrong",
            "Idempotency-Key": idempotency_key("gw1", "ab" * 8, 1, 1),
            "Content-Type": "application/json",
        },
    )
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("a batch with a wrong token was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
        assert json.loads(exc.read())["error"] == "unauthorized"
    assert cloudd.records("gw1") == []
