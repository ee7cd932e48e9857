"""The daemon's HTTP face: ``GET /status`` (JSON) and ``GET /metrics`` (Prometheus text).

Invariant: both are read-only views computed at request time from the subsystems' own
``stats()`` (no second set of numbers), and /metrics uses the daemon's own CollectorRegistry,
never prometheus_client's global one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from protocol.config import parse_listen


class StatusServer:
    def __init__(
        self, listen: str, status: Callable[[], dict[str, Any]], registry: CollectorRegistry
    ) -> None:
        self._host, self._port = parse_listen(listen)
        self._status = status
        self._registry = registry
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/status", self._get_status)
        app.router.add_get("/metrics", self._get_metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _get_status(self, request: web.Request) -> web.Response:
        return web.Response(
            text=json.dumps(self._status(), indent=1, sort_keys=True), content_type="application/json"
        )

    async def _get_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
