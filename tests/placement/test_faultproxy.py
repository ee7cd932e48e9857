"""The fault proxy against a real aiohttp server: each fault happens for real on loopback TCP."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from tests.harness.faultproxy import FaultProxy, Mode
from tests.harness.poll import eventually


@pytest.fixture
async def server():
    async def ok(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(
            body=b"x" * int(request.query.get("n", "2")) if not body else str(len(body)).encode()
        )

    app = web.Application()
    app.router.add_route("*", "/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield port
    await runner.cleanup()


@pytest.fixture
async def proxy(server):
    p = FaultProxy(server)
    await p.start()
    yield p
    await p.stop()


async def _get(port: int, timeout: float = 2.0, n: int = 2) -> tuple[bool, float, int]:
    start = time.monotonic()
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s,
            s.get(f"http://127.0.0.1:{port}/?n={n}") as r,
        ):
            body = await r.read()
            return True, time.monotonic() - start, len(body)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False, time.monotonic() - start, 0


async def test_pass_forwards(proxy):
    ok, _, size = await _get(proxy.port, n=100_000)
    assert ok and size == 100_000
    assert proxy.stats["bytes_forwarded"] >= 100_000


async def test_delay_adds_at_least_the_delay_each_way(proxy):
    await proxy.set_mode("delay", delay_s=0.15)
    ok, elapsed, _ = await _get(proxy.port)
    assert ok and elapsed >= 0.3  # request and response each held 0.15 s (a lower bound, not a speed)


async def test_bandwidth_cap_bounds_throughput(proxy):
    await proxy.set_mode("bandwidth", bandwidth_Bps=200_000)
    ok, elapsed, size = await _get(proxy.port, n=100_000, timeout=5.0)
    assert ok and size == 100_000
    assert elapsed >= (100_000 - 200_000 * 0.05) / 200_000  # at most one 50 ms burst ahead of the rate


async def test_blackhole_keeps_connection_forwards_nothing(proxy, server):
    await proxy.set_mode("blackhole")
    ok, _, _ = await _get(proxy.port, timeout=0.5)
    assert not ok
    assert proxy.stats["connections"] >= 1 and proxy.stats["bytes_forwarded"] == 0
    await proxy.set_mode("pass")
    assert (await _get(proxy.port))[0]


async def test_reset_closes_open_and_new_connections(proxy):
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    await proxy.set_mode("reset")
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(1), 2.0)
    writer.close()
    ok, _, _ = await _get(proxy.port)
    assert not ok and proxy.stats["resets"] >= 2


async def test_flap_alternates(proxy):
    await proxy.set_mode("flap", period_s=0.2, down="reset")
    seen = set()

    def both_seen() -> bool:
        seen.add(proxy.mode.kind)
        return len(seen) == 2

    await eventually(both_seen, 5, "both flap phases", interval_s=0.05)
    assert seen == {"pass", "reset"}


async def test_trace_plays_phases_in_order(proxy):
    kinds = []
    await proxy.play(
        [(1.0, "slow", {"delay_s": 0.01}), (1.0, "blackhole", {}), (1.0, "up", {})], time_scale=0.2
    )

    def back_to_pass() -> bool:  # records each change of mode it sees
        if not kinds or kinds[-1] != proxy.mode.kind:
            kinds.append(proxy.mode.kind)
        return kinds[-1:] == ["pass"] and "blackhole" in kinds

    await eventually(back_to_pass, 5, "the trace through blackhole and back to pass", interval_s=0.01)
    await proxy.wait_trace(timeout=5.0)
    assert kinds == ["pass", "blackhole", "pass"]


def test_mode_rejects_unknown():
    with pytest.raises(ValueError):
        Mode.make("teleport")
