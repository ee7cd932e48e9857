"""Shared fixtures: real processes on free ports, cleaned up after each test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Broker:
    host: str
    port: int
    proc: subprocess.Popen
    config: Path

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def restart(self) -> None:
        stop_process(self.proc)
        self.proc = _start_mosquitto(self.config, self.port)

    def stop(self) -> None:
        stop_process(self.proc)


def _start_mosquitto(config: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(["mosquitto", "-c", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    wait_for_port(port, proc=proc)
    return proc


def mosquitto_config(tmp: Path, port: int, extra: str = "") -> Path:
    """A private broker: its own port, persistence in ``tmp`` (so sessions survive a restart)."""
    config = tmp / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {tmp}/\nmax_queued_messages 100000\n{extra}"
    )
    return config


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A real Mosquitto broker of this test's own, on a free port."""
    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed (apt-get install mosquitto)")
    port = free_port()
    broker_dir = tmp_path / "broker"
    broker_dir.mkdir()
    config = mosquitto_config(broker_dir, port)
    broker = Broker("127.0.0.1", port, _start_mosquitto(config, port), config)
    yield broker
    broker.stop()
