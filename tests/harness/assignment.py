"""cloudd's model assignment as issue 22's contract states it (``GET /v1/models/{name}/assignment
?gateway=ID`` -> ``{"name", "version", "stage", "sha256", "reason"}``), served by a small real
aiohttp server for as long as the cloudd on this branch does not serve the route itself.

``assignment_route`` adds the route to an aiohttp app (the in-process OTA tests serve it beside the
registry's own routes); ``AssignmentProxy`` puts it in front of a real cloudd process and passes
every other request to cloudd unchanged (uploads, heartbeats, the registry's metadata and onnx
routes), so a gatewayd with the proxy as its ``cloud_url`` talks to the real cloudd for all else.
The test decides what each gateway is assigned; nothing assigned answers 404, as a cloudd without
the route does.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
from aiohttp import web

from models.artifact import ModelArtifact
from tests.harness.processes import free_port

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "content-encoding", "connection"}


class Assignments:
    """name -> the assignment document (every gateway gets the same); and who asked."""

    def __init__(self) -> None:
        self.documents: dict[str, dict[str, Any]] = {}
        self.asked: list[str] = []  # the gateway of each request, in order

    def assign(self, artifact: ModelArtifact, stage: str = "canary", reason: str = "test") -> None:
        self.assign_version(artifact.name, artifact.version, artifact.metadata.sha256, stage, reason)

    def assign_version(self, name: str, version: str, sha256: str, stage: str, reason: str) -> None:
        self.documents[name] = {
            "name": name,
            "version": version,
            "stage": stage,
            "sha256": sha256,
            "reason": reason,
        }

    async def handle(self, request: web.Request) -> web.Response:
        self.asked.append(request.query.get("gateway", ""))
        document = self.documents.get(request.match_info["name"])
        if document is None:
            return web.json_response({"error": "not_found", "detail": "no assignment"}, status=404)
        return web.json_response(document)


def assignment_route(app: web.Application, assignments: Assignments) -> None:
    app.router.add_get("/v1/models/{name}/assignment", assignments.handle)


class AssignmentProxy:
    """The assignment route, and cloudd (``upstream``) behind it for every other request; runs its
    own event loop in a thread, so sync tests use it like a process. ``stop()`` when done."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.assignments = Assignments()
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="assignment-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the assignment proxy did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._http = aiohttp.ClientSession()
        app = web.Application(client_max_size=256 * 1024 * 1024)
        assignment_route(app, self.assignments)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _forward(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._http.request(
            request.method,
            f"{self.upstream}{request.rel_url}",
            headers=headers,
            data=await request.read(),
        ) as response:
            body = await response.read()
            out = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS}
            return web.Response(body=body, status=response.status, headers=out)

    def stop(self) -> None:
        """Close the server (the gateway behind it sees connection refused); again: nothing."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            await self._runner.cleanup()
            await self._http.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
