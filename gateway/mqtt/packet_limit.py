"""paho's client with a limit on what it reads: a packet over ``max_packet_size`` is refused by its
fixed header, before its body is read.

paho reads a packet's whole body into memory before it looks at it, so one 50 MB PUBLISH costs a
gateway 50 MB and more. ``BoundedClient`` hooks paho's socket read: once paho has a packet's fixed
header (type, flags, remaining length), a packet over the limit is taken off the socket here,
``CHUNK_BYTES`` at a time, and nothing of it is kept but a PUBLISH's topic and packet id. Then, by
protocol version (docs/gateway.md, "Packet size"):

- MQTT 5: the broker was told the limit (CONNECT's Maximum Packet Size) and must not send a larger
  packet (MQTT 5 §3.1.2.11.4); one that comes all the same is a protocol error, which the client
  answers with DISCONNECT, reason 0x95 "Packet too large", before it closes (§4.13). The owner
  reconnects.
- MQTT 3.1.1 has no limit to announce, so any broker may send such a packet. A PUBLISH of QoS 0 or
  1 is refused in place: discarded, and handed to ``on_refused`` with its topic and packet id but no
  payload, so that its PUBACK goes out in arrival order with the others' (under manual acks by the
  owner's ``ack``; otherwise here, at once, as paho acks a message it read). Any other packet over
  the limit closes the connection.

The hook needs paho 2.2's reader: ``_sock_recv`` is asked for the fixed header a byte at a time, then
for the body once ``_in_packet`` holds the remaining length (``have_remaining`` set).

Invariant: paho holds at most ``max_packet_size`` bytes of any one packet; a refused packet, whatever
its size, costs at most ``CHUNK_BYTES`` of buffer plus its topic (under 64 KiB), beside the read-ahead
of batched_client.py (``READ_BYTES``), which the check here reads through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from gateway.mqtt.batched_client import BatchedClient
from gateway.mqtt.types import InboundMessage, MqttSettings

CHUNK_BYTES = 64 * 1024
CHUNKS_PER_EVENT = 16  # then the loop gets its turn: a 50 MB body is taken 1 MiB per readable event
PUBLISH = 3  # the MQTT control packet type, the high nibble of the fixed header's first byte


@dataclass(frozen=True)
class RefusedPacket:
    """A packet over the limit, refused by its fixed header; its body was never kept."""

    size: int  # the whole packet, fixed header included, as MQTT 5 counts a packet's size
    packet_type: int  # 3: PUBLISH
    closes: bool  # True: the connection closes; False: a 3.1.1 PUBLISH refused in place (below)
    topic: str = ""
    qos: int = 0
    mid: int = 0  # its packet id, which its PUBACK names (QoS 1)
    retain: bool = False

    def as_message(self, connection: int) -> InboundMessage:
        """A PUBLISH refused in place, as its consumer gets it: no payload, ``oversize_bytes`` set."""
        return InboundMessage(
            self.topic, b"", self.qos, self.mid, self.retain, connection, oversize_bytes=self.size
        )

    def describe(self, settings: MqttSettings) -> str:
        """One line on a packet that closes the connection."""
        answer = "DISCONNECT 0x95 packet too large" if settings.protocol_version == "5" else "closed"
        return (
            f"{settings.url} sent a {self.size}-byte packet (type {self.packet_type}) over "
            f"max_packet_size {settings.max_packet_size}: {answer}"
        )


class _Refusal:
    """The refused packet still on the socket: how much of its body is left, what of its header came."""

    def __init__(self, command: int, size: int, body_bytes: int, closes: bool) -> None:
        self.command, self.size, self.left, self.closes = command, size, body_bytes, closes
        self.header = bytearray()  # a PUBLISH's topic length, topic and packet id: at most 65,539 bytes

    @property
    def qos(self) -> int:
        return (self.command >> 1) & 3

    @property
    def done(self) -> bool:
        """Its last byte is read. One that closes the connection is never done: all that comes after
        it is discarded too, until paho closes the socket behind the DISCONNECT."""
        return not self.closes and self.left == 0

    def next_read(self) -> int:
        return CHUNK_BYTES if self.closes else min(CHUNK_BYTES, self.left)

    def _header_missing(self) -> int:
        if self.closes:
            return 0
        if len(self.header) < 2:
            return 2 - len(self.header)
        topic_bytes = int.from_bytes(self.header[:2], "big")
        return 2 + topic_bytes + (2 if self.qos else 0) - len(self.header)

    def take(self, data: bytes) -> None:
        self.left -= len(data)
        rest = memoryview(data)
        while rest and (missing := self._header_missing()) > 0:
            self.header += rest[:missing]
            rest = rest[missing:]

    def as_refused(self) -> RefusedPacket:
        """The refused PUBLISH; ConnectionError if its body was shorter than its own header (malformed)."""
        if self._header_missing() > 0:
            raise ConnectionAbortedError("malformed PUBLISH: shorter than its topic and packet id")
        end = len(self.header) - (2 if self.qos else 0)
        return RefusedPacket(
            self.size,
            PUBLISH,
            closes=False,
            topic=bytes(self.header[2:end]).decode("utf-8", errors="replace"),
            qos=self.qos,
            mid=int.from_bytes(self.header[end:], "big") if self.qos else 0,
            retain=bool(self.command & 1),
        )


class BoundedClient(BatchedClient):
    """A paho client that never reads a packet over ``max_packet_size`` bytes into memory (its reads
    and acks batched: batched_client.py, beneath this module's hook)."""

    def __init__(
        self, max_packet_size: int, on_refused: Callable[[RefusedPacket], None], **client_args: Any
    ) -> None:
        super().__init__(**client_args)
        self.max_packet_size = max_packet_size
        self._on_refused = on_refused
        self._v5 = client_args.get("protocol") == paho.MQTTv5
        self._refusal: _Refusal | None = None

    def reconnect(self) -> paho.MQTTErrorCode:
        self._refusal = None  # a new connection starts on a packet boundary
        return super().reconnect()

    def _sock_recv(self, bufsize: int) -> bytes:
        if self._refusal is None:
            packet = self._in_packet
            size = 1 + len(packet["remaining_count"]) + packet["remaining_length"]
            if not packet["have_remaining"] or size <= self.max_packet_size:
                return super()._sock_recv(bufsize)
            self._refusal = self._refuse(packet["command"], size, packet["remaining_length"])
        self._discard(self._refusal)

    def _refuse(self, command: int, size: int, body_bytes: int) -> _Refusal:
        in_place = not self._v5 and command >> 4 == PUBLISH and (command >> 1) & 3 < 2
        refusal = _Refusal(command, size, body_bytes, closes=not in_place)
        if refusal.closes:
            self._on_refused(RefusedPacket(size, command >> 4, closes=True))
            reason = ReasonCode(PacketTypes.DISCONNECT, "Packet too large") if self._v5 else None
            self.disconnect(reasoncode=reason)  # paho closes the socket once the DISCONNECT is written
        return refusal

    def _discard(self, refusal: _Refusal) -> NoReturn:
        """Take up to CHUNKS_PER_EVENT chunks of the refused packet off the socket; never gives paho a
        byte (BlockingIOError: "nothing yet"), so paho's own reader keeps waiting on its header."""
        for _ in range(CHUNKS_PER_EVENT):
            data = super()._sock_recv(refusal.next_read())  # BlockingIOError: the socket is empty for now
            if not data:
                raise ConnectionResetError("the broker closed the connection inside a refused packet")
            refusal.take(data)
            with self._msgtime_mutex:
                self._last_bytes_received = paho.time_func()  # bytes flow: the keepalive is not due
            if refusal.done:
                self._refusal = None
                self._end_packet()
                self._refused_in_place(refusal.as_refused())
                break
        raise BlockingIOError

    def _end_packet(self) -> None:
        """paho's reader state between packets, as its own reader leaves it after one."""
        self._in_packet = {
            "command": 0,
            "have_remaining": 0,
            "remaining_count": [],
            "remaining_mult": 1,
            "remaining_length": 0,
            "packet": bytearray(b""),
            "to_process": 0,
            "pos": 0,
        }

    def _refused_in_place(self, refused: RefusedPacket) -> None:
        if refused.qos == 1 and not self._manual_ack:
            self._send_puback(refused.mid)
        self._on_refused(refused)
