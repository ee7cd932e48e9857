"""Helpers for gateway tests: a real gatewayd subprocess, a QoS 1 publisher, a retained-message reader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from conftest import free_port, wait_for_port
from paho.mqtt.enums import CallbackAPIVersion

REPO = Path(__file__).resolve().parents[1]


def write_config(
    tmp: Path,
    broker_url: str,
    gateway_id: str = "gw1",
    extra: str = "",
    http_port: int | None = None,
    cloud_url: str = "http://127.0.0.1:9",
    token: str = "t0k3n",
) -> tuple[Path, int]:
    port = http_port or free_port()
    config = tmp / f"{gateway_id}.toml"
    config.write_text(
        f'gateway_id = "{gateway_id}"\ndata_dir = "data-{gateway_id}"\n'
        f'[mqtt]\nbroker = "{broker_url}"\n[http]\nlisten = "127.0.0.1:{port}"\n'
        f'[uplink]\ncloud_url = "{cloud_url}"\ntoken = "{token}"\nbackoff_max_s = 1.0\n{extra}'
    )
    return config, port


class Gatewayd:
    def __init__(self, config: Path, http_port: int) -> None:
        self.config = config
        self.http_port = http_port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.daemon", "--config", str(config)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    def wait_ready(self, timeout: float = 20.0) -> Gatewayd:
        wait_for_port(self.http_port, timeout=timeout, proc=self.proc)
        wait_until(lambda: self.status()["mqtt"]["connected"] == 1, timeout, "gatewayd connected to broker")
        return self

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as response:
            return response.read()

    def status(self) -> dict[str, Any]:
        return json.loads(self.get("/status"))

    def terminate(self, timeout: float = 15.0) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout}s waiting for: {what}")


def publish(broker_port: int, messages: list[tuple[str, bytes]], qos: int = 1) -> None:
    """Publish with QoS 1 and wait until the broker has every message."""
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", broker_port)
    client.loop_start()
    try:
        infos = [client.publish(topic, payload, qos=qos) for topic, payload in messages]
        for info in infos:
            info.wait_for_publish(timeout=10)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def retained(broker_port: int, topics: list[str], timeout_s: float = 10.0) -> dict[str, bytes]:
    """What a late subscriber gets on ``topics`` (retained messages)."""
    got: dict[str, bytes] = {}
    done = threading.Event()
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)

    def on_message(client, userdata, message) -> None:
        got[message.topic] = bytes(message.payload)
        if set(got) >= set(topics):
            done.set()

    client.on_message = on_message
    client.on_connect = lambda c, *a: [c.subscribe(t, qos=1) for t in topics]
    client.connect("127.0.0.1", broker_port)
    client.loop_start()
    try:
        done.wait(timeout_s)
    finally:
        client.disconnect()
        client.loop_stop()
    return got


def telemetry(device: str, seq: int, **overrides: Any) -> bytes:
    body = {
        "v": 1,
        "device": device,
        "seq": seq,
        "ts": 1764489600.0 + seq,
        "readings": {"temperature_c": 21.5},
        "status": "ok",
    }
    body.update(overrides)
    return json.dumps(body).encode()
