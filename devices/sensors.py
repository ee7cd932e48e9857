"""Simulated field sensors: publish telemetry over MQTT (QoS 1) and record what the broker took.

Invariant: a message is written to the record only after the broker acknowledged it (PUBACK),
so ``sent`` in the record is exactly what the gateway can be held to account for.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import paho.mqtt.client as mqtt

from devices.telemetry_model import new_sensor, readings, silent
from protocol.topics import telemetry_topic

log = logging.getLogger("devicesim.sensors")


@dataclass(frozen=True)
class SensorRun:
    broker: str
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


def _connect(url: str, client_id: str) -> mqtt.Client:
    parsed = urlparse(url)
    client = mqtt.Client(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311
    )
    client.max_inflight_messages_set(200)
    client.max_queued_messages_set(0)
    if parsed.scheme == "mqtts":
        client.tls_set()
    client.connect(parsed.hostname or "127.0.0.1", parsed.port or 1883, keepalive=30)
    client.loop_start()
    return client


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
    client = _connect(run.broker, f"devicesim-{run.gateway}-{run.prefix}-{run.seed}")
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
    parser.add_argument("--broker", default="mqtt://127.0.0.1:1883", help="mqtt://HOST:PORT")
    parser.add_argument("--gateway", default="gw1", help="gateway id the devices report to")
    parser.add_argument("--count", type=int, default=3, help="number of sensors")
    parser.add_argument("--rate", type=float, default=1.0, help="messages per second per sensor")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds to run (0 = until --messages)")
    parser.add_argument("--messages", type=int, default=None, help="stop after this many per sensor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix", default="sensor", help="device ids are PREFIX-000, PREFIX-001, ...")
    parser.add_argument("--dropout", type=float, default=0.002, help="per-sample probability of a dropout")
    parser.add_argument("--record", type=Path, default=None, help="write what the broker acked (JSON)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s devicesim %(levelname)s %(message)s")
    if args.count < 1 or args.rate <= 0:
        raise SystemExit("devicesim sensors: --count must be >= 1 and --rate > 0")
    sensor_run = SensorRun(
        broker=args.broker,
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
