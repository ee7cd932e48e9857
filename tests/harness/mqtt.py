"""MQTT clients of the tests (paho-mqtt, v5): publish and wait for the broker's acks, read retained
messages as a late subscriber does, subscribe and wait for the SUBACK."""

from __future__ import annotations

import threading
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion


def client(
    *,
    client_id: str = "",
    ca_file: Path | None = None,
    username: str | None = None,
    password: str | None = None,
) -> paho.Client:
    """A v5 client (not connected); TLS when ``ca_file`` is given."""
    mqtt = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5, client_id=client_id
    )
    if ca_file is not None:
        mqtt.tls_set(ca_certs=str(ca_file))
    if username is not None:
        mqtt.username_pw_set(username, password)
    return mqtt


def publish(broker_port: int, messages: list[tuple[str, bytes]], qos: int = 1, retain: bool = False) -> None:
    """Publish and wait until the broker has every message (its PUBACK, with QoS 1)."""
    mqtt = client()
    mqtt.connect("127.0.0.1", broker_port)
    mqtt.loop_start()
    try:
        infos = [mqtt.publish(topic, payload, qos=qos, retain=retain) for topic, payload in messages]
        for info in infos:
            info.wait_for_publish(timeout=10)
            assert info.is_published(), f"the broker did not take {info.mid} within 10 s"
    finally:
        mqtt.disconnect()
        mqtt.loop_stop()


def retained(
    broker_port: int, topics: list[str], timeout_s: float = 10.0, **client_options
) -> dict[str, bytes]:
    """What a late subscriber gets on ``topics`` (retained messages): returns once every topic has
    one, or after ``timeout_s`` with those that came."""
    got: dict[str, bytes] = {}
    done = threading.Event()
    mqtt = client(**client_options)

    def on_message(_client, _userdata, message) -> None:
        got[message.topic] = bytes(message.payload)
        if set(got) >= set(topics):
            done.set()

    def on_connect(c: paho.Client, *_: object) -> None:
        for topic in topics:
            c.subscribe(topic, qos=1)

    mqtt.on_message = on_message
    mqtt.on_connect = on_connect
    mqtt.connect("127.0.0.1", broker_port)
    mqtt.loop_start()
    try:
        done.wait(timeout_s)
    finally:
        mqtt.disconnect()
        mqtt.loop_stop()
    return dict(got)


def subscribe(mqtt: paho.Client, topic: str, qos: int = 1, timeout_s: float = 10.0) -> None:
    """SUBSCRIBE on a connected, looping client and wait for the SUBACK: from then on the broker
    delivers what is published on ``topic`` to it."""
    acked: set[int] = set()
    arrived = threading.Condition()
    earlier = mqtt.on_subscribe

    def on_subscribe(c, userdata, mid, reasons, props) -> None:
        with arrived:
            acked.add(mid)
            arrived.notify_all()
        if earlier is not None:
            earlier(c, userdata, mid, reasons, props)  # type: ignore[call-arg]  # a v5 client's callback

    mqtt.on_subscribe = on_subscribe
    try:
        result, mid = mqtt.subscribe(topic, qos=qos)
        assert result == paho.MQTT_ERR_SUCCESS, f"SUBSCRIBE {topic} not sent: {paho.error_string(result)}"
        with arrived:
            if not arrived.wait_for(lambda: mid in acked, timeout_s):
                raise TimeoutError(f"no SUBACK for {topic} within {timeout_s}s")
    finally:
        mqtt.on_subscribe = earlier
