"""The two MQTT clients of bench/ingest.py, each run as its own process (``python -m
bench._ingest_clients publish|subscribe ...``) so that its CPU is its own and no GIL is shared.

- ``publish``: a raw-socket MQTT 3.1.1 QoS 1 publisher. Every PUBLISH packet is encoded before the
  clock starts; they go out pipelined (up to ``--window`` unacknowledged, several per ``send``) and
  only the broker's PUBACKs count as published. Prints one JSON line: ``{"t_start", "t_end", "acked"}``.
- ``subscribe``: the baseline, a bare paho-mqtt 2.x subscriber (MQTT v5, QoS 1, paho's own network
  loop) that json-parses each message; paho sends the PUBACK when ``on_message`` returns. Prints
  ``{"ready": true}`` once subscribed, then ``{"t_last", "received"}`` at the ``--count``-th message,
  and exits when its stdin closes (so the bench can read its CPU time and RSS first).

Invariant: the publisher's and the consumers' messages are the same bytes (``telemetry_payloads``:
devicesim's telemetry shape), and a rate counts only what the broker acknowledged or delivered.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time

from protocol.topics import telemetry_topic

TS0 = 1764489600.0


def telemetry_payloads(gateway_id: str, devices: int, count: int) -> list[tuple[str, bytes]]:
    """``count`` (topic, payload) pairs, devicesim's telemetry (devices/sensors.py), round-robin over
    ``devices`` sensors; (device, seq, ts) is unique, so none is taken for a redelivery."""
    out = []
    for i in range(count):
        device, seq = f"sensor-{i % devices:03d}", i // devices
        body = {
            "v": 1,
            "device": device,
            "seq": seq,
            "ts": round(TS0 + seq * 1.0, 3),
            "readings": {
                "temperature_c": round(20.0 + (i % 37) * 0.1, 2),
                "humidity_pct": round(50.0 + (i % 23) * 0.2, 2),
                "soil_moisture_pct": round(30.0 + (i % 11) * 0.3, 2),
            },
            "status": "ok",
        }
        out.append((telemetry_topic(gateway_id, device), json.dumps(body).encode()))
    return out


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + _remaining_length(len(body)) + body


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def _publish_packet(topic: str, payload: bytes, packet_id: int) -> bytes:
    return _packet(0x32, _string(topic) + struct.pack("!H", packet_id) + payload)  # PUBLISH, QoS 1


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def publish(host: str, port: int, gateway_id: str, devices: int, count: int, window: int) -> dict[str, float]:
    packets = [
        _publish_packet(topic, payload, i % 65535 + 1)
        for i, (topic, payload) in enumerate(telemetry_payloads(gateway_id, devices, count))
    ]
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    connect = (
        _string("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + _string(f"bench-pub-{port}-{count}")
    )
    sock.sendall(_packet(0x10, connect))
    if _recv_exactly(sock, 4)[3] != 0:
        raise ConnectionError("CONNACK refused")
    sent = acked = 0
    pending = b""  # a PUBACK split across reads
    t_start = time.time()
    while acked < count:
        room = min(window - (sent - acked), count - sent, 256)
        if room > 0:
            sock.sendall(b"".join(packets[sent : sent + room]))
            sent += room
        # block for acks only when the window is full or everything is out
        wait = None if sent - acked >= window or sent == count else 0.0
        if select.select([sock], [], [], wait)[0]:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            pending += data
            whole = len(pending) // 4  # a 3.1.1 PUBACK is 4 bytes: 0x40 0x02 id id
            acked += whole
            pending = pending[whole * 4 :]
    t_end = time.time()
    sock.sendall(b"\xe0\x00")  # DISCONNECT
    sock.close()
    return {"t_start": t_start, "t_end": t_end, "acked": acked}


def subscribe(host: str, port: int, gateway_id: str, count: int, client_id: str) -> None:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.subscribeoptions import SubscribeOptions

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.max_inflight_messages_set(1000)
    received = 0

    def on_connect(
        client: paho.Client, userdata: object, flags: object, reason: object, props: object
    ) -> None:
        client.subscribe(f"edgefed/{gateway_id}/devices/#", options=SubscribeOptions(qos=1))

    def on_subscribe(client: paho.Client, userdata: object, mid: int, reasons: object, props: object) -> None:
        print(json.dumps({"ready": True}), flush=True)

    def on_message(client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        nonlocal received
        json.loads(message.payload)
        received += 1
        if received == count:
            print(json.dumps({"t_last": time.time(), "received": received}), flush=True)
            client.disconnect()

    client.on_connect, client.on_subscribe, client.on_message = on_connect, on_subscribe, on_message
    client.connect(host, port, keepalive=60)
    client.loop_forever()
    sys.stdin.read()  # the bench reads our CPU time and RSS, then closes stdin


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("publish", "subscribe"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--client-id", default="bench-paho")
    args = parser.parse_args()
    if args.role == "publish":
        result = publish("127.0.0.1", args.port, args.gateway, args.devices, args.count, args.window)
        print(json.dumps(result), flush=True)
    else:
        subscribe("127.0.0.1", args.port, args.gateway, args.count, args.client_id)


if __name__ == "__main__":
    main()
