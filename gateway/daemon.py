"""gatewayd, the process: read the config, set up logging, run a ``GatewayRunner`` (gateway/runner.py)
until SIGTERM/SIGINT or a fatal log error, reload on SIGHUP, tell systemd, and exit with a code.

Exit codes: 0 clean stop, 1 runtime failure or a stop that missed its deadline, 2 invalid
configuration or data dir in use.

Invariant: from SIGTERM/SIGINT the process is gone within STOP_DEADLINE_S (gateway/runner.py), and
its exit code says whether everything stopped in time: a subsystem that missed its share of the
deadline, a task still running after the stop, or a thread that holds the exit (the exit guard,
runtime/shutdown.py) is named in the log and makes it exit 1 (docs/gateway.md, "Stopping").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.control.recent_log import RecentLog
from gateway.control.sdnotify import SystemdNotifier
from gateway.datadir import StartupError
from gateway.runner import STOP_DEADLINE_S, GatewayRunner
from protocol.config import GatewayConfig, load_gateway_config
from protocol.errors import ProtocolError
from runtime.shutdown import arm_exit_guard, cancel_leftovers
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2
LEFTOVER_GRACE_S = 0.5  # for the tasks the subsystems left behind, after their stop steps
EXIT_MARGIN_S = 0.5  # the exit guard fires this long before STOP_DEADLINE_S


async def run_daemon(
    config: GatewayConfig,
    config_path: Path | None = None,
    recent: RecentLog | None = None,
    stop_begins: Callable[[], object] = lambda: None,
) -> int:
    """Run the gateway until SIGTERM/SIGINT or a fatal log error, then stop it; the exit code.

    The signal handlers come first, so a SIGTERM while the subsystems start is a clean stop once
    they have (never the default action, which kills the process unflushed). ``stop_begins`` is
    called when the stop begins (``main`` arms the exit guard there).
    """
    notifier = SystemdNotifier()
    runner = GatewayRunner(config, config_path, recent)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reload_wanted = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_wanted.set)
    try:
        try:
            await runner.start()
        except StartupError:
            await runner.stop()
            raise
        fatal = runner.fatal
        assert fatal is not None, "start() made it"
        notifier.ready(f"gateway {config.gateway_id} running")
        notifier.start_watchdog(healthy=lambda: not fatal.done())
        await _serve(runner, fatal, notifier, stop, reload_wanted)
        stop_begins()
        return await _stop(runner, notifier, failed=fatal.done())
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)


async def _serve(
    runner: GatewayRunner,
    fatal: asyncio.Future[BaseException],
    notifier: SystemdNotifier,
    stop: asyncio.Event,
    reload_wanted: asyncio.Event,
) -> None:
    """Until ``stop`` is set or the log fails; a reload on each SIGHUP meanwhile."""
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
                notifier.ready(f"gateway {runner.config.gateway_id} running (reloaded)")
                reload_wait = asyncio.create_task(reload_wanted.wait())
    finally:
        for task in (stop_wait, reload_wait):
            await cancel_and_wait(task)


async def _stop(runner: GatewayRunner, notifier: SystemdNotifier, failed: bool) -> int:
    """Stop the subsystems, then end what they left behind; the exit code."""
    why = "fatal log error" if failed else "signal"
    log.info("stopping (%s)", why)
    notifier.stopping(f"stopping on {why}")
    await notifier.stop_watchdog()
    clean = await runner.stop()
    stuck = await cancel_leftovers(LEFTOVER_GRACE_S)
    if stuck:
        log.error("stop: tasks still running after the stop, abandoned: %s", ", ".join(stuck))
    if failed or not clean or stuck:
        return EXIT_FAILURE
    log.info("stopped cleanly")
    return EXIT_OK


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
    # From the moment the stop begins, the process is gone by STOP_DEADLINE_S whatever hangs
    # (a thread blocked in a system call would otherwise hold the interpreter's exit for ever).
    guard_after_s = STOP_DEADLINE_S - EXIT_MARGIN_S
    try:
        return asyncio.run(
            run_daemon(config, args.config, recent, stop_begins=lambda: arm_exit_guard(guard_after_s))
        )
    except StartupError as exc:
        print(f"gatewayd: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
