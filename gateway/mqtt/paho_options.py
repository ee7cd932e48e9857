"""``MqttSettings`` as paho sees them: the client, the CONNECT's arguments, a subscription's and a
publish's options. Pure: nothing here opens a socket (the adapter connects and sets the callbacks).

Invariant: paho never reconnects on its own (the adapter's connection task does), acks only when
``manual_ack`` leaves that to the adapter, keeps the session across reconnects and daemon restarts
when ``persistent_session`` is set, and on MQTT 5 tells the broker to send no more than the
inbound queue holds (``ReceiveMaximum``) and no packet over what the reader takes
(``MaximumPacketSize``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.mqtt.packet_limit import BoundedClient, RefusedPacket
from gateway.mqtt.types import MqttSettings

SESSION_EXPIRY_S = 7 * 24 * 3600  # the broker keeps the session (and queued QoS 1) for a week offline


def make_client(s: MqttSettings, on_refused: Callable[[RefusedPacket], None]) -> BoundedClient:
    """paho's client for ``s``, without callbacks; ``on_refused``: a packet over max_packet_size."""
    v5 = s.protocol_version == "5"
    client = BoundedClient(
        s.max_packet_size,
        on_refused,
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=s.client_id,
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        manual_ack=s.manual_ack,
        clean_session=None if v5 else not s.persistent_session,
        reconnect_on_failure=False,
    )
    _, _, tls = s.host_port_tls
    if tls:
        client.tls_set(
            ca_certs=str(s.ca_file) if s.ca_file else None,
            certfile=str(s.cert_file) if s.cert_file else None,
            keyfile=str(s.key_file) if s.key_file else None,
        )
    if s.username is not None:
        client.username_pw_set(s.username, s.password)
    if s.will is not None:
        client.will_set(s.will.topic, s.will.payload, qos=s.will.qos, retain=s.will.retain)
    client.connect_timeout = s.connect_timeout_s
    client.max_inflight_messages_set(1000)  # paho's default of 20 throttles bursts of QoS 1 replies
    return client


def connect_arguments(s: MqttSettings) -> dict[str, Any]:
    """The keyword arguments of ``connect`` beyond host, port and keepalive."""
    if s.protocol_version != "5":
        return {}  # v3.1.1: clean_session was given to the Client
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = SESSION_EXPIRY_S if s.persistent_session else 0
    props.ReceiveMaximum = max(1, min(s.inbound_bound, 65535))
    # One byte under what the reader takes: mosquitto (2.0, packet__check_oversize) leaves a
    # packet's first byte out of its size, so it sends up to one byte more than announced.
    props.MaximumPacketSize = s.max_packet_size - 1
    # clean_start=False on every connect: the session must survive a daemon restart
    return {"clean_start": not s.persistent_session, "properties": props}


def subscribe_arguments(s: MqttSettings, qos: int, retain_as_published: bool) -> dict[str, Any]:
    """The ``qos`` and ``options`` keyword arguments of ``subscribe``."""
    v5 = s.protocol_version == "5"  # the QoS goes in the options (3.1.1 has none), not both
    options = SubscribeOptions(qos, retainAsPublished=retain_as_published) if v5 else None
    return {"qos": 0 if v5 else qos, "options": options}


def publish_properties(
    s: MqttSettings, response_topic: str | None, correlation_data: bytes | None, expiry_s: int | None
) -> Properties | None:
    """A PUBLISH's MQTT v5 properties (None: none given, or MQTT 3.1.1, which has none)."""
    given = response_topic or correlation_data is not None or expiry_s is not None
    if s.protocol_version != "5" or not given:
        return None
    props = Properties(PacketTypes.PUBLISH)
    if response_topic:
        props.ResponseTopic = response_topic
    if correlation_data is not None:
        props.CorrelationData = correlation_data
    if expiry_s is not None:
        props.MessageExpiryInterval = expiry_s
    return props
