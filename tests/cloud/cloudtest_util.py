"""Helpers for the cloud tests: build real upload batches and send them the way a gateway does."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterable

from protocol.batch import encode_batch, idempotency_key
from protocol.records import telemetry_record


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


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = 30.0) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


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


def raw_http(port: int, data: bytes, half_close: bool = False, timeout: float = 5.0) -> bytes:
    """Send raw bytes, return whatever comes back until the server closes (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def http_json_body(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)
