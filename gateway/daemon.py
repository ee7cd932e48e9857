"""gatewayd, the process: read the config, set up logging, run a ``GatewayRunner`` (gateway/runner.py)
until SIGTERM/SIGINT or a fatal log error, reload on SIGHUP, tell systemd, and exit with a code.

Exit codes: 0 clean stop, 1 runtime failure (or a stop that did not finish within the deadline), 2
invalid configuration or data dir in use.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from gateway.control.recent_log import RecentLog
from gateway.control.sdnotify import SystemdNotifier
from gateway.datadir import StartupError
from gateway.runner import GatewayRunner
from protocol.config import GatewayConfig, load_gateway_config
from protocol.errors import ProtocolError
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2


async def run_daemon(
    config: GatewayConfig, config_path: Path | None = None, recent: RecentLog | None = None
) -> int:
    notifier = SystemdNotifier()
    runner = GatewayRunner(config, config_path, recent)
    try:
        await runner.start()
    except StartupError:
        await runner.stop()
        raise
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reload_wanted = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_wanted.set)
    fatal = runner.fatal
    assert fatal is not None, "start() made it"
    notifier.ready(f"gateway {config.gateway_id} running")
    notifier.start_watchdog(healthy=lambda: not fatal.done())
    stop_wait = asyncio.create_task(stop.wait())
    reload_wait = asyncio.create_task(reload_wanted.wait())
    try:
        while not stop.is_set() and not fatal.done():
            waits: list[asyncio.Future[Any]] = [stop_wait, reload_wait, fatal]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if reload_wanted.is_set() and not stop.is_set():
                reload_wanted.clear()
                notifier.reloading()
                await runner.reload()
                notifier.ready(f"gateway {config.gateway_id} running (reloaded)")
                reload_wait = asyncio.create_task(reload_wanted.wait())
    finally:
        for task in (stop_wait, reload_wait):
            await cancel_and_wait(task)
    failed = fatal.done()
    log.info("stopping (%s)", "fatal log error" if failed else "signal")
    notifier.stopping("fatal log error" if failed else "stopping on signal")
    await notifier.stop_watchdog()
    clean = await runner.stop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.remove_signal_handler(signum)
    return EXIT_FAILURE if failed or not clean else EXIT_OK


def setup_logging(gateway_id: str, level: str) -> RecentLog:
    """stderr lines that name the gateway, and the rings of recent lines (``gatewayctl logs``)."""
    logging.basicConfig(
        stream=sys.stderr,
        level=level,
        format=f"%(asctime)s %(levelname)s gw={gateway_id} %(name)s: %(message)s",
    )
    recent = RecentLog()
    logging.getLogger().addHandler(recent)
    return recent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gatewayd", description="edgefed edge gateway daemon")
    parser.add_argument("--config", required=True, type=Path, help="gateway TOML file")
    args = parser.parse_args(argv)
    try:
        config = load_gateway_config(args.config)
    except ProtocolError as exc:
        print(f"gatewayd: invalid config {args.config}: {exc.detail}", file=sys.stderr)
        return EXIT_CONFIG
    recent = setup_logging(config.gateway_id, config.log_level)
    try:
        return asyncio.run(run_daemon(config, args.config, recent))
    except StartupError as exc:
        print(f"gatewayd: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
