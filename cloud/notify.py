"""Model notices from cloudd: publish a retained ``ModelNotice`` on ``edgefed/<gw>/models/<name>``,
so each gateway's updater checks at once (polling stays its fallback; docs/camera.md). cloudd
announces to each gateway the version it is assigned (``notify_gateway``) whenever a name's
lifecycle changes (cloud/rollout/announce.py), never merely a new version; ``notify`` (the same
version to every gateway) is kept for registry listeners.

Owner: ``serve`` makes one ``ModelNotifier`` when ``cloudd --broker`` is given, ``start``s it before
the server and ``stop``s it after. The notifier owns one paho client (paho's own network thread,
``loop_start``) and one publisher thread that takes notices from a bounded queue.

Invariant: nothing here blocks the event loop or can stop cloudd: ``notify`` only puts on a bounded
queue (full: the notice is dropped and counted; gateways still poll), paho connects and reconnects on
its own thread (a dead broker is counted, never raised), and paho's outgoing queue is bounded too.
A notice is published retained with QoS 1, so a gateway that connects later still sees the latest.
"""

from __future__ import annotations

import argparse
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from protocol.events import ModelMetadata, ModelNotice
from protocol.topics import model_notice_topic

log = logging.getLogger("cloudd.notify")

QUEUE_SIZE = 256  # notices waiting for the publisher thread
PAHO_QUEUE = 1024  # QoS 1 messages paho holds while the broker is away


@dataclass(frozen=True)
class NotifyConfig:
    broker: str  # mqtt://HOST:PORT or mqtts://HOST:PORT
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    client_id: str = "edgefed-cloudd"

    def host_port_tls(self) -> tuple[str, int, bool]:
        parts = urlsplit(self.broker)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError(f"--broker {self.broker!r} must be mqtt://HOST:PORT or mqtts://HOST:PORT")
        tls = parts.scheme == "mqtts"
        return parts.hostname, parts.port or (8883 if tls else 1883), tls


def add_notify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        help="MQTT broker for model notices (mqtt:// or mqtts://); "
        "none: gateways learn of new models by polling only",
    )
    parser.add_argument("--broker-username")
    parser.add_argument("--broker-password-file", type=Path)
    parser.add_argument("--broker-ca-file", type=Path, help="CA for mqtts://")
    parser.add_argument("--broker-client-id", default="edgefed-cloudd")


def parse_notify_args(argv: Sequence[str] | None) -> NotifyConfig | None:
    """The notice options of a cloudd command line (the other options are cloudd's own parser's)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_notify_arguments(parser)
    return notify_config_from(parser.parse_known_args(argv)[0])


def notify_config_from(args: argparse.Namespace) -> NotifyConfig | None:
    """None without ``--broker``; ValueError naming the flag for a bad URL."""
    if not args.broker:
        return None
    config = NotifyConfig(
        args.broker,
        args.broker_username,
        args.broker_password_file,
        args.broker_ca_file,
        args.broker_client_id,
    )
    config.host_port_tls()
    return config


def notice_for(metadata: ModelMetadata) -> bytes:
    return (
        ModelNotice(name=metadata.name, version=metadata.version, sha256=metadata.sha256, size=metadata.size)
        .model_dump_json()
        .encode()
    )


class ModelNotifier:
    def __init__(self, config: NotifyConfig, gateways: Callable[[], Iterable[str]]) -> None:
        self.config = config
        self._gateways = gateways
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._stopping = False
        self.counters = {
            "notices": 0,
            "queued": 0,
            "dropped": 0,
            "published": 0,
            "held_for_reconnect": 0,
            "publish_failures": 0,
            "connects": 0,
            "disconnects": 0,
        }
        self._client = self._make_client()

    def _make_client(self) -> paho.Client:
        config = self.config
        _, _, tls = config.host_port_tls()
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2, client_id=config.client_id, protocol=paho.MQTTv5
        )
        if tls:
            client.tls_set(ca_certs=str(config.ca_file) if config.ca_file else None)
        if config.username is not None:
            password = config.password_file.read_text().strip() if config.password_file else None
            client.username_pw_set(config.username, password)
        client.max_queued_messages_set(PAHO_QUEUE)
        client.reconnect_delay_set(1, 30)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        return client

    # --- lifecycle (called on the event loop; nothing here waits for the broker) -----------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("ModelNotifier already started")
        host, port, _ = self.config.host_port_tls()
        self._client.connect_async(host, port, keepalive=30)
        self._client.loop_start()  # paho's thread connects, and reconnects after any loss
        self._thread = threading.Thread(target=self._publish_loop, name="model-notifier", daemon=True)
        self._thread.start()
        log.info("model notices go to %s", self.config.broker)

    def stop(self, join_s: float = 2.0) -> None:
        """Bounded: the publisher thread and paho's thread get ``join_s`` each."""
        self._stopping = True  # the publisher thread checks it at least every 0.5 s
        if self._thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            self._thread.join(join_s)
            self._thread = None
        self._client.disconnect()
        self._client.loop_stop()

    # --- the hook the registry calls --------------------------------------------------------------

    def notify(self, metadata: ModelMetadata) -> None:
        """Queue a retained notice for each known gateway; never blocks (a full queue drops, counted)."""
        self.counters["notices"] += 1
        for gateway in sorted(self._gateways()):
            self._queue_notice(gateway, metadata)

    def notify_gateway(self, gateway: str, metadata: ModelMetadata) -> None:
        """Queue a retained notice of ``metadata`` (the version it is assigned) for one gateway."""
        self.counters["notices"] += 1
        self._queue_notice(gateway, metadata)

    def _queue_notice(self, gateway: str, metadata: ModelMetadata) -> None:
        try:
            self._queue.put_nowait((model_notice_topic(gateway, metadata.name), notice_for(metadata)))
            self.counters["queued"] += 1
        except queue.Full:
            self.counters["dropped"] += 1
            log.warning(
                "model notice for %s@%s to %s dropped: queue full (the gateway will poll)",
                metadata.name,
                metadata.version,
                gateway,
            )

    # --- threads ---------------------------------------------------------------------------------

    def _publish_loop(self) -> None:
        while not self._stopping:
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                return
            topic, payload = item
            info = self._client.publish(topic, payload, qos=1, retain=True)
            if info.rc == paho.MQTT_ERR_SUCCESS:
                self.counters["published"] += 1
            elif info.rc == paho.MQTT_ERR_NO_CONN:
                self.counters["held_for_reconnect"] += 1  # QoS 1: paho keeps it (bounded) and sends it later
            else:
                self.counters["publish_failures"] += 1
                log.warning("model notice on %s not published: %s", topic, paho.error_string(info.rc))

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            log.warning("model notices: broker %s refused the connection: %s", self.config.broker, reason)
            return
        self.counters["connects"] += 1
        self._connected.set()

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self._connected.clear()
        if not self._stopping:
            self.counters["disconnects"] += 1

    def stats(self) -> dict[str, int]:
        return {**self.counters, "connected": int(self._connected.is_set()), "queue": self._queue.qsize()}
