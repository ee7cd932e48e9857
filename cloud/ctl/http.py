"""cloudctl's HTTP: JSON calls, file uploads and the job event stream, each failure a ``CtlError``.

Invariant: every function either returns cloudd's 2xx answer or raises ``CtlError`` whose message
says which URL failed and why (unreachable, HTTP status with cloudd's error token and detail, not
JSON, or an event stream that kept dropping).
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from runtime.backoff import Backoff

STREAM_TRIES = 5  # event-stream connections in a row without an event before giving up


class CtlError(Exception):
    """A request cloudctl could not complete; the message says why."""


def _request(
    url: str,
    token: str | None,
    method: str = "GET",
    body: bytes | IO[bytes] | None = None,
    content_type: str = "application/json",
) -> urllib.request.Request:
    request = urllib.request.Request(url, data=body, method=method, headers={"Accept": "application/json"})
    if body is not None:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


def _http_error(url: str, exc: urllib.error.HTTPError) -> CtlError:
    try:
        body = json.loads(exc.read())
        why = f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        why = exc.reason
    return CtlError(f"{url}: HTTP {exc.code} ({why})")


def _send(request: urllib.request.Request, url: str, timeout: float) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise _http_error(url, exc) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CtlError(f"cannot reach cloudd at {url}: {reason}") from None
    except ValueError:
        raise CtlError(f"{url}: answer is not JSON") from None


def call_json(
    url: str,
    token: str | None,
    timeout: float = 10.0,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str = "application/json",
) -> dict[str, Any]:
    return _send(_request(url, token, method, body, content_type), url, timeout)


def get_json(url: str, token: str | None, timeout: float = 10.0) -> dict[str, Any]:
    return call_json(url, token, timeout)


def put_file(url: str, token: str | None, path: Path, timeout: float = 300.0) -> dict[str, Any]:
    """PUT a file's bytes, streamed, with Content-Length and X-Sha256 (cloudd checks both)."""
    try:
        size, digest = path.stat().st_size, hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        with open(path, "rb") as handle:
            request = _request(url, token, "PUT", handle, "application/octet-stream")
            request.add_header("Content-Length", str(size))
            request.add_header("X-Sha256", digest.hexdigest())
            return _send(request, url, timeout)
    except FileNotFoundError:
        raise CtlError(f"{path}: no such file") from None


def iter_events(url: str, token: str | None, timeout: float = 60.0) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, data) per server-sent event, until the stream says ``end``. A stream that drops or
    closes early is resumed from the last id, backing off; ``STREAM_TRIES`` tries in a row without
    an event give up with CtlError."""
    next_id, retry = 0, Backoff(0.5, 4.0)
    while True:
        try:
            request = _request(f"{url}?since={next_id}", token)
            with urllib.request.urlopen(request, timeout=timeout) as response:
                kind, data = "message", ""
                for raw in response:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        data += line[6:]
                    elif line.startswith("id: "):
                        next_id = int(line[4:]) + 1
                    elif line == "" and data:
                        if kind == "end":
                            return
                        retry.succeeded()
                        yield kind, json.loads(data)
                        kind, data = "message", ""
        except urllib.error.HTTPError as exc:
            raise _http_error(url, exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = str(getattr(exc, "reason", exc))
        else:
            reason = "the stream closed before its end"
        if retry.failures + 1 >= STREAM_TRIES:
            raise CtlError(f"event stream {url}: {reason}")
        time.sleep(retry.failed())
