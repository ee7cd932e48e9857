"""Values the MQTT adapter takes and gives: settings, the last will, inbound messages, errors, counters.

Invariant: plain immutable data (counters aside); no I/O here, so gatewayctl, tests and the daemon
share them without starting a connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from protocol.config import MQTT_MAX_PACKET_BYTES, MqttConfig, MqttVersion
from protocol.control import MAX_REQUEST_BYTES

ConnectionRole = Literal["data", "control"]
# The control connection reads requests of up to MAX_REQUEST_BYTES and small retained model notices.
# Twice that: a request a little over its limit still reaches the control plane and is answered
# (too_large), rather than dropped unanswered by the broker (MQTT 5).
CONTROL_MAX_PACKET_BYTES = 2 * MAX_REQUEST_BYTES


class MqttError(Exception):
    """Base of the adapter's errors."""


class MqttConnectError(MqttError):
    """The broker could not be reached or refused the connection."""


class MqttClosedBeforeConnack(MqttConnectError):
    """The connection ended after CONNECT and before the broker's CONNACK: what a TLS listener does
    to a plain MQTT client (the adapter then probes for TLS: runtime/tls_probe.py)."""


class MqttNotConnected(MqttError):
    """An operation needs a connection and there is none right now."""


class MqttTimeout(MqttError):
    """The broker did not answer in time."""


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


@dataclass(frozen=True)
class MqttSettings:
    """Everything the adapter needs; built from protocol.config.MqttConfig by ``settings_from_config``."""

    url: str
    client_id: str
    persistent_session: bool = True
    protocol_version: MqttVersion = "5"  # or "3.1.1" for brokers without v5 (the demo's amqtt)
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    keepalive_s: int = 30
    inbound_bound: int = 10_000
    max_packet_size: int = MQTT_MAX_PACKET_BYTES  # a larger packet is refused unread (packet_limit.py)
    manual_ack: bool = True
    will: Will | None = None
    connect_timeout_s: float = 10.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0

    @property
    def host_port_tls(self) -> tuple[str, int, bool]:
        parts = urlsplit(self.url)
        tls = parts.scheme == "mqtts"
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError(f"broker url {self.url!r} must be mqtt://HOST:PORT or mqtts://HOST:PORT")
        return parts.hostname, parts.port or (8883 if tls else 1883), tls


def settings_from_config(
    config: MqttConfig, gateway_id: str, will: Will | None, role: ConnectionRole = "data"
) -> MqttSettings:
    """Settings for a gateway daemon connection.

    ``role="data"``: the ingest connection: persistent session under a stable client id, manual acks.
    ``role="control"``: the control-plane connection, client id ``<id>-control``: a clean session
    (a request sent while the gateway was away is stale; the operator's tool has timed out), automatic
    acks, a small inbound bound (the broker keeps the rest while we catch up), and a packet limit
    that fits the largest request (``CONTROL_MAX_PACKET_BYTES``) rather than ``mqtt.max_packet_size``,
    which is sized for telemetry.
    """
    password = None
    if config.password_file is not None:
        password = Path(config.password_file).read_text().strip()
    client_id = config.client_id or f"edgefed-{gateway_id}"
    control = role == "control"
    return MqttSettings(
        url=config.broker,
        client_id=f"{client_id}-control" if control else client_id,
        username=config.username,
        password=password,
        ca_file=config.ca_file,
        cert_file=config.cert_file,
        key_file=config.key_file,
        keepalive_s=config.keepalive_s,
        inbound_bound=1000 if control else config.inbound_queue,
        max_packet_size=CONTROL_MAX_PACKET_BYTES if control else config.max_packet_size,
        will=will,
        persistent_session=not control,
        manual_ack=not control,
        protocol_version=config.protocol_version,
    )


@dataclass(frozen=True)
class InboundMessage:
    topic: str
    payload: bytes
    qos: int
    mid: int
    retain: bool
    connection: int  # which connection delivered it; acks go only to the current one
    response_topic: str | None = None  # MQTT v5 request/response properties, when the sender set them
    correlation_data: bytes | None = None
    # Set when the reader refused the packet for its size (MQTT 3.1.1: refused in place, see
    # gateway/mqtt/packet_limit.py): its size in bytes; ``payload`` is then empty, never read.
    oversize_bytes: int | None = None


@dataclass
class MqttCounters:
    messages_in: int = 0
    acks_sent: int = 0
    acks_skipped_stale: int = 0
    paused: int = 0
    overfull: int = 0
    connects: int = 0
    reconnects: int = 0
    connect_failures: int = 0
    subscribe_failures: int = 0
    published: int = 0
    publish_refused: int = 0
    packets_too_large: int = 0  # packets over max_packet_size the reader refused by their fixed header
