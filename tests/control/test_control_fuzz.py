"""Property test: >= 10,000 random and malformed requests on the control topics of a live gatewayd.

Every request carries an MQTT v5 Response Topic and Correlation Data. The daemon must survive all of
them, answer each exactly once, name the problem in every error, and leave the config (revision and
digest) untouched by every refused request. Requests go out in bulk over one connection and the
answers are checked at the end, in the order the daemon produced them (one connection, QoS 1: in order).
A last well-formed read-only request (correlation "end") follows them: its answer comes after every
other one, so once it is in, a duplicate answer would have been seen. Set EDGEFED_FUZZ_REQUESTS for
another count (the issue asks for 10,000; that is the default).
"""

from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from protocol.control import OPS, READ_ONLY_OPS
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.mqtt import client as mqtt_client
from tests.harness.mqtt import subscribe
from tests.harness.poll import wait_until

pytestmark = pytest.mark.slow  # a sweep: 10,000 requests through a live gatewayd

COUNT = int(os.environ.get("EDGEFED_FUZZ_REQUESTS", "10000"))
RESPONSES = "edgefed/gw1/control/response/fuzz"
END = b"end"  # the correlation data of the last request
FIELDS = [
    "v",
    "service",
    "config",
    "patch",
    "revision",
    "device",
    "source",
    "sample_fps",
    "model",
    "version",
    "task",
    "where",
    "level",
    "limit",
    "after",
    "correlation_id",
    "response_topic",
    "enabled",
    "allow",
    "pins",
]
SERVICES = ["sensor", "camera", "training", "models", "placement", "gateway", "nope", "", "SENSOR"]

# Shallow on purpose: generation must keep up with 10,000 requests in about a minute on 2 busy cores.
words = st.sampled_from(
    SERVICES + ["edge", "cloud", "DEBUG", "*", "a/b", "sensor-1", "rtsp://x/y", "ftp://z"]
)
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    words,
)
shallow = st.one_of(
    json_scalar,
    st.lists(json_scalar, max_size=3),
    st.dictionaries(st.sampled_from(FIELDS), json_scalar, max_size=3),
)
request_object = st.dictionaries(st.sampled_from(FIELDS), shallow, max_size=4)
payload = st.one_of(
    st.binary(max_size=64),
    shallow.map(lambda v: json.dumps(v).encode()),
    request_object.map(lambda v: json.dumps(v).encode()),
    request_object.map(lambda v: json.dumps(v).encode()[:-1]),  # truncated JSON
    st.just(b"x" * (65 * 1024)),  # over the size limit
)
# printable: a topic with control characters is a protocol error, the broker would drop our connection
printable = st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="/+#")
ascii_level = st.text(printable, max_size=12)
op = st.one_of(st.sampled_from(sorted(OPS)), ascii_level)


def test_random_and_malformed_requests_never_break_the_control_plane(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    responses: list[tuple[int, dict]] = []
    sent: list[tuple[str, bytes]] = []
    broken: list[tuple[bytes, str]] = []
    got_all, got_end = threading.Event(), threading.Event()
    client = mqtt_client(client_id="fuzzer")
    client.max_inflight_messages_set(1000)

    def on_message(c, u, message):
        if getattr(message.properties, "CorrelationData", None) == END:
            got_end.set()
            return
        try:
            correlation = int(message.properties.CorrelationData.decode())
            responses.append((correlation, json.loads(message.payload)))
        except Exception as exc:  # recorded, asserted on below (an exception here would stop paho's thread)
            broken.append((message.payload[:200], repr(exc)))
        if len(responses) + len(broken) >= COUNT:
            got_all.set()

    client.on_message = on_message
    client.on_disconnect = lambda *args: broken.append((b"", f"fuzzer disconnected: {args[3]}"))
    client.connect("127.0.0.1", mosquitto.port)
    client.loop_start()
    try:
        subscribe(client, RESPONSES, qos=1)  # returns with the SUBACK: answers reach us from now on
        # the control connection subscribes after the ingest one; its birth comes after its SUBSCRIBE
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
        initial = gw.status()["control"]

        batch = 50

        @settings(
            max_examples=COUNT // batch + 50,
            phases=[Phase.generate],
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(requests=st.lists(st.tuples(op, payload), min_size=batch, max_size=batch))
        def send(requests: list[tuple[str, bytes]]) -> None:
            for op, body in requests[: COUNT - len(sent)]:
                props = Properties(PacketTypes.PUBLISH)
                props.ResponseTopic = RESPONSES
                props.CorrelationData = str(len(sent)).encode()
                sent.append((op, body))
                client.publish(f"edgefed/gw1/control/request/{op}", body, qos=1, properties=props)

        send()
        assert len(sent) == COUNT, f"hypothesis generated only {len(sent)} requests"
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic, props.CorrelationData = RESPONSES, END
        client.publish("edgefed/gw1/control/request/services.list", b'{"v": 1}', qos=1, properties=props)
        if not got_all.wait(float(os.environ.get("EDGEFED_FUZZ_WAIT_S", "180"))):
            raise AssertionError(
                f"only {len(responses)} of {COUNT} responses arrived; {broken[:3]}; "
                f"gatewayd: {gw.status()['control']} {gw.status()['mqtt']}"
            )
        assert not broken, broken[:5]
        assert got_end.wait(60), "no answer to the last request"  # every other answer came before it
        assert not broken, broken[:5]
        assert gw.proc.poll() is None, "gatewayd died"
        assert sorted(i for i, _ in responses) == list(range(COUNT)), "not exactly one answer per request"

        revision, digest = initial["revision"], initial["digest"]
        errors = 0
        for index, response in responses:  # in the order the daemon answered
            sent_op = sent[index][0]
            assert response["op"] == sent_op[:64]
            if response["status"] == "error":
                errors += 1
                error = response["error"]
                assert error["reason"] and error["detail"] and error.get("field"), (sent[index], response)
                unchanged = (response["revision"], response["digest"]) == (revision, digest)
                assert unchanged, (sent[index], response)
            else:
                assert sent_op in OPS
                if sent_op in READ_ONLY_OPS:
                    assert (response["revision"], response["digest"]) == (revision, digest)
            revision, digest = response["revision"], response["digest"]
        status = gw.status()["control"]
        assert status["internal_errors"] == 0
        assert status["requests"] == COUNT + 1 and status["refused"] == errors  # + the last, read-only
        assert (status["revision"], status["digest"]) == (revision, digest)
        assert errors >= COUNT * 0.9  # the generator mostly makes bad requests: the property is exercised
        wait_until(lambda: gw.status()["mqtt"]["connected"] == 1, 10, "ingest connection still up")
        rc, err = gw.terminate()
        assert rc == 0, err[-2000:]
    finally:
        client.disconnect()
        client.loop_stop()
        gw.kill()
