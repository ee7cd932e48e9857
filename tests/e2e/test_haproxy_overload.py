"""The load balancer's overload rules (tests/harness/haproxy.py, docs/cloud.md "Replicas"): a
replica is given at most ``maxconn`` requests at once and the rest wait in haproxy's queue; a 503
haproxy answers itself (no replica up, or a request that waited out ``timeout queue``) carries a
``Retry-After`` the gateway's uplink honours, as cloudd's own 503 ``busy`` does."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import pytest

from gateway.uplink.outcome import Outcome, post
from tests.harness.haproxy import BUSY_RETRY_AFTER_S, start_haproxy
from tests.harness.processes import free_port


class SlowReplica(BaseHTTPRequestHandler):
    """Answers a request for ``/v1/held`` after ``HOLD_S``, counting how many it holds at once, and
    the health checks (``/healthz``, ``/v1/roles/...``) at once."""

    HOLD_S = 0.3
    lock = threading.Lock()
    now = 0
    most = 0

    def _answer(self) -> None:
        if self.path == "/v1/held":
            self._hold()
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def _hold(self) -> None:
        cls = type(self)
        with cls.lock:
            cls.now += 1
            cls.most = max(cls.most, cls.now)
        time.sleep(self.HOLD_S)
        with cls.lock:
            cls.now -= 1

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.mark.timeout(60)
def test_a_replica_is_given_at_most_maxconn_requests_the_rest_queue(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowReplica)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    balancer = start_haproxy(tmp_path / "haproxy", [server.server_address[1]], maxconn=2)
    try:

        def get(_: int) -> int:
            with urllib.request.urlopen(f"{balancer.url}/v1/held", timeout=30) as response:
                return response.status

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(get, range(8)))
    finally:
        balancer.stop()
        server.shutdown()
    assert statuses == [200] * 8  # 8 x 0.3 s through 2 slots: within the queue's timeout, none refused
    assert SlowReplica.most == 2


@pytest.mark.timeout(60)
def test_haproxys_own_503_carries_a_retry_after_the_uplink_reads(tmp_path: Path) -> None:
    balancer = start_haproxy(tmp_path / "haproxy", [free_port()])  # nothing listens there: no replica
    try:

        async def upload() -> Outcome:
            async with aiohttp.ClientSession() as session:
                return await post(session, f"{balancer.url}/v1/gateways/gw1/batches", b"{}", {}, 10.0)

        outcome = asyncio.run(upload())
    finally:
        balancer.stop()
    assert outcome.kind == "server_error" and outcome.retry_after_s == BUSY_RETRY_AFTER_S
