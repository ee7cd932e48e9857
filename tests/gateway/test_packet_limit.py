"""mqtt.max_packet_size: 50 MB telemetry messages sent to a real gatewayd through a real mosquitto
with no limit of its own are refused without the gateway's memory growing with them, and the
telemetry after them still arrives. Each of the two layers that refuse them is tested:

- MQTT 5 (the default): the gateway announces its limit in CONNECT (Maximum Packet Size); mosquitto
  drops a larger PUBLISH for it and logs so; the gateway never reads it.
- MQTT 3.1.1 has no limit to announce: mosquitto delivers the 50 MB, and the gateway's own reader
  refuses each by its fixed header (gateway/mqtt/packet_limit.py), counts it, and acks it in order.

Each also sends one packet of exactly max_packet_size bytes (delivered and read; ingest refuses its
payload, over 16 KiB, as too_large) and one of a byte more (refused: by mosquitto on MQTT 5, by the
reader on 3.1.1), so the limit is tested to the byte.

The bound (docs/gateway.md, "Packet size"): gatewayd's peak RSS (VmHWM) grows by less than
RSS_GROWTH_BOUND_KIB from before the messages to after them. Reading one 50 MB packet whole, as paho
does, grows it by well over 50 MB.
"""

from __future__ import annotations

import asyncio

from gateway.mqtt.adapter import MqttAdapter, MqttSettings
from protocol.config import DEFAULT_MAX_PACKET_BYTES
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until
from tests.harness.processes import peak_rss_kib

TOPIC = "edgefed/gw1/devices/sensor-1/telemetry"
BIG_BYTES = 50 * 1024 * 1024
BIG_MESSAGES = 3
RSS_GROWTH_BOUND_KIB = 16 * 1024
NORMAL = [(TOPIC, telemetry("sensor-1", seq)) for seq in range(10)]


def varint_bytes(value: int) -> int:
    return 1 if value < 128 else 2 if value < 16_384 else 3 if value < 2_097_152 else 4


def payload_for(packet_bytes: int, v5: bool) -> bytes:
    """A payload whose PUBLISH, as mosquitto forwards it to the gateway (QoS 1, no properties), is
    ``packet_bytes`` long, fixed header included."""
    variable_header = 2 + len(TOPIC) + 2 + (1 if v5 else 0)  # topic, packet id, properties length
    for length_bytes in (1, 2, 3, 4):
        remaining = packet_bytes - 1 - length_bytes
        if varint_bytes(remaining) == length_bytes:
            return b"x" * (remaining - variable_header)
    raise ValueError(f"no packet of {packet_bytes} bytes")


def start_gateway(tmp_path, broker, protocol_version: str) -> Gatewayd:
    config, port = write_config(tmp_path, broker.url, mqtt=f'protocol_version = "{protocol_version}"\n')
    return Gatewayd(config, port).wait_ready()


def send_and_measure(gateway: Gatewayd, broker, v5: bool) -> int:
    """Send the big messages, the two at the limit, then the normal ones; the peak RSS growth, KiB."""
    before = peak_rss_kib(gateway.proc.pid)
    at_limit = payload_for(DEFAULT_MAX_PACKET_BYTES, v5)
    over_limit = payload_for(DEFAULT_MAX_PACKET_BYTES + 1, v5)
    big = b"x" * BIG_BYTES
    publish(broker.port, [(TOPIC, big)] * BIG_MESSAGES + [(TOPIC, at_limit), (TOPIC, over_limit)])
    publish(broker.port, NORMAL)
    status = gateway.wait_status(
        lambda s: s["ingest"]["accepted"] == len(NORMAL), 120, "the normal telemetry after the big messages"
    )
    assert status["mqtt"]["reconnects"] == 0 and status["mqtt"]["connected"] == 1
    return peak_rss_kib(gateway.proc.pid) - before


def test_mqtt5_the_broker_drops_what_is_over_the_announced_limit(mosquitto, tmp_path):
    gateway = start_gateway(tmp_path, mosquitto, "5")
    try:
        growth = send_and_measure(gateway, mosquitto, v5=True)
        status = gateway.status()
        assert status["ingest"]["rejected_by_reason"]["too_large"] == 1  # the one at the limit, read
        assert status["mqtt"]["packets_too_large"] == 0  # nothing over the limit reached the reader
        dropped = "Dropping too large outgoing PUBLISH for edgefed-gw1"
        drops = wait_until(
            lambda: mosquitto.log().count(dropped),
            10,
            "mosquitto's drops",
            check=lambda n: n >= BIG_MESSAGES + 1,
        )
        assert drops == BIG_MESSAGES + 1, mosquitto.log()[-2000:]
        assert growth < RSS_GROWTH_BOUND_KIB, f"peak RSS grew by {growth} KiB"
    finally:
        gateway.kill()


def test_mqtt311_the_gateways_reader_refuses_by_the_fixed_header(mosquitto, tmp_path):
    gateway = start_gateway(tmp_path, mosquitto, "3.1.1")
    try:
        growth = send_and_measure(gateway, mosquitto, v5=False)
        # a control request over the control connection's limit (128 KiB) is refused unread, and answered
        publish(mosquitto.port, [("edgefed/gw1/control/request/status.get", b" " * (128 * 1024))])
        status = gateway.wait_status(
            lambda s: s["control"]["refused_by_reason"].get("too_large") == 1, 30, "the control refusal"
        )
        assert status["mqtt"]["packets_too_large"] == BIG_MESSAGES + 1  # the 50 MB ones and limit + 1
        metric = f"edgefed_gateway_mqtt_packets_too_large_total {BIG_MESSAGES + 1}.0"
        assert metric in gateway.get("/metrics").decode()
        assert status["ingest"]["rejected_by_reason"]["too_large"] == BIG_MESSAGES + 2  # and the one at it
        assert status["ingest"]["acked"] == BIG_MESSAGES + 2 + len(NORMAL)  # refused ones acked in order
        assert "> mqtt.max_packet_size" in gateway.output()  # ingest's one line (rate-limited) says why
        assert growth < RSS_GROWTH_BOUND_KIB, f"peak RSS grew by {growth} KiB"
    finally:
        gateway.kill()  # what was acked is acked: the broker must not send any of it again
    gateway = Gatewayd(gateway.config, gateway.http_port).wait_ready()
    try:
        publish(mosquitto.port, [(TOPIC, telemetry("sensor-1", 10))])  # behind any redelivery
        status = gateway.wait_status(lambda s: s["ingest"]["accepted"] == 1, 60, "the next message")
        assert status["mqtt"]["packets_too_large"] == 0
        assert status["ingest"]["rejected_by_reason"]["too_large"] == 0
    finally:
        gateway.kill()


# --- the one fault mosquitto cannot cause ------------------------------------------------------------

MAXIMUM_PACKET_SIZE = 0x27  # the CONNECT property's identifier (MQTT 5 §3.1.2.11.4)
CONNACK_V5 = bytes([0x20, 3, 0, 0, 0])  # no session present, success, no properties
DISCONNECT_PACKET_TOO_LARGE = bytes([0xE0, 1, 0x95])


def remaining_length(value: int) -> bytes:
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (128 if value else 0))
        if not value:
            return bytes(out)


async def read_packet(reader: asyncio.StreamReader) -> bytes:
    """One whole MQTT packet (fixed header included) from ``reader``."""
    packet = bytearray(await reader.readexactly(1))
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        packet.append(byte)
        length += (byte & 127) << shift
        shift += 7
        if not byte & 128:
            return bytes(packet + await reader.readexactly(length))


async def test_mqtt5_a_packet_over_the_limit_all_the_same_gets_disconnect_0x95():
    """mosquitto honours the limit the gateway announces (above), so a broker that breaks MQTT 5 and
    sends a larger packet anyway is played here by a socket: the adapter must have announced its
    limit, answer the packet's fixed header with DISCONNECT 0x95 "Packet too large" (MQTT 5 §4.13),
    close, count it, and connect again."""
    connections: asyncio.Queue[tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    writers: list[asyncio.StreamWriter] = []

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await connections.put((await read_packet(reader), reader, writer))

    server = await asyncio.start_server(broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limit = DEFAULT_MAX_PACKET_BYTES
    settings = MqttSettings(
        url=f"mqtt://127.0.0.1:{port}", client_id="edgefed-test", max_packet_size=limit, backoff_max_s=0.2
    )
    adapter = MqttAdapter(settings)
    await adapter.start()
    try:
        async with asyncio.timeout(20):
            connect, reader, writer = await connections.get()
            assert bytes([MAXIMUM_PACKET_SIZE]) + (limit - 1).to_bytes(4, "big") in connect
            writer.write(CONNACK_V5)
            # the start of a 50 MB PUBLISH on topic "t": its fixed header and 64 KiB of its body
            writer.write(bytes([0x30]) + remaining_length(BIG_BYTES) + b"\x00\x01t" + b"x" * 65536)
            await writer.drain()
            assert await read_packet(reader) == DISCONNECT_PACKET_TOO_LARGE
            assert await reader.read() == b"", "the connection must close after the DISCONNECT"
            assert adapter.counters.packets_too_large == 1 and adapter.inbound_len == 0
            await connections.get()  # it connects again
    finally:
        await adapter.stop(timeout_s=1.0)
        for each in writers:
            each.close()
        server.close()
        await server.wait_closed()
