"""``gatewayctl check`` whole: the checks in order, the network ones side by side, and their lines.

Invariant: every check of a valid config is reported, in the same order each time (a SKIP for one
whose prerequisite failed); an invalid config is the one line, since every other check reads it.
The whole run takes at most about twice ``timeout_s`` (the broker's and the cloud's checks run
together, each of their steps bounded by it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from gateway.extras import module_installed
from gateway.preflight.broker import check_broker
from gateway.preflight.cloud import check_cloud
from gateway.preflight.local import (
    check_config,
    check_data_dir,
    check_disk,
    check_extras,
    check_http,
    check_lock,
)
from gateway.preflight.outcome import Check


async def preflight(
    config_path: Path,
    timeout_s: float,
    installed: Callable[[str], bool] = module_installed,
    clock: Callable[[], float] = time.time,
) -> list[Check]:
    config_check, config = check_config(config_path)
    if config is None:
        return [config_check]
    lock, running = check_lock(config)
    local = [
        config_check,
        check_extras(config, installed),
        check_data_dir(config),
        lock,
        check_disk(config),
        check_http(config, running),
    ]
    async with asyncio.TaskGroup() as group:  # owns both; neither outlives this block
        broker = group.create_task(check_broker(config, timeout_s))
        cloud = group.create_task(check_cloud(config, timeout_s, clock))
    return local + broker.result() + cloud.result()


def render_checks(checks: list[Check]) -> str:
    width = max(len(check.name) for check in checks)
    return "\n".join(f"{check.status:<4}  {check.name:<{width}}  {check.detail}" for check in checks)
