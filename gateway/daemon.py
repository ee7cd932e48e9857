"""gatewayd: the edge daemon's lifecycle. One runner starts the subsystems in order, stops them in reverse.

Start: lock the data dir, open the log, status HTTP, uplink, MQTT + sensor ingest.
Stop (SIGTERM/SIGINT, or a fatal log error): stop intake, flush the log and ack what is durable,
stop the uplink, publish "offline" and disconnect, stop HTTP, close the log, unlock.

Invariant: at most one daemon uses a data dir (flock), and a stop never acknowledges a message
whose record is not durable; it finishes within STOP_DEADLINE_S (exit 0) or says what hung (exit 1).
Exit codes: 0 clean stop, 1 runtime failure, 2 invalid configuration or data dir in use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gateway.ingest.sensors import SensorIngest
from gateway.metrics import StatsCollector, make_registry
from gateway.mqtt import MqttAdapter, Will, settings_from_config
from gateway.status import StatusServer
from gateway.storage.simple import SimpleLog
from gateway.uplink.sender import Uplink
from protocol.config import GatewayConfig, load_gateway_config
from protocol.errors import ProtocolError
from protocol.topics import status_topic

log = logging.getLogger("gateway.daemon")

STOP_DEADLINE_S = 10.0
EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2


class StartupError(Exception):
    """A condition that prevents starting, with a one-line message for the operator (exit 2)."""


def presence_payload(gateway_id: str, state: str, ts: float) -> bytes:
    """The retained status message; "offline" is also the last will."""
    return json.dumps({"v": 1, "state": state, "gateway": gateway_id, "ts": round(ts, 3)}).encode()


class DataDirLock:
    """An exclusive flock on ``<data_dir>/gatewayd.lock``, held for the daemon's life."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "gatewayd.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartupError(f"data dir {self.path.parent} is in use by another gatewayd "
                               f"(lock {self.path} is held)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class GatewayRunner:
    def __init__(self, config: GatewayConfig) -> None:
        if config.log.full_policy != "reject":
            raise StartupError(f"log.full_policy: {config.log.full_policy!r} is not supported yet "
                               "(only 'reject')")
        self.config = config
        gw = config.gateway_id
        self.started_at = time.monotonic()
        self._lock = DataDirLock(config.data_dir)
        self.log = SimpleLog(config.data_dir / "log", segment_bytes=config.log.segment_bytes,
                             max_bytes=config.log.max_bytes)
        self._offline = Will(status_topic(gw), presence_payload(gw, "offline", time.time()))
        try:
            settings = settings_from_config(config.mqtt, gw, will=self._offline)
        except OSError as exc:
            raise StartupError(f"mqtt.password_file: cannot read: {exc.strerror}") from None
        online = Will(status_topic(gw), presence_payload(gw, "online", time.time()))
        self.mqtt = MqttAdapter(settings, on_connect_publish=[online])
        self.uplink = Uplink(self.log, gw, config.uplink)
        self.fatal: asyncio.Future[BaseException] | None = None
        self.ingest = SensorIngest(self.mqtt, self.log, gw, config.devices.allow,
                                   config.log.flush_interval_ms, on_durable=self.uplink.wake,
                                   on_fatal=self._on_fatal)
        collector = StatsCollector(gw)
        collector.add("mqtt", self.mqtt.stats, gauges={"connected", "inbound_queued", "reading_paused"})
        collector.add("log", self.log.stats, gauges={"durable_lsn", "trimmed_lsn", "next_lsn", "bytes",
                                                     "max_bytes", "pending_records", "segments"})
        collector.add("ingest", self.ingest.stats, gauges={"awaiting_ack"})
        collector.add_labeled_counter("ingest_rejected", "device messages rejected, by reason", "reason",
                                      lambda: self.ingest.rejected)
        collector.add("uplink", lambda: {**self.uplink.counters, "backlog": self.uplink.backlog},
                      gauges={"backlog"})
        collector.add_labeled_counter("uplink_failures", "failed uploads, by kind", "kind",
                                      lambda: self.uplink.failures)
        self.registry = make_registry(collector)
        self.http = StatusServer(config.http.listen, self.status, self.registry)
        self._started: list[str] = []

    def _offline_now(self) -> Will:
        gw = self.config.gateway_id
        return Will(status_topic(gw), presence_payload(gw, "offline", time.time()))

    def _on_fatal(self, exc: BaseException) -> None:
        if self.fatal is not None and not self.fatal.done():
            self.fatal.set_result(exc)

    async def start(self) -> None:
        self.fatal = asyncio.get_running_loop().create_future()
        self._lock.acquire()
        self._started.append("lock")
        await self.log.open()
        self._started.append("log")
        log.info("log %s opened: log_id %s, durable lsn %d, trimmed lsn %d", self.log.directory,
                 self.log.log_id, self.log.durable_lsn, self.log.trimmed_lsn)
        try:
            await self.http.start()
        except OSError as exc:
            raise StartupError(f"http.listen {self.config.http.listen}: {exc.strerror}") from None
        self._started.append("http")
        await self.uplink.start()
        self._started.append("uplink")
        await self.mqtt.start()
        self._started.append("mqtt")
        await self.ingest.start()
        self._started.append("ingest")
        log.info("gatewayd started: broker %s, cloud %s, http %s", self.config.mqtt.broker,
                 self.config.uplink.cloud_url, self.config.http.listen)

    async def stop(self, deadline_s: float = STOP_DEADLINE_S) -> bool:
        """Stop in reverse order of start; True if everything stopped cleanly within the deadline."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        steps = {
            "ingest": lambda: self.ingest.stop(timeout_s=max(0.1, (end - loop.time()) * 0.6)),
            "mqtt": lambda: self.mqtt.stop(final=self._offline_now(),
                                           timeout_s=max(0.1, (end - loop.time()) / 3)),
            "uplink": self.uplink.stop,
            "http": self.http.stop,
            "log": self.log.close,
        }
        clean = True
        # Sequential on purpose: each subsystem is either stopped or still running, never half.
        # The uplink is stopped after ingest/mqtt (reverse order) so a last upload may still finish.
        for name in reversed(self._started):
            if name == "lock":
                self._lock.release()
                continue
            try:
                await asyncio.wait_for(steps[name](), max(0.1, end - loop.time()))
            except TimeoutError:
                clean = False
                log.error("stop: %s did not stop within the %.0fs deadline", name, deadline_s)
            except Exception:
                clean = False
                log.exception("stop: %s failed", name)
        self._started.clear()
        return clean

    def status(self) -> dict[str, Any]:
        return {
            "gateway_id": self.config.gateway_id,
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "mqtt": {"broker": self.config.mqtt.broker, **self.mqtt.stats()},
            "log": {"log_id": self.log.log_id, **self.log.stats()},
            "ingest": {**self.ingest.stats(), "rejected": sum(self.ingest.rejected.values()),
                       "rejected_by_reason": dict(self.ingest.rejected)},
            "uplink": {"state": self.uplink.state, "backlog": self.uplink.backlog,
                       "last_error": self.uplink.last_error, "last_success_ts": self.uplink.last_success_ts,
                       **self.uplink.counters, "failures": dict(self.uplink.failures)},
        }


async def run_daemon(config: GatewayConfig) -> int:
    runner = GatewayRunner(config)
    try:
        await runner.start()
    except StartupError:
        await runner.stop()
        raise
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    assert runner.fatal is not None
    stop_wait = asyncio.create_task(stop.wait())
    await asyncio.wait([stop_wait, runner.fatal], return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stop_wait
    failed = runner.fatal.done()
    log.info("stopping (%s)", "fatal log error" if failed else "signal")
    clean = await runner.stop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(signum)
    return EXIT_FAILURE if failed or not clean else EXIT_OK


def setup_logging(gateway_id: str, level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level,
                        format=f"%(asctime)s %(levelname)s gw={gateway_id} %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gatewayd", description="edgefed edge gateway daemon")
    parser.add_argument("--config", required=True, type=Path, help="gateway TOML file")
    args = parser.parse_args(argv)
    try:
        config = load_gateway_config(args.config)
    except ProtocolError as exc:
        print(f"gatewayd: invalid config {args.config}: {exc.detail}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.gateway_id, config.log_level)
    try:
        return asyncio.run(run_daemon(config))
    except StartupError as exc:
        print(f"gatewayd: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
