"""The broker's side of security, with the repo's mosquitto.conf, password recipe and ACL: only the
operator role writes config; gateways and devices cannot; anonymous clients cannot connect at all."""

from __future__ import annotations

import json
import threading

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from protocol.control import MAX_REQUEST_BYTES
from tests.harness.broker import USERS, SecureBroker
from tests.harness.gatewayctl import ctl, ctl_json
from tests.harness.gatewayd import Gatewayd, write_secure_config
from tests.harness.mqtt import client as mqtt_client

ALLOWED = ("Success", "No matching subscribers")  # MQTT v5 PUBACK reasons that mean "accepted"


def connect(sb: SecureBroker, user: str | None, password: str | None = None) -> tuple[paho.Client, str]:
    """A v5 client over TLS; returns it (looping) and the CONNACK reason as text."""
    if user is not None and password is None:
        password = USERS[user]
    client = mqtt_client(ca_file=sb.ca, username=user, password=password)
    done = threading.Event()
    reason: list[str] = []

    def on_connect(c, u, flags, rc, props):
        reason.append(str(rc))
        done.set()

    client.on_connect = on_connect
    client.on_disconnect = lambda *a: done.set()
    client.connect("127.0.0.1", sb.port)
    client.loop_start()
    assert done.wait(10), "no CONNACK"
    return client, reason[0] if reason else "disconnected"


def publish_reason(client: paho.Client, topic: str, payload: bytes) -> str:
    """Publish QoS 1 and return the broker's PUBACK reason (MQTT v5 tells us when the ACL said no)."""
    done = threading.Event()
    reasons: list[str] = []
    client.on_publish = lambda c, u, mid, rc, props: (reasons.append(str(rc)), done.set())
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = "edgefed/gw1/control/response/intruder"
    client.publish(topic, payload, qos=1, properties=props)
    assert done.wait(10), "no PUBACK"
    return reasons[0]


def test_anonymous_and_wrong_password_cannot_connect(secure_broker):
    client, reason = connect(secure_broker, None)
    client.loop_stop()
    assert reason.lower() in ("not authorized", "bad user name or password"), reason
    client, reason = connect(secure_broker, "operator", "wrong")
    client.loop_stop()
    assert reason.lower() in ("not authorized", "bad user name or password"), reason
    code, _, err = ctl(
        "--broker",
        secure_broker.url,
        "--gateway",
        "gw1",
        "--ca-file",
        str(secure_broker.ca),
        "--timeout",
        "3",
        "services",
    )
    assert code == 2 and "cannot connect" in err and "authori" in err.lower(), err


def test_device_and_gateway_credentials_cannot_write_config(secure_broker, tmp_path):
    sb = secure_broker
    config, http_port = write_secure_config(tmp_path, sb)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        before = ctl_json(*sb.ctl_args(), "config", "get", "sensor")
        request = json.dumps({"service": "sensor", "config": {"enabled": False, "allow": ["evil"]}}).encode()
        for user in ("sensor-1", "gw1", "gw2"):
            client, reason = connect(sb, user)
            try:
                assert reason == "Success", (user, reason)
                assert (
                    publish_reason(client, "edgefed/gw1/control/request/config.set", request)
                    == "Not authorized"
                ), user
                allowed = publish_reason(client, "edgefed/gw1/services/sensor/events", b"{}") in ALLOWED
                assert allowed == (user == "gw1"), user
            finally:
                client.disconnect()
                client.loop_stop()
        # gatewayctl with a device's credential: refused by the broker, and it says so
        code, _, err = ctl(*sb.ctl_args("sensor-1"), "config", "set", "sensor", '{"enabled": false}')
        assert code == 2 and "not authorized" in err.lower(), err
        # a device may publish its own telemetry only
        client, _ = connect(sb, "sensor-1")
        try:
            assert publish_reason(client, "edgefed/gw1/devices/sensor-1/telemetry", b"{}") in ALLOWED
            assert publish_reason(client, "edgefed/gw1/devices/sensor-2/telemetry", b"{}") == "Not authorized"
        finally:
            client.disconnect()
            client.loop_stop()
        after = ctl_json(*sb.ctl_args(), "config", "get", "sensor")
        assert after["revision"] == before["revision"] and after["digest"] == before["digest"]
        assert gw.status()["control"]["requests"] == 2  # only the operator's two reads reached it
    finally:
        gw.kill()


def test_the_broker_refuses_a_packet_over_its_limit_and_takes_the_largest_request(secure_broker):
    """mosquitto.conf's max_packet_size: a device's 2 MB publish is refused at its fixed header (the
    broker disconnects it); a control request of the largest size gets through."""
    device, reason = connect(secure_broker, "sensor-1")
    assert reason == "Success"
    gone = threading.Event()
    device.on_disconnect = lambda *args: gone.set()
    device.publish("edgefed/gw1/devices/sensor-1/telemetry", b"x" * (2 * 1024 * 1024), qos=1)
    assert gone.wait(10), "the broker kept the connection of a client that sent 2 MB"
    device.loop_stop()
    assert "disconnected due to oversize packet" in secure_broker.broker.log()
    operator, _ = connect(secure_broker, "operator")
    try:
        request = b"{" + b" " * (MAX_REQUEST_BYTES - 2) + b"}"
        assert publish_reason(operator, "edgefed/gw1/control/request/services.list", request) in ALLOWED
    finally:
        operator.disconnect()
        operator.loop_stop()
