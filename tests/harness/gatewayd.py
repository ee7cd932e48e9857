"""gatewayd, the real gateway daemon, as a subprocess: its config files (plain broker or the secure
one), the process (``Gatewayd``), its HTTP status, the telemetry a device publishes to it, and the
telemetry records its log holds once it has stopped (``log_records``).

The daemon's output goes to ``<config stem>.log`` beside its config; ``terminate`` returns what this
run of the daemon wrote there.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.storage.epoch_log import EpochLog
from tests.harness.broker import SecureBroker
from tests.harness.install import Installation
from tests.harness.poll import wait_until
from tests.harness.processes import (
    LogFile,
    ProcessExited,
    free_port,
    kill_process,
    start_module,
    start_program,
    wait_for_port,
)


def write_config(
    tmp: Path,
    broker_url: str,
    gateway_id: str = "gw1",
    extra: str = "",
    http_port: int | None = None,
    cloud_url: str = "http://127.0.0.1:9",
    token: str = "t0k3n",
    mqtt: str = "",
) -> tuple[Path, int]:
    """``<tmp>/<gateway_id>.toml`` for a gateway on ``broker_url``; ``extra`` lands inside [uplink]
    (start it with a table header for anything else), ``mqtt`` inside [mqtt]. Returns the file and
    the HTTP port."""
    port = http_port or free_port()
    config = tmp / f"{gateway_id}.toml"
    config.write_text(
        f'gateway_id = "{gateway_id}"\ndata_dir = "data-{gateway_id}"\n'
        f'[mqtt]\nbroker = "{broker_url}"\n{mqtt}[http]\nlisten = "127.0.0.1:{port}"\n'
        f'[uplink]\ncloud_url = "{cloud_url}"\ntoken = "{token}"\nbackoff_max_s = 1.0\n{extra}'
    )
    return config, port


def write_secure_config(
    tmp: Path,
    sb: SecureBroker,
    http_port: int | None = None,
    extra: str = "",
    mtls: bool = False,
    flush_ms: int = 20,
    cloud_url: str = "http://127.0.0.1:9",
    token: str = "t",
) -> tuple[Path, int]:
    """gw1's config for the secure broker: its password over TLS, or its client certificate (mTLS)."""
    port = http_port or free_port()
    config = tmp / "gw1.toml"
    broker = f"mqtts://127.0.0.1:{sb.mtls_port}" if mtls else sb.url
    cert = f'cert_file = "{sb.etc}/gw1.pem"\nkey_file = "{sb.etc}/gw1.key"\n' if mtls else ""
    config.write_text(
        f'gateway_id = "gw1"\ndata_dir = "data-gw1"\n{extra}'
        f'[mqtt]\nbroker = "{broker}"\nusername = "gw1"\npassword_file = "{sb.password_file("gw1")}"\n'
        f'ca_file = "{sb.ca}"\n{cert}'
        f"[log]\nflush_interval_ms = {flush_ms}\n"
        f'[http]\nlisten = "127.0.0.1:{port}"\n'
        f'[uplink]\ncloud_url = "{cloud_url}"\ntoken = "{token}"\nbackoff_max_s = 1.0\n'
    )
    return config, port


class Gatewayd:
    """One run of gatewayd with ``config``; started at construction, ``wait_ready`` before use.
    ``installed``: the ``gatewayd`` of an installation (tests/harness/install.py), run from the
    config's folder; default: this checkout's ``python -m gateway.daemon``, or ``module`` with
    ``args`` before ``--config``: another entry point that ends in ``gateway.daemon.main`` (one with a
    fault of its own, e.g. tests/harness/faulty_stop.py); ``under``: a command that runs that command
    line (e.g. under a seccomp filter)."""

    def __init__(
        self,
        config: Path,
        http_port: int,
        installed: Installation | None = None,
        *,
        module: str = "gateway.daemon",
        args: Sequence[str] = (),
        under: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.http_port = http_port
        self.log = LogFile(config.with_suffix(".log"))
        config_args = [*args, "--config", str(config)]
        if installed is None:
            self.proc = start_module(module, config_args, self.log.path, under=under)
        else:
            argv = [*installed.command("gatewayd"), *config_args]
            self.proc = start_program(argv, self.log.path, cwd=config.parent, env=installed.env)

    def wait_ready(self, timeout_s: float = 20.0) -> Gatewayd:
        """Until its HTTP port answers and its MQTT connection is up."""
        wait_for_port(self.http_port, timeout_s=timeout_s, proc=self.proc)
        self.wait_status(lambda s: s["mqtt"]["connected"] == 1, timeout_s, "gatewayd connected to the broker")
        return self

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as response:
            return response.read()

    def status(self) -> dict[str, Any]:
        """GET /status."""
        return json.loads(self.get("/status"))

    def wait_status(self, check: Any, timeout_s: float, what: str) -> dict[str, Any]:
        """Poll /status until ``check(status)`` holds; returns that status. Fails at once if the
        daemon has exited."""

        def status() -> dict[str, Any]:
            if self.proc.poll() is not None:
                raise ProcessExited(f"gatewayd exited with {self.proc.returncode}: {self.output()[-2000:]}")
            return self.status()

        return wait_until(status, timeout_s, what, check=check)

    def output(self) -> str:
        """What this run of the daemon has logged so far."""
        return self.log.text()

    def terminate(self, timeout_s: float = 15.0) -> tuple[int, str]:
        """SIGTERM and wait for the exit; returns (exit code, its log)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout_s)
        return self.proc.returncode, self.output()

    def timed_terminate(self, timeout_s: float = 30.0) -> tuple[int, float, str]:
        """``terminate``, also measuring the seconds from SIGTERM to the exit: (code, seconds, log)."""
        began = time.monotonic()
        code, output = self.terminate(timeout_s)
        return code, time.monotonic() - began, output

    def kill(self) -> None:
        """SIGKILL if still running (no flush, no ack), and reap it."""
        kill_process(self.proc)


async def log_records(data_dir: Path) -> list[tuple[int, bytes]]:
    """The telemetry records in a stopped gateway's log (its placement markers and sensor results
    left out), as (LSN, record)."""
    log = EpochLog(data_dir / "log")
    await log.open()
    try:
        return [entry async for entry in log.read(1) if b'"kind":"telemetry"' in entry[1]]
    finally:
        await log.close()


def telemetry(device: str, seq: int, **overrides: Any) -> bytes:
    """A device's telemetry message (edgefed/<gw>/devices/<device>/telemetry), fields overridable."""
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
