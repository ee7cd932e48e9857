"""cloudd, the real cloud daemon, as a subprocess: the one way tests start it (``Cloudd.start``),
plus ``cloudctl``.

A ``Cloudd`` keeps its data directory, port and log file across ``kill``/``stop`` and ``start``, so a
test can crash it and bring the same server back. Gateway ``gwN`` uploads with ``cloudd_token("gwN")``;
the operator API wants ``OPERATOR_TOKEN`` unless the server was made with ``operator_token=None``.
Job limits, ``--broker`` and other flags go in ``extra_args``; ``database`` (a PostgreSQL URL) is
``--database``. Replicas behind a load balancer: tests/harness/replicas.py.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cloud.store import DatasetStore
from tests.harness.processes import (
    free_port,
    kill_process,
    run_module,
    start_module,
    stop_process,
    wait_for_port,
)

GATEWAYS = ("gw1", "gw2", "gw3")
OPERATOR_TOKEN = "operator-secret"


def cloudd_token(gateway: str) -> str:
    """The upload token a ``Cloudd`` configures for ``gateway``."""
    return f"token-{gateway}"


@dataclass
class Cloudd:
    data_dir: Path
    port: int
    gateways: tuple[str, ...]
    operator_token: str | None
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    database: str | None = None
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token_for(self, gateway: str) -> str:
        if gateway not in self.gateways:
            raise KeyError(
                f"cloudd has no token for {gateway!r}; it knows {self.gateways} (make_cloudd(gateways=...))"
            )
        return cloudd_token(gateway)

    def args(self) -> list[str]:
        args = ["--data-dir", str(self.data_dir), "--port", str(self.port), "--log-level", "INFO"]
        for gateway in self.gateways:
            args += ["--token", f"{gateway}={cloudd_token(gateway)}"]
        if self.operator_token is not None:
            args += ["--operator-token", self.operator_token]
        if self.database is not None:
            args += ["--database", self.database]
        return args + list(self.extra_args)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the process and wait until it listens."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("cloudd is already running")
        self.proc = start_module("cloud.server", self.args(), self.log_path)
        wait_for_port(self.port, timeout_s=timeout_s, proc=self.proc)

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind (the crash tests' fault)."""
        if self.proc is not None:
            kill_process(self.proc)

    def stop(self) -> int | None:
        """SIGTERM and wait (graceful shutdown); returns the exit code (None if never started)."""
        return None if self.proc is None else stop_process(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def status(self) -> dict:
        """GET /v1/status with the operator token."""
        request = urllib.request.Request(f"{self.url}/v1/status")
        if self.operator_token is not None:
            request.add_header("Authorization", f"Bearer {self.operator_token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def records(self, gateway: str | None = None) -> list:
        """What cloudd has committed, read from its data dir (read-only; safe while it runs)."""
        return list(DatasetStore.open(self.data_dir, readonly=True).iter_records(gateway))

    def telemetry(self, gateway: str) -> list:
        """The telemetry records of ``gateway`` cloudd has committed (not the events beside them: the
        gateway's sensor results and markers, cloudd's own task results)."""
        return [r for r in self.records(gateway) if r.record["kind"] == "telemetry"]

    def count_records(self, gateway: str, log_id: str) -> int:
        """How many records of one gateway log cloudd has committed (the logs its task runner
        writes, ``protocol.derived.derived_log_id``, are others)."""
        return sum(1 for r in self.records(gateway) if r.log_id == log_id)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ctl(self, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
        """``cloudctl --url <this server> --token <operator token> *args``."""
        return cloudctl("--url", self.url, "--token", self.operator_token or "", *args, timeout_s=timeout_s)


def make_cloudd(
    base: Path,
    *,
    gateways: Sequence[str] = GATEWAYS,
    operator_token: str | None = OPERATOR_TOKEN,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    database: str | None = None,
    data_dir: Path | None = None,
) -> Cloudd:
    """A cloudd with its log (and, unless ``data_dir`` says otherwise, its data) under ``base``,
    not started yet."""
    base.mkdir(parents=True, exist_ok=True)
    return Cloudd(
        data_dir=data_dir or base / "cloud-data",
        database=database,
        port=port or free_port(),
        gateways=tuple(gateways),
        operator_token=operator_token,
        log_path=base / "cloudd.log",
        extra_args=list(extra_args),
    )


def start_cloudd(base: Path, **options) -> Cloudd:
    """``make_cloudd(base, **options)``, started; the caller stops it (``.stop()``)."""
    server = make_cloudd(base, **options)
    server.start()
    return server


def cloudctl(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """``cloudctl *args`` as a process, output captured as text."""
    return run_module("cloud.ctl", list(args), timeout_s=timeout_s)
