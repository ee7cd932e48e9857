"""Simulated field sensors: publish telemetry over MQTT (QoS 1) and record what the broker took.

Invariant: a message is written to the record only after the broker acknowledged it (PUBACK),
so ``sent`` in the record is exactly what the gateway can be held to account for.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import paho.mqtt.client as mqtt

from devices.flags import integer, number, readable_file
from devices.telemetry_model import new_sensor, readings, silent
from protocol.topics import telemetry_topic
from runtime.tls_probe import speaks_tls, tls_hint

log = logging.getLogger("devicesim.sensors")

CONNECT_TIMEOUT_S = 10.0  # the broker's CONNACK, TLS handshake included


@dataclass(frozen=True)
class BrokerLogin:
    """How the sensors log in to the broker: a user and its password (read from a file), and for an
    ``mqtts://`` broker the CA to verify it and, for mutual TLS, a client certificate and key."""

    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None  # None: the system's CAs
    cert_file: Path | None = None
    key_file: Path | None = None


@dataclass(frozen=True)
class SensorRun:
    broker: str
    login: BrokerLogin = BrokerLogin()
    gateway: str = "gw1"
    count: int = 3
    rate_hz: float = 1.0
    duration_s: float | None = 30.0
    messages: int | None = None  # per device; stops early when every device has sent this many
    seed: int = 0
    prefix: str = "sensor"
    dropout_probability: float = 0.002
    time_scale: float = 60.0  # simulated seconds per wall second, so the daily cycle shows
    record: Path | None = None


@dataclass
class SentRecord:
    """What the broker acknowledged, per device: the sequence numbers, in order."""

    sent: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(len(seqs) for seqs in self.sent.values())

    def to_json(self) -> dict:
        return {"v": 1, "total": self.total, "sent": self.sent}

    @classmethod
    def load(cls, path: Path) -> SentRecord:
        return cls(sent={k: list(v) for k, v in json.loads(path.read_text())["sent"].items()})


def _connect(url: str, client_id: str, login: BrokerLogin) -> mqtt.Client:
    """A connected client, its network thread started; ConnectionError if the broker refuses the
    login or does not answer within CONNECT_TIMEOUT_S (ssl.SSLError, an OSError too, for TLS)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname:
        raise ValueError(f"{url!r} must be mqtt://HOST:PORT or mqtts://HOST:PORT")
    tls = parsed.scheme == "mqtts"
    client = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311
    )
    client.max_inflight_messages_set(200)
    client.max_queued_messages_set(0)
    if tls:
        client.tls_set(
            ca_certs=_str(login.ca_file), certfile=_str(login.cert_file), keyfile=_str(login.key_file)
        )
    if login.username is not None:
        password = login.password_file.read_text().strip() if login.password_file else None
        client.username_pw_set(login.username, password)
    answered = threading.Event()
    refused: list[str] = []  # the broker's CONNACK said no
    closed: list[str] = []  # the connection ended before any CONNACK

    def on_connect(client: mqtt.Client, userdata: object, flags: object, reason: Any, props: object) -> None:
        if reason.is_failure:
            refused.append(str(reason))
        answered.set()

    def on_disconnect(
        client: mqtt.Client, userdata: object, flags: object, reason: Any, props: object
    ) -> None:
        if not answered.is_set():
            closed.append(str(reason))
            answered.set()

    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    host, port = parsed.hostname, parsed.port or (8883 if tls else 1883)
    client.connect(host, port, keepalive=30)
    client.loop_start()
    if answered.wait(CONNECT_TIMEOUT_S) and not (refused or closed):
        return client
    client.loop_stop()  # before paho's thread tries again
    client.disconnect()
    if refused:
        raise ConnectionError(f"broker refused: {refused[0]}")
    if not closed:
        raise ConnectionError(f"no CONNACK within {CONNECT_TIMEOUT_S:g}s")
    why = f"connection closed before CONNACK ({closed[0]})"
    if not tls and speaks_tls(host, port):
        why += f"; {tls_hint(host, port)}"
    elif tls and login.cert_file is None:  # how a listener that requires a client certificate ends it
        why += "; does the broker require a client certificate (--cert-file, --key-file)?"
    raise ConnectionError(why)


def _str(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def run_sensors(
    run: SensorRun,
    stop: threading.Event | None = None,
    on_progress: Callable[[SentRecord], None] | None = None,
) -> SentRecord:
    """Publish until the duration, the message count or ``stop``; return what the broker acked."""
    stop = stop or threading.Event()
    devices = [f"{run.prefix}-{i:03d}" for i in range(run.count)]
    states = {device: new_sensor(run.seed, i) for i, device in enumerate(devices)}
    next_seq = dict.fromkeys(devices, 0)
    record = SentRecord(sent={device: [] for device in devices})
    in_flight: list[tuple[str, int, mqtt.MQTTMessageInfo]] = []
    client = _connect(run.broker, f"devicesim-{run.gateway}-{run.prefix}-{run.seed}", run.login)
    start = time.monotonic()
    sim_start = time.time()
    period = 1.0 / run.rate_hz
    tick = 0
    try:
        while not stop.is_set():
            elapsed = time.monotonic() - start
            if run.duration_s is not None and elapsed >= run.duration_s:
                break
            if run.messages is not None and all(n >= run.messages for n in next_seq.values()):
                break
            sim_time = sim_start + elapsed * run.time_scale
            for device in devices:
                if run.messages is not None and next_seq[device] >= run.messages:
                    continue
                state = states[device]
                if silent(state, run.dropout_probability):
                    continue
                values, status = readings(state, sim_time)
                seq = next_seq[device]
                payload = json.dumps(
                    {
                        "v": 1,
                        "device": device,
                        "seq": seq,
                        "ts": round(sim_time, 3),
                        "readings": values,
                        "status": status,
                    }
                )
                info = client.publish(telemetry_topic(run.gateway, device), payload, qos=1)
                in_flight.append((device, seq, info))
                next_seq[device] = seq + 1
            _collect_acked(in_flight, record, wait=False)
            if on_progress:
                on_progress(record)
            tick += 1
            delay = start + tick * period - time.monotonic()
            if delay > 0:
                stop.wait(delay)
        _collect_acked(in_flight, record, wait=True)
    finally:
        client.loop_stop()
        client.disconnect()
    if run.record:
        run.record.write_text(json.dumps(record.to_json()))
    return record


def _collect_acked(in_flight: list, record: SentRecord, wait: bool) -> None:
    """Move broker-acknowledged messages from ``in_flight`` into ``record``, keeping their order."""
    while in_flight:
        device, seq, info = in_flight[0]
        if not info.is_published():
            if not wait:
                return
            info.wait_for_publish(timeout=30)
            if not info.is_published():
                log.warning("broker did not acknowledge %s seq %d within 30 s", device, seq)
                in_flight.pop(0)
                continue
        record.sent[device].append(seq)
        in_flight.pop(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker", default="mqtt://127.0.0.1:1883", help="mqtt://HOST:PORT or mqtts://HOST:PORT"
    )
    parser.add_argument("--gateway", default="gw1", help="gateway id the devices report to")
    parser.add_argument("--count", type=integer(1), default=3, help="number of sensors")
    parser.add_argument("--rate", type=number(above=0), default=1.0, help="messages per second per sensor")
    parser.add_argument(
        "--duration", type=number(0), default=30.0, help="seconds to run (0 = until --messages)"
    )
    parser.add_argument("--messages", type=integer(1), default=None, help="stop after this many per sensor")
    parser.add_argument("--seed", type=integer(), default=0)
    parser.add_argument("--prefix", default="sensor", help="device ids are PREFIX-000, PREFIX-001, ...")
    parser.add_argument(
        "--dropout", type=number(0, 1), default=0.002, help="per-sample probability of a dropout, 0 to 1"
    )
    parser.add_argument("--record", type=Path, default=None, help="write what the broker acked (JSON)")
    login = parser.add_argument_group("logging in to the broker (as gatewayctl does)")
    login.add_argument("--username")
    login.add_argument("--password-file", type=readable_file, help="file holding the password alone")
    login.add_argument(
        "--ca-file", type=readable_file, help="CA to verify the broker (mqtts; default: system CAs)"
    )
    login.add_argument("--cert-file", type=readable_file, help="client certificate (mqtts, mutual TLS)")
    login.add_argument("--key-file", type=readable_file, help="the client certificate's key")


def broker_login(args: argparse.Namespace) -> BrokerLogin:
    """The login flags as a BrokerLogin; ValueError (a usage error) for a combination that cannot work."""
    if args.password_file is not None and args.username is None:
        raise ValueError("--password-file needs --username")
    tls_files = [
        f"--{name}" for name in ("ca-file", "cert-file", "key-file") if getattr(args, name.replace("-", "_"))
    ]
    if tls_files and not args.broker.startswith("mqtts://"):
        raise ValueError(f"{', '.join(tls_files)}: for an mqtts:// broker, not {args.broker}")
    if (args.cert_file is None) != (args.key_file is None):
        raise ValueError("--cert-file and --key-file go together")
    return BrokerLogin(args.username, args.password_file, args.ca_file, args.cert_file, args.key_file)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s devicesim %(levelname)s %(message)s")
    try:
        login = broker_login(args)
    except ValueError as exc:
        print(f"devicesim sensors: {exc}", file=sys.stderr)
        return 2
    sensor_run = SensorRun(
        broker=args.broker,
        login=login,
        gateway=args.gateway,
        count=args.count,
        rate_hz=args.rate,
        duration_s=args.duration or None,
        messages=args.messages,
        seed=args.seed,
        prefix=args.prefix,
        dropout_probability=args.dropout,
        record=args.record,
    )
    try:
        record = run_sensors(sensor_run)
    except (OSError, ValueError) as exc:
        log.error("cannot publish to %s: %s", args.broker, exc)
        return 1
    print(json.dumps({"sent": record.total}))
    return 0
