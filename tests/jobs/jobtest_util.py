"""Helpers for the jobs/fleet/dashboard tests: a cloudd with job options, HTTP calls with a token,
telemetry batches uploaded the way a gateway uploads them, heartbeats, cloudctl."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from conftest import CLOUDD_OPERATOR_TOKEN, Cloudd, cloudd_token, free_port, wait_for_port

from protocol.batch import encode_batch, idempotency_key
from protocol.records import telemetry_record

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class JobsCloudd(Cloudd):
    """A cloudd started with extra flags (job limits)."""

    extra_args: list[str] = field(default_factory=list)

    def start(self) -> None:
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
            "--operator-token",
            str(self.operator_token),
            *self.extra_args,
        ]
        for gateway in self.gateways:
            cmd += ["--token", f"{gateway}={cloudd_token(gateway)}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, timeout=20.0, proc=self.proc)


def start_jobs_cloudd(
    base: Path, gateways: tuple[str, ...] = ("gw1", "gw2", "gw3"), extra_args: tuple[str, ...] = ()
) -> JobsCloudd:
    base.mkdir(parents=True, exist_ok=True)
    server = JobsCloudd(
        data_dir=base / "cloud-data",
        port=free_port(),
        gateways=tuple(gateways),
        operator_token=CLOUDD_OPERATOR_TOKEN,
        log_path=base / "cloudd.log",
        extra_args=list(extra_args),
    )
    server.start()
    return server


def call(
    url: str,
    token: str | None = None,
    method: str = "GET",
    body: bytes | dict | None = None,
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> tuple[int, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", content_type)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def heartbeat(
    gateway: str,
    *,
    interval_s: float = 5.0,
    backlog: int = 0,
    rtt_ms: float | None = 40.0,
    cloud_tasks: tuple[str, ...] = (),
    sent_ts: float = 1.0,
) -> dict:
    return {
        "v": 1,
        "gateway": gateway,
        "sent_ts": sent_ts,
        "interval_s": interval_s,
        "backlog_records": backlog,
        "backlog_bytes": backlog * 120,
        "link": None
        if rtt_ms is None
        else {"up": True, "rtt_ms": rtt_ms, "bandwidth_bps": 2e6, "availability": 0.98},
        "placement": [
            {
                "service": "soil",
                "task": t,
                "where": "cloud" if t in cloud_tasks else "gateway",
                "reason": "latency target",
            }
            for t in ("filter", "aggregate", "detect")
        ],
    }


def telemetry_batch(gateway: str, log_id: str, device: str, first_lsn: int, count: int) -> tuple[bytes, str]:
    """A batch of plausible soil-sensor readings (a slow daily wave plus a little ripple)."""
    entries = []
    for lsn in range(first_lsn, first_lsn + count):
        t = lsn / 10.0
        readings = {
            "temperature_c": 20 + 3 * math.sin(t / 3) + 0.2 * math.sin(7 * t),
            "humidity_pct": 55 + 6 * math.cos(t / 3),
            "soil_moisture_pct": 35 + 2 * math.sin(t / 5),
        }
        body = json.dumps(
            {"v": 1, "device": device, "seq": lsn, "ts": 1000.0 + lsn, "readings": readings, "status": "ok"}
        ).encode()
        entries.append((lsn, telemetry_record(device, 1000.0 + lsn, body)))
    return encode_batch(gateway, log_id, entries), idempotency_key(
        gateway, log_id, first_lsn, first_lsn + count - 1
    )


def upload_telemetry(
    cloudd: Cloudd, gateway: str, log_id: str, device: str, first_lsn: int, count: int
) -> tuple[int, dict]:
    body, key = telemetry_batch(gateway, log_id, device, first_lsn, count)
    request = urllib.request.Request(
        f"{cloudd.url}/v1/gateways/{gateway}/batches",
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            "Authorization": f"Bearer {cloudd.token_for(gateway)}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def cloudctl(cloudd: Cloudd, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cloud.ctl",
            "--url",
            cloudd.url,
            "--token",
            cloudd.operator_token or "",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )
