"""HTTP to cloudd the way its clients speak it: upload batches as a gateway does, heartbeats, operator
calls with a token, and raw bytes for the malformed-request tests."""

from __future__ import annotations

import json
import math
import socket
import urllib.error
import urllib.request
from collections.abc import Iterable

from protocol.batch import encode_batch, idempotency_key
from protocol.records import telemetry_record
from tests.harness.cloudd import Cloudd


def call(
    url: str,
    token: str | None = None,
    method: str = "GET",
    body: bytes | dict | None = None,
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> tuple[int, dict]:
    """One request; returns (status, JSON body), error statuses included."""
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


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = 30.0) -> tuple[int, dict]:
    """POST ``body`` as JSON with ``headers``; returns (status, JSON body)."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# --- batches as a gateway's uplink sends them -------------------------------------------------------


def record_bytes(gateway: str, lsn: int, device: str = "dev1") -> bytes:
    body = json.dumps(
        {
            "v": 1,
            "device": device,
            "seq": lsn,
            "ts": 1000.0 + lsn,
            "values": {"temp": 20.0 + lsn % 7},
            "src": gateway,
        }
    ).encode()
    return telemetry_record(device, 1000.0 + lsn, body)


def batch_body(gateway: str, log_id: str, lsns: Iterable[int], device: str = "dev1") -> bytes:
    return encode_batch(gateway, log_id, [(lsn, record_bytes(gateway, lsn, device)) for lsn in lsns])


def upload(
    base_url: str,
    token: str | None,
    gateway: str,
    log_id: str,
    lsns: list[int],
    device: str = "dev1",
    key: str | None = None,
    path_gateway: str | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict]:
    """POST one batch with the headers a gateway sends (``key``/``token`` override for fault tests)."""
    if key is None:
        key = idempotency_key(gateway, log_id, lsns[0], lsns[-1])
    headers = {"Idempotency-Key": key}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{base_url}/v1/gateways/{path_gateway or gateway}/batches"
    return post(url, batch_body(gateway, log_id, lsns, device), headers, timeout=timeout)


def telemetry_batch(gateway: str, log_id: str, device: str, first_lsn: int, count: int) -> tuple[bytes, str]:
    """A batch of plausible soil-sensor readings (a slow daily wave plus a little ripple) and its key."""
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
    key = idempotency_key(gateway, log_id, first_lsn, first_lsn + count - 1)
    return encode_batch(gateway, log_id, entries), key


def upload_telemetry(
    cloudd: Cloudd, gateway: str, log_id: str, device: str, first_lsn: int, count: int
) -> tuple[int, dict]:
    """Upload ``telemetry_batch(...)`` to ``cloudd`` with ``gateway``'s token."""
    body, key = telemetry_batch(gateway, log_id, device, first_lsn, count)
    headers = {"Idempotency-Key": key, "Authorization": f"Bearer {cloudd.token_for(gateway)}"}
    return post(f"{cloudd.url}/v1/gateways/{gateway}/batches", body, headers)


def heartbeat(
    gateway: str,
    *,
    interval_s: float = 5.0,
    backlog: int = 0,
    rtt_ms: float | None = 40.0,
    cloud_tasks: tuple[str, ...] = (),
    sent_ts: float = 1.0,
) -> dict:
    """A gateway's heartbeat body (POST /v1/gateways/<gw>/heartbeat)."""
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


# --- raw bytes, for requests no HTTP client would send ----------------------------------------------


def raw_http(port: int, data: bytes, half_close: bool = False, timeout: float = 5.0) -> bytes:
    """Send raw bytes; return the server's answer once it is whole (its headers and its Content-Length
    of body), or what came before the server closed, or before ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while not _whole_response(out) and (chunk := sock.recv(65536)):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def _whole_response(response: bytes) -> bool:
    head, end_of_head, body = response.partition(b"\r\n\r\n")
    if not end_of_head:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False  # no length given: the answer ends when the server closes


def http_json_body(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)
