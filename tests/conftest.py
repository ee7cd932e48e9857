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
    proc = subprocess.Popen(
        ["mosquitto", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_for_port(port, proc=proc)
    return proc


def mosquitto_config(tmp: Path, port: int, extra: str = "") -> Path:
    """A private broker: its own port, persistence in ``tmp`` (so sessions survive a restart)."""
    config = tmp / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {tmp}/\nmax_queued_messages 100000\nmax_inflight_messages 1000\n{extra}"
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


# --- cloudd: the real cloud daemon as a subprocess ------------------------------------------------

CLOUDD_GATEWAYS = ("gw1", "gw2", "gw3")
CLOUDD_OPERATOR_TOKEN = "operator-secret"
_REPO_ROOT = Path(__file__).resolve().parent.parent


def cloudd_token(gateway: str) -> str:
    """The upload token `start_cloudd` configures for ``gateway``."""
    return f"token-{gateway}"


@dataclass
class Cloudd:
    """A cloudd process of one test: its data dir survives kill/restart, its port stays the same."""

    data_dir: Path
    port: int
    gateways: tuple[str, ...]
    operator_token: str | None
    log_path: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token_for(self, gateway: str) -> str:
        if gateway not in self.gateways:
            raise KeyError(
                f"cloudd has no token for {gateway!r}; it knows {self.gateways} "
                "(start_cloudd(gateways=...) configures others)"
            )
        return cloudd_token(gateway)

    def start(self) -> None:
        import sys

        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("cloudd is already running")
        cmd = [
            sys.executable,
            "-m",
            "cloud.server",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--log-level",
            "INFO",
        ]
        for gateway in self.gateways:
            cmd += ["--token", f"{gateway}={cloudd_token(gateway)}"]
        if self.operator_token is not None:
            cmd += ["--operator-token", self.operator_token]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=_REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, timeout=20.0, proc=self.proc)

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind (the crash tests' fault)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM and wait (graceful shutdown); returns the exit code."""
        if self.proc is None:
            return None
        stop_process(self.proc)
        return self.proc.returncode

    def restart(self) -> None:
        self.stop()
        self.start()

    def status(self) -> dict:
        """GET /v1/status with the operator token."""
        import json
        import urllib.request

        request = urllib.request.Request(f"{self.url}/v1/status")
        if self.operator_token is not None:
            request.add_header("Authorization", f"Bearer {self.operator_token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def records(self, gateway: str | None = None) -> list:
        """What cloudd has committed, read from its data dir (read-only; safe while it runs)."""
        from cloud.store import DatasetStore

        return list(DatasetStore.open(self.data_dir, readonly=True).iter_records(gateway))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_cloudd(
    base: Path,
    gateways: tuple[str, ...] = CLOUDD_GATEWAYS,
    operator_token: str | None = CLOUDD_OPERATOR_TOKEN,
) -> Cloudd:
    """Start a cloudd with its data under ``base``; the caller stops it (``.stop()``)."""
    base.mkdir(parents=True, exist_ok=True)
    server = Cloudd(
        data_dir=base / "cloud-data",
        port=free_port(),
        gateways=tuple(gateways),
        operator_token=operator_token,
        log_path=base / "cloudd.log",
    )
    server.start()
    return server


@pytest.fixture
def cloudd(tmp_path: Path) -> Iterator[Cloudd]:
    """A real cloudd on a free port, gateways gw1..gw3 (``token_for``), operator token required."""
    server = start_cloudd(tmp_path / "cloudd")
    yield server
    server.stop()
