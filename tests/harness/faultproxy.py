"""A real TCP fault proxy on 127.0.0.1 for tests: delay, bandwidth cap, blackhole, reset, flap, traces.

    client -> 127.0.0.1:<listen> -> FaultProxy -> 127.0.0.1:<upstream>

Modes (``set_mode(kind, **params)``), applied to new *and* open connections:
- ``pass``: forward; with ``delay_s`` (each chunk is delivered that long after it arrived, order
  kept) and ``bandwidth_Bps`` (a token bucket per direction, shared by all connections).
  ``delay``, ``bandwidth`` and ``slow`` are names for ``pass`` with those parameters.
- ``blackhole``: accept and keep connections, read and discard everything, forward nothing.
- ``reset``: abort every open connection with an RST (SO_LINGER 0) and reset new ones at once.
- ``flap``: alternate ``period_s`` up (pass, with its delay/bandwidth) and ``period_s`` down
  (``down`` = blackhole or reset).
A trace is a list of phases ``(duration_s, kind, params)`` played in order by ``play``;
``time_scale`` multiplies every duration (0.01 plays a minute in 0.6 s).

Invariant: the proxy owns every task it starts (one listener, two pumps per connection, at most
one schedule task) and ``stop`` cancels and awaits them all; each pump queue is bounded, so a slow
side pushes back on the fast one instead of buffering without limit.

CLI, from the repository root:
``python -m tests.harness.faultproxy --listen 9000 --upstream 8700 --mode slow --delay 0.2 --bandwidth 50000``
or ``--trace trace.json`` (a JSON list of [duration_s, kind, {params}]).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

CHUNK = 16 * 1024
QUEUE_CHUNKS = 64
_ALIASES = {"delay": "pass", "bandwidth": "pass", "slow": "pass", "up": "pass"}
KINDS = ("pass", "blackhole", "reset", "flap")


@dataclass(frozen=True)
class Mode:
    kind: str = "pass"
    delay_s: float = 0.0
    bandwidth_Bps: float | None = None
    period_s: float = 1.0
    down: str = "blackhole"

    @staticmethod
    def make(kind: str, **params: Any) -> Mode:
        kind = _ALIASES.get(kind, kind)
        if kind not in KINDS:
            raise ValueError(f"unknown fault mode {kind!r}; one of {KINDS + tuple(_ALIASES)}")
        mode = Mode(kind, **params)
        if mode.down not in ("blackhole", "reset"):
            raise ValueError("flap down must be blackhole or reset")
        return mode


class _Bucket:
    """Token bucket in bytes (burst: 50 ms worth); a sender goes into debt and sleeps it off."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self.tokens = 0.0
        self.at = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate is None:
            return
        now = time.monotonic()
        self.tokens = min(self.rate * 0.05, self.tokens + (now - self.at) * self.rate) - n
        self.at = now
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)


def _abort_with_rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream_port: int, listen_port: int = 0, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listen_port = listen_port
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._buckets = {"up": _Bucket(), "down": _Bucket()}
        self._effective = Mode()
        self._schedule: asyncio.Task[None] | None = None
        self._closers: set[asyncio.Task] = set()  # owned here, awaited by stop()
        self.port = 0
        self.stats = {"connections": 0, "resets": 0, "bytes_forwarded": 0, "bytes_discarded": 0}

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        await self._cancel_schedule()
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            await self._close(conn, rst=False)
        if self._closers:
            await asyncio.wait(list(self._closers), timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    # -- control ---------------------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        return self._effective

    async def set_mode(self, kind: str, **params: Any) -> None:
        """Switch now (cancelling any trace being played); ``flap`` starts its own schedule."""
        await self._cancel_schedule()
        mode = Mode.make(kind, **params)
        if mode.kind == "flap":
            self._schedule = asyncio.create_task(
                self._run_phases([(float("inf"), mode)]), name="faultproxy-flap"
            )
        else:
            self._apply(mode)

    async def play(self, phases: list[tuple[float, str, dict[str, Any]]], time_scale: float = 1.0) -> None:
        """Start playing a trace in the background; ``wait_trace`` awaits its end."""
        await self._cancel_schedule()
        parsed = [(d * time_scale, Mode.make(k, **p)) for d, k, p in phases]
        if time_scale != 1.0:
            parsed = [
                (d, m if m.kind != "flap" else Mode(**{**m.__dict__, "period_s": m.period_s * time_scale}))
                for d, m in parsed
            ]
        self._schedule = asyncio.create_task(self._run_phases(parsed), name="faultproxy-trace")

    async def wait_trace(self, timeout: float) -> None:
        if self._schedule is not None:
            await asyncio.wait_for(asyncio.shield(self._schedule), timeout)

    async def _cancel_schedule(self) -> None:
        if self._schedule is not None:
            self._schedule.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._schedule
            self._schedule = None

    async def _run_phases(self, phases: list[tuple[float, Mode]]) -> None:
        for duration, mode in phases:
            end = time.monotonic() + duration
            if mode.kind != "flap":
                self._apply(mode)
                await asyncio.sleep(max(0.0, end - time.monotonic()))
                continue
            up = Mode("pass", mode.delay_s, mode.bandwidth_Bps)
            down = Mode(mode.down)
            is_up = True
            while time.monotonic() < end:
                self._apply(up if is_up else down)
                await asyncio.sleep(max(0.0, min(mode.period_s, end - time.monotonic())))
                is_up = not is_up

    def _apply(self, mode: Mode) -> None:
        self._effective = mode
        for bucket in self._buckets.values():
            bucket.rate = mode.bandwidth_Bps
        if mode.kind == "reset":
            for conn in list(self._conns):
                self.stats["resets"] += 1
                self._spawn_close(conn, rst=True)

    # -- data path -------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats["connections"] += 1
        if self._effective.kind == "reset":
            self.stats["resets"] += 1
            _abort_with_rst(writer)
            return
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5.0)
        except (OSError, TimeoutError):
            self._conns.discard(conn)
            _abort_with_rst(writer)
            return
        conn.upstream = up_writer
        conn.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, "up", conn)),
            asyncio.create_task(self._pump(up_reader, writer, "down", conn)),
        ]
        # The handler returns; the pumps are owned by ``conn`` and cancelled by ``_close``.

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str, conn: _Conn
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUE_CHUNKS)
        sender = asyncio.create_task(self._send(queue, writer, direction))
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if self._effective.kind != "pass":
                    self.stats["bytes_discarded"] += len(data)
                    continue
                await queue.put((time.monotonic() + self._effective.delay_s, data))
            await queue.put(None)
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await sender
            if conn in self._conns:
                self._spawn_close(conn, rst=False)

    async def _send(self, queue: asyncio.Queue, writer: asyncio.StreamWriter, direction: str) -> None:
        bucket = self._buckets[direction]
        while (item := await queue.get()) is not None:
            due, data = item
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if self._effective.kind != "pass":  # went dark while the chunk was in flight
                self.stats["bytes_discarded"] += len(data)
                continue
            for i in range(0, len(data), 4096):
                piece = data[i : i + 4096]
                await bucket.take(len(piece))
                writer.write(piece)
                await writer.drain()
                self.stats["bytes_forwarded"] += len(piece)
        if writer.can_write_eof():
            writer.write_eof()

    def _spawn_close(self, conn: _Conn, rst: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._close(conn, rst))
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def _close(self, conn: _Conn, rst: bool) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        current = asyncio.current_task()
        for task in conn.tasks:
            if task is not current:
                task.cancel()
        for w in (conn.client, conn.upstream):
            if w is None:
                continue
            if rst:
                _abort_with_rst(w)
            else:
                w.close()
        for task in conn.tasks:
            if task is not current:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await task


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--upstream", type=int, required=True)
    ap.add_argument("--mode", default="pass", help=f"one of {KINDS + tuple(_ALIASES)}")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s")
    ap.add_argument("--period", type=float, default=1.0, help="flap half-period, s")
    ap.add_argument("--down", default="blackhole", help="flap down mode: blackhole or reset")
    ap.add_argument("--trace", default=None, help="JSON file: [[duration_s, kind, {params}], ...]")
    ap.add_argument("--time-scale", type=float, default=1.0)
    args = ap.parse_args()

    async def run() -> None:
        proxy = FaultProxy(args.upstream, args.listen)
        await proxy.start()
        print(f"faultproxy 127.0.0.1:{proxy.port} -> 127.0.0.1:{args.upstream}", flush=True)
        try:
            if args.trace:
                with open(args.trace) as f:
                    phases = [(float(d), k, p) for d, k, p in json.load(f)]
                await proxy.play(phases, args.time_scale)
                await proxy.wait_trace(timeout=sum(p[0] for p in phases) * args.time_scale + 60)
            else:
                await proxy.set_mode(
                    args.mode,
                    delay_s=args.delay,
                    bandwidth_Bps=args.bandwidth,
                    period_s=args.period,
                    down=args.down,
                )
                await asyncio.Event().wait()
        finally:
            await proxy.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    _main()
