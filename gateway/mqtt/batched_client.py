"""paho's client, reading and acknowledging in batches: what lets the ingest keep the broker's pace.

paho reads a packet with three or four ``recv`` calls (its first byte, its remaining length a byte
at a time, then its body), and sends each PUBACK with a ``send`` of its own. Here ``_sock_recv``
takes up to ``READ_BYTES`` from the socket at once and hands paho its pieces from that buffer, and
``ack_many`` queues the PUBACKs of many messages as one write.

The buffer holds bytes the selector no longer sees: whoever drives the socket must read on while
``buffered_bytes`` is not zero (gateway/mqtt/socket_driver.py does, as for TLS's own buffer).

Invariant: paho gets the socket's bytes in order, none twice and none lost while the connection
lasts; a closed socket's leftover bytes are dropped with it (the next connection starts on a packet
boundary). ``ack_many`` sends the same bytes as one ``ack`` per message, in the order given.
"""

from __future__ import annotations

import struct
from typing import Any

import paho.mqtt.client as paho

READ_BYTES = 64 * 1024
_PUBACK = struct.Struct("!BBH")  # PUBACK, remaining length 2, packet id: "success" in MQTT 3.1.1 and 5


class BatchedClient(paho.Client):
    def __init__(self, **client_args: Any) -> None:
        super().__init__(**client_args)
        self._read_buffer = b""
        self._read_at = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes read from the socket that paho has not taken yet."""
        return len(self._read_buffer) - self._read_at

    def _sock_recv(self, bufsize: int) -> bytes:
        at = self._read_at
        if at < len(self._read_buffer):
            piece = self._read_buffer[at : at + bufsize]
            self._read_at = at + len(piece)
            return piece
        data = super()._sock_recv(max(bufsize, READ_BYTES))  # BlockingIOError: nothing there yet
        if len(data) <= bufsize:
            self._read_buffer, self._read_at = b"", 0
            return data
        self._read_buffer, self._read_at = data, bufsize
        return data[:bufsize]

    def _sock_close(self) -> None:
        self._read_buffer, self._read_at = b"", 0
        super()._sock_close()

    def ack_many(self, mids: list[int]) -> None:
        """PUBACK each QoS 1 message of ``mids`` (packet ids, in order), all in one write, as ``ack``
        would one by one."""
        if mids and self._manual_ack:  # without manual acks paho acked each message as it read it
            packets = b"".join([_PUBACK.pack(paho.PUBACK, 2, mid) for mid in mids])
            self._packet_queue(paho.PUBACK, packets, 0, 1)
