"""The gateway's one MQTT adapter: paho-mqtt 2.x driven by the daemon's asyncio loop.

Built the way aiomqtt is: no paho network thread. gateway/mqtt/socket_driver.py drives paho's socket from
the loop (reads, writes, keepalive), gateway/mqtt/packet_limit.py bounds what paho reads,
gateway/mqtt/inbound.py queues what it read, and gateway/mqtt/paho_options.py turns the settings into
paho's client and options; this module is the connection's life and its data path:
connect, reconnect, acks and publishes. The blocking TCP/TLS connect runs in a daemon thread
(``runtime.shutdown.in_daemon_thread``: one still blocked at stop does not hold the exit). A plain
``mqtt://`` connection that ends before its CONNACK may have met TLS: tls_hint.py says so.

The adapter owns one connection task that connects, waits for the connection to drop, backs off
and reconnects, for ever, until ``stop``; subscriptions are re-made on every connect.

Invariant: an inbound message is never dropped (the queue's bound pauses the socket: inbound.py),
and no packet over ``max_packet_size`` is read into memory (packet_limit.py). An ack is sent only
for a message of the current connection: after a reconnect the broker redelivers unacked messages
itself, so an ack with an old packet id could name another message.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho

from gateway.mqtt.inbound import InboundQueue
from gateway.mqtt.packet_limit import BoundedClient, RefusedPacket
from gateway.mqtt.paho_options import connect_arguments, make_client, publish_properties, subscribe_arguments
from gateway.mqtt.socket_driver import SocketDriver
from gateway.mqtt.tls_hint import TlsHint
from gateway.mqtt.types import (  # noqa: F401  (re-exported: the adapter's public names live here)
    InboundMessage,
    MqttClosedBeforeConnack,
    MqttConnectError,
    MqttCounters,
    MqttError,
    MqttNotConnected,
    MqttSettings,
    MqttTimeout,
    Will,
    settings_from_config,
)
from gateway.ratelimit import RateLimitedLog
from runtime.backoff import Backoff
from runtime.shutdown import in_daemon_thread
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)


@dataclass
class _Subscription:
    topic: str
    qos: int
    retain_as_published: bool = False


@dataclass
class _ConnectionState:
    number: int = 0
    connected: bool = False
    connack: asyncio.Future[bool] | None = None
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class MqttAdapter:
    """One MQTT connection under asyncio. ``start()`` returns at once; the connection comes and goes."""

    def __init__(
        self,
        settings: MqttSettings,
        on_connect_publish: list[Will] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.counters = MqttCounters()
        self._on_connect_publish = on_connect_publish or []
        self._rng = rng or random.Random()
        self._subscriptions: list[_Subscription] = []
        self._publish_waiters: dict[int, asyncio.Future[None]] = {}
        self._state = _ConnectionState()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.last_connect_error: str | None = None  # why the last connect failed (e.g. "not authorized")
        self._tls_hint = TlsHint(settings)
        self._warn = RateLimitedLog(log)
        self._client = self._make_client()
        self._socket = SocketDriver(self._client)
        self._inbound = InboundQueue(settings.inbound_bound, self._socket, self.counters)

    # --- lifecycle -------------------------------------------------------------------------------

    def _make_client(self) -> BoundedClient:
        client = make_client(self.settings, self._on_refused)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        return client

    def subscribe(self, topic: str, qos: int = 1, retain_as_published: bool = False) -> None:
        """Add a subscription, made now if connected and again on every reconnect (idempotent).
        ``retain_as_published`` (MQTT 5 only): a live message keeps the retain flag it was published
        with; otherwise only one sent for a new subscription has it (MQTT-3.3.1-9)."""
        subscription = _Subscription(topic, qos, retain_as_published)
        if subscription in self._subscriptions:
            return
        self._subscriptions.append(subscription)
        if self._state.connected:
            self._send_subscribe(subscription)

    def _send_subscribe(self, sub: _Subscription) -> None:
        options = subscribe_arguments(self.settings, sub.qos, sub.retain_as_published)
        self._client.subscribe(sub.topic, **options)

    async def start(self) -> None:
        if self._task is not None:
            raise MqttError("adapter already started")
        self._socket.start()
        self._task = asyncio.create_task(self._connection_loop(), name="mqtt-connection")

    @property
    def connected(self) -> bool:
        return self._state.connected

    async def wait_connected(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._state.connected:
            if asyncio.get_running_loop().time() > deadline:
                raise MqttTimeout(f"not connected to {self.settings.url} after {timeout_s}s")
            await asyncio.sleep(0.05)

    async def stop(self, final: Will | None = None, timeout_s: float = 5.0) -> None:
        """Publish ``final`` (e.g. a retained offline status), disconnect cleanly, end the tasks.

        ``final``'s PUBACK is not waited for: the DISCONNECT behind it on the same connection reaches
        the broker after it, while under a full message flow the broker's PUBACK came later than a
        stop can wait (over 1.6 s). Acks queued before the stop go out before the DISCONNECT too.
        """
        self._stopping = True
        self._socket.closing = True
        if self._state.connected:
            try:
                if final is not None:
                    await self.publish(final.topic, final.payload, final.qos, final.retain, wait=False)
                self._client.disconnect()
                if not await wait_event(self._state.lost, timeout_s):
                    raise TimeoutError(f"no disconnect within {timeout_s:.1f}s")
            except (MqttError, TimeoutError) as exc:
                log.warning("mqtt: unclean disconnect: %s", exc)
        await cancel_and_wait(self._task)
        self._task = None
        await self._socket.stop()
        for waiter in self._publish_waiters.values():
            if not waiter.done():
                waiter.set_exception(MqttNotConnected("adapter stopped"))

    # --- the connection task ---------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        retry = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s, self._rng)
        first = True
        while not self._stopping:
            try:
                await self._connect_once()
            except MqttError as exc:
                self.counters.connect_failures += 1
                self.last_connect_error = str(exc) + await self._tls_hint.after(exc)
                delay = retry.failed()
                log.warning(
                    "mqtt: cannot connect to %s (%s); retrying in %.1fs", self.settings.url, exc, delay
                )
                await asyncio.sleep(delay)
                continue
            retry.succeeded()
            self.last_connect_error = None
            if not first:
                self.counters.reconnects += 1
            first = False
            await self._state.lost.wait()
            if not self._stopping:
                log.warning("mqtt: connection to %s lost; reconnecting", self.settings.url)

    async def _connect_once(self) -> None:
        host, port, _ = self.settings.host_port_tls
        loop = asyncio.get_running_loop()
        connack: asyncio.Future[bool] = loop.create_future()
        self._state = _ConnectionState(number=self._state.number + 1, connack=connack)
        kwargs = connect_arguments(self.settings)
        try:
            async with asyncio.timeout(self.settings.connect_timeout_s + 1):
                await in_daemon_thread(  # a connect blocked at stop must not hold the exit
                    lambda: self._client.connect(host, port, self.settings.keepalive_s, **kwargs),
                    name=f"mqtt-connect-{self.settings.client_id}",
                )
            async with asyncio.timeout(self.settings.connect_timeout_s):
                await asyncio.shield(connack)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._socket.close_socket()
            raise MqttConnectError(str(exc) or type(exc).__name__) from None
        except TimeoutError:
            self._socket.close_socket()
            raise MqttTimeout(f"no CONNACK within {self.settings.connect_timeout_s}s") from None

    # --- paho callbacks (on the loop thread) -----------------------------------------------------

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        future = self._state.connack
        if reason.is_failure:
            if future is not None and not future.done():
                future.set_exception(MqttConnectError(f"broker refused: {reason}"))
            return
        self._state.connected = True
        self.counters.connects += 1
        log.info(
            "mqtt: connected to %s as %s (session present: %s)",
            self.settings.url,
            self.settings.client_id,
            flags.session_present,
        )
        for sub in self._subscriptions:
            self._send_subscribe(sub)
        for message in self._on_connect_publish:
            client.publish(message.topic, message.payload, qos=message.qos, retain=message.retain)
        if future is not None and not future.done():
            future.set_result(True)

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self._state.connected = False
        self._state.lost.set()
        future = self._state.connack
        if future is not None and not future.done():
            future.set_exception(MqttClosedBeforeConnack(f"disconnected before CONNACK: {reason}"))

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        self.counters.messages_in += 1
        props = getattr(message, "properties", None)  # None on MQTT 3.1.1, and so are both below
        correlation = getattr(props, "CorrelationData", None)
        self._inbound.put(
            InboundMessage(
                message.topic,
                bytes(message.payload),
                message.qos,
                message.mid,
                bool(message.retain),
                self._state.number,
                getattr(props, "ResponseTopic", None),
                bytes(correlation) if correlation is not None else None,
            )
        )

    def _on_refused(self, refused: RefusedPacket) -> None:
        """A packet over max_packet_size (packet_limit.py), counted. A PUBLISH refused in place goes to
        the consumer without its payload, to be refused and acked in order; else the connection ends."""
        self.counters.packets_too_large += 1
        if refused.closes:
            self._warn.warning("packet_too_large", "mqtt: %s; reconnecting", refused.describe(self.settings))
        else:
            self._inbound.put(refused.as_message(self._state.number))

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        if reason.is_failure:
            self.counters.publish_refused += 1  # e.g. the broker's ACL said no (MQTT v5 PUBACK reason)
        waiter = self._publish_waiters.get(mid)
        if waiter is not None and not waiter.done():
            if reason.is_failure:
                waiter.set_exception(MqttError(f"publish refused by the broker: {reason}"))
            else:
                waiter.set_result(None)

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        for reason in reasons:
            if reason.is_failure:
                self.counters.subscribe_failures += 1
                log.error("mqtt: subscription refused by the broker: %s", reason)

    # --- the public data path --------------------------------------------------------------------

    async def receive(self, timeout_s: float) -> InboundMessage | None:
        """The next inbound message in arrival order, or None after ``timeout_s`` seconds; nothing while
        the intake is held (inbound.py)."""
        return await self._inbound.take(timeout_s)

    async def receive_batch(self, timeout_s: float, limit: int) -> list[InboundMessage]:
        """``receive`` for a batch: the messages queued now, in arrival order, up to ``limit``;
        waits up to ``timeout_s`` seconds for the first (none came: an empty list)."""
        return await self._inbound.take_batch(timeout_s, limit)

    def hold(self, held: bool) -> None:
        """Hold (True) or release (False) the intake: a stopped service takes nothing, loses nothing."""
        self._inbound.hold(held)

    @property
    def held(self) -> bool:
        return self._inbound.held

    @property
    def inbound_len(self) -> int:
        return len(self._inbound)

    def ack(self, message: InboundMessage) -> bool:
        """Acknowledge ``message`` (call in arrival order). False if it belongs to an old connection."""
        return self.ack_many([message]) == 1

    def ack_many(self, messages: list[InboundMessage]) -> int:
        """Acknowledge ``messages`` (in arrival order), their PUBACKs in one write; returns how many
        were acked (QoS 0 counts: it needs none), the rest belonging to an old connection."""
        current = self._state.number if self._state.connected else None
        mids: list[int] = []  # QoS 1 PUBACKs not yet queued
        stale = 0
        for message in messages:
            if message.qos == 0:
                continue
            if message.connection != current:
                stale += 1
            elif message.qos == 1:
                mids.append(message.mid)
            else:  # QoS 2 (the ingest subscribes with QoS 1): its PUBCOMP after the PUBACKs before it
                self._client.ack_many(mids)
                mids = []
                self._client.ack(message.mid, message.qos)
        self._client.ack_many(mids)
        self.counters.acks_sent += sum(1 for m in messages if m.qos) - stale
        self.counters.acks_skipped_stale += stale
        return len(messages) - stale

    async def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        timeout_s: float = 5.0,
        *,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
        wait: bool = True,
    ) -> None:
        """Publish; for QoS 1 wait (up to ``timeout_s``) for the broker's PUBACK unless ``wait=False``.

        ``response_topic``/``correlation_data``/``expiry_s`` become MQTT v5 properties (ignored on 3.1.1).
        """
        if not self._state.connected:
            raise MqttNotConnected(f"not connected to {self.settings.url}")
        props = publish_properties(self.settings, response_topic, correlation_data, expiry_s)
        info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=props)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise MqttNotConnected(f"publish failed: {paho.error_string(info.rc)}")
        self.counters.published += 1
        if qos == 0 or not wait:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._publish_waiters[info.mid] = waiter
        try:
            if info.is_published():
                return
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            raise MqttTimeout(f"no PUBACK for {topic} within {timeout_s}s") from None
        finally:
            self._publish_waiters.pop(info.mid, None)

    def stats(self) -> dict[str, int]:
        connection = {"connected": int(self._state.connected), "inbound_queued": len(self._inbound)}
        return {**vars(self.counters), **connection, "reading_paused": int(self._socket.reading_paused)}
