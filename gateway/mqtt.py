"""The gateway's one MQTT adapter: paho-mqtt 2.x driven by the daemon's asyncio loop.

Built the way aiomqtt is: no paho network thread. Paho's socket callbacks attach its socket to
the loop (``add_reader``/``add_writer`` call ``loop_read``/``loop_write``) and a misc task calls
``loop_misc`` every second (keepalive). The blocking TCP/TLS connect runs in an executor thread,
so callbacks fired from it reach the loop through ``call_soon_threadsafe``.

The adapter owns one connection task that connects, waits for the connection to drop, backs off
and reconnects, for ever, until ``stop``; subscriptions are re-made on every connect.

Invariant: an inbound message is never dropped. When the inbound queue holds ``inbound_bound``
messages the adapter stops reading the socket (the broker keeps what it has not delivered) and
reads again once the consumer has taken half of them. Messages already inside one ``loop_read``
call are still queued, so the queue may exceed its bound by that much (counted as ``overfull``).
An ack is sent only for a message of the current connection: after a reconnect the broker
redelivers unacked messages itself, so an ack with an old packet id could name another message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

log = logging.getLogger(__name__)

SESSION_EXPIRY_S = 7 * 24 * 3600  # the broker keeps the session (and queued QoS 1) for a week offline
MISC_INTERVAL_S = 1.0


class MqttError(Exception):
    """Base of the adapter's errors."""


class MqttConnectError(MqttError):
    """The broker could not be reached or refused the connection."""


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
    protocol_version: str = "5"  # or "3.1.1" for brokers without v5 (the demo's amqtt)
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    keepalive_s: int = 30
    inbound_bound: int = 10_000
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


def settings_from_config(config: Any, gateway_id: str, will: Will | None) -> MqttSettings:
    """Settings for a gateway daemon: persistent session under a stable client id, manual acks."""
    password = None
    if config.password_file is not None:
        password = Path(config.password_file).read_text().strip()
    return MqttSettings(
        url=config.broker, client_id=config.client_id or f"edgefed-{gateway_id}",
        username=config.username, password=password, ca_file=config.ca_file,
        cert_file=config.cert_file, key_file=config.key_file, keepalive_s=config.keepalive_s,
        inbound_bound=config.inbound_queue, will=will,
        protocol_version=getattr(config, "protocol_version", "5"),
    )


@dataclass(frozen=True)
class InboundMessage:
    topic: str
    payload: bytes
    qos: int
    mid: int
    retain: bool
    connection: int  # which connection delivered it; acks go only to the current one


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


@dataclass
class _Subscription:
    topic: str
    qos: int


@dataclass
class _ConnectionState:
    number: int = 0
    connected: bool = False
    connack: asyncio.Future[bool] | None = None
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class MqttAdapter:
    """One MQTT connection under asyncio. ``start()`` returns at once; the connection comes and goes."""

    def __init__(self, settings: MqttSettings, on_connect_publish: list[Will] | None = None,
                 rng: random.Random | None = None) -> None:
        self.settings = settings
        self.counters = MqttCounters()
        self._on_connect_publish = on_connect_publish or []
        self._rng = rng or random.Random()
        self._subscriptions: list[_Subscription] = []
        self._inbound: collections.deque[InboundMessage] = collections.deque()
        self._inbound_ready = asyncio.Event()
        self._publish_waiters: dict[int, asyncio.Future[None]] = {}
        self._state = _ConnectionState()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._sock: Any = None
        self._reading_paused = False
        self._task: asyncio.Task[None] | None = None
        self._misc_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._client = self._make_client()

    # --- lifecycle -------------------------------------------------------------------------------

    def _make_client(self) -> paho.Client:
        s = self.settings
        v5 = s.protocol_version == "5"
        client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=s.client_id,
                             protocol=paho.MQTTv5 if v5 else paho.MQTTv311, manual_ack=s.manual_ack,
                             clean_session=None if v5 else not s.persistent_session,
                             reconnect_on_failure=False)
        _, _, tls = s.host_port_tls
        if tls:
            client.tls_set(ca_certs=str(s.ca_file) if s.ca_file else None,
                           certfile=str(s.cert_file) if s.cert_file else None,
                           keyfile=str(s.key_file) if s.key_file else None)
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        if s.will is not None:
            client.will_set(s.will.topic, s.will.payload, qos=s.will.qos, retain=s.will.retain)
        client.connect_timeout = s.connect_timeout_s
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_socket_register_write
        client.on_socket_unregister_write = self._on_socket_unregister_write
        return client

    def subscribe(self, topic: str, qos: int = 1) -> None:
        """Add a subscription, made now if connected and again on every reconnect."""
        self._subscriptions.append(_Subscription(topic, qos))
        if self._state.connected:
            self._client.subscribe(topic, qos=qos)

    async def start(self) -> None:
        if self._task is not None:
            raise MqttError("adapter already started")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._misc_task = asyncio.create_task(self._misc_loop(), name="mqtt-misc")
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
        """Publish ``final`` (e.g. a retained offline status), disconnect cleanly, end the tasks."""
        self._stopping = True
        if self._state.connected:
            try:
                if final is not None:
                    await self.publish(final.topic, final.payload, final.qos, final.retain,
                                       timeout_s=timeout_s / 2)
                self._client.disconnect()
                await asyncio.wait_for(self._state.lost.wait(), timeout_s / 2)
            except (MqttError, TimeoutError) as exc:
                log.warning("mqtt: unclean disconnect: %s", exc)
        for task in (self._task, self._misc_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._misc_task = None
        self._client._sock_close()  # paho's own close also detaches the socket from the loop
        for waiter in self._publish_waiters.values():
            if not waiter.done():
                waiter.set_exception(MqttNotConnected("adapter stopped"))

    # --- the connection task ---------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        backoff = self.settings.backoff_initial_s
        first = True
        while not self._stopping:
            try:
                await self._connect_once()
            except MqttError as exc:
                self.counters.connect_failures += 1
                delay = min(backoff, self.settings.backoff_max_s) * (0.5 + self._rng.random())
                log.warning("mqtt: cannot connect to %s (%s); retrying in %.1fs",
                            self.settings.url, exc, delay)
                backoff = min(backoff * 2, self.settings.backoff_max_s)
                await asyncio.sleep(delay)
                continue
            backoff = self.settings.backoff_initial_s
            if not first:
                self.counters.reconnects += 1
            first = False
            await self._state.lost.wait()
            if not self._stopping:
                log.warning("mqtt: connection to %s lost; reconnecting", self.settings.url)

    async def _connect_once(self) -> None:
        host, port, _ = self.settings.host_port_tls
        loop = asyncio.get_running_loop()
        self._state = _ConnectionState(number=self._state.number + 1, connack=loop.create_future())
        if self.settings.protocol_version == "5":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY_S if self.settings.persistent_session else 0
            props.ReceiveMaximum = max(1, min(self.settings.inbound_bound, 65535))
            # clean_start=False on every connect: the session must survive a daemon restart
            kwargs: dict[str, Any] = {"clean_start": not self.settings.persistent_session,
                                      "properties": props}
        else:
            kwargs = {}  # v3.1.1: clean_session was given to the Client
        try:
            await asyncio.wait_for(loop.run_in_executor(
                None, lambda: self._client.connect(host, port, self.settings.keepalive_s, **kwargs)),
                self.settings.connect_timeout_s + 1)
            await asyncio.wait_for(asyncio.shield(self._state.connack), self.settings.connect_timeout_s)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._client._sock_close()
            raise MqttConnectError(str(exc) or type(exc).__name__) from None
        except TimeoutError:
            self._client._sock_close()
            raise MqttTimeout(f"no CONNACK within {self.settings.connect_timeout_s}s") from None

    async def _misc_loop(self) -> None:
        while True:
            await asyncio.sleep(MISC_INTERVAL_S)
            if self._sock is not None:
                self._client.loop_misc()

    # --- paho callbacks (on the loop thread, except socket open/write during connect) -----------

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        future = self._state.connack
        if reason.is_failure:
            if future is not None and not future.done():
                future.set_exception(MqttConnectError(f"broker refused: {reason}"))
            return
        self._state.connected = True
        self.counters.connects += 1
        log.info("mqtt: connected to %s as %s (session present: %s)", self.settings.url,
                 self.settings.client_id, flags.session_present)
        for sub in self._subscriptions:
            client.subscribe(sub.topic, qos=sub.qos)
        for message in self._on_connect_publish:
            client.publish(message.topic, message.payload, qos=message.qos, retain=message.retain)
        if future is not None and not future.done():
            future.set_result(True)

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self._state.connected = False
        self._state.lost.set()
        future = self._state.connack
        if future is not None and not future.done():
            future.set_exception(MqttConnectError(f"disconnected before CONNACK: {reason}"))

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        self.counters.messages_in += 1
        self._inbound.append(InboundMessage(message.topic, bytes(message.payload), message.qos, message.mid,
                                            bool(message.retain), self._state.number))
        if len(self._inbound) > self.settings.inbound_bound:
            self.counters.overfull += 1
        if len(self._inbound) >= self.settings.inbound_bound and not self._reading_paused:
            self.counters.paused += 1
            self._set_reading(False)
        self._inbound_ready.set()

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        waiter = self._publish_waiters.get(mid)
        if waiter is not None and not waiter.done():
            if reason.is_failure:
                waiter.set_exception(MqttError(f"publish refused: {reason}"))
            else:
                waiter.set_result(None)

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        for reason in reasons:
            if reason.is_failure:
                self.counters.subscribe_failures += 1
                log.error("mqtt: subscription refused by the broker: %s", reason)

    def _in_loop(self, fn: Any, *args: Any) -> None:
        assert self._loop is not None
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._in_loop(self._attach, sock)

    def _attach(self, sock: Any) -> None:
        self._sock = sock
        self._reading_paused = True
        self._set_reading(not self._stopping)

    def _on_socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        # Detach before paho closes the socket: a closed socket has no fd to remove.
        if threading.get_ident() == self._loop_thread:
            self._detach(sock)
        else:
            assert self._loop is not None
            fd = sock.fileno()
            self._loop.call_soon_threadsafe(self._detach_fd, fd)

    def _detach(self, sock: Any) -> None:
        if self._sock is sock:
            self._sock = None
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(sock)  # type: ignore[union-attr]
            self._loop.remove_writer(sock)  # type: ignore[union-attr]

    def _detach_fd(self, fd: int) -> None:
        self._sock = None
        if fd >= 0:
            self._loop.remove_reader(fd)  # type: ignore[union-attr]
            self._loop.remove_writer(fd)  # type: ignore[union-attr]

    def _on_socket_register_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._in_loop(self._add_writer, sock)

    def _add_writer(self, sock: Any) -> None:
        if sock.fileno() >= 0:
            self._loop.add_writer(sock, self._client.loop_write)  # type: ignore[union-attr]

    def _on_socket_unregister_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._in_loop(self._remove_writer, sock)

    def _remove_writer(self, sock: Any) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_writer(sock)  # type: ignore[union-attr]

    def _readable(self) -> None:
        self._client.loop_read()
        # TLS can hold decrypted bytes the selector cannot see; drain them now.
        while (not self._reading_paused and isinstance(self._sock, ssl.SSLSocket)
               and self._sock.pending() > 0):
            self._client.loop_read()

    def _set_reading(self, on: bool) -> None:
        if self._sock is None or self._loop is None or self._sock.fileno() < 0:
            self._reading_paused = not on
            return
        if on and self._reading_paused:
            self._loop.add_reader(self._sock, self._readable)
            if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0:
                self._loop.call_soon(self._readable)
        elif not on and not self._reading_paused:
            self._loop.remove_reader(self._sock)
        self._reading_paused = not on

    # --- the public data path --------------------------------------------------------------------

    async def receive(self, timeout_s: float) -> InboundMessage | None:
        """The next inbound message in arrival order, or None after ``timeout_s`` seconds."""
        if not self._inbound:
            self._inbound_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._inbound_ready.wait(), timeout_s)
            if not self._inbound:
                return None
        message = self._inbound.popleft()
        if (self._reading_paused and not self._stopping
                and len(self._inbound) <= self.settings.inbound_bound // 2):
            self._set_reading(True)
        return message

    @property
    def inbound_len(self) -> int:
        return len(self._inbound)

    def ack(self, message: InboundMessage) -> bool:
        """Acknowledge ``message`` (call in arrival order). False if it belongs to an old connection."""
        if message.qos == 0:
            return True
        if message.connection != self._state.number or not self._state.connected:
            self.counters.acks_skipped_stale += 1
            return False
        self._client.ack(message.mid, message.qos)
        self.counters.acks_sent += 1
        return True

    async def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                      timeout_s: float = 5.0) -> None:
        """Publish; for QoS 1 wait (up to ``timeout_s``) for the broker's PUBACK."""
        if not self._state.connected:
            raise MqttNotConnected(f"not connected to {self.settings.url}")
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise MqttNotConnected(f"publish failed: {paho.error_string(info.rc)}")
        self.counters.published += 1
        if qos == 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._publish_waiters[info.mid] = waiter
        try:
            if info.is_published():
                return
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            raise MqttTimeout(f"no PUBACK for {topic} within {timeout_s}s") from None
        finally:
            self._publish_waiters.pop(info.mid, None)

    def stats(self) -> dict[str, int]:
        out = dict(vars(self.counters))
        out["connected"] = int(self._state.connected)
        out["inbound_queued"] = len(self._inbound)
        out["reading_paused"] = int(self._reading_paused)
        return out
