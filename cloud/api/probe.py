"""POST /v1/probe: a gateway's goodput probe. Reads the whole body, discards it, answers 200.

The gateway's LinkProber times this POST (and GET /healthz for the round trip) to estimate the
uplink's goodput when it has nothing real to send (gateway/placement/probe.py). No auth: it stores
nothing; the body is bounded by the app's ``client_max_size`` like every other request.
"""

from __future__ import annotations

from aiohttp import web

PROBE_PATH = "/v1/probe"


def setup(app: web.Application) -> None:
    app.router.add_post(PROBE_PATH, post_probe)


async def post_probe(request: web.Request) -> web.Response:
    received = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        received += len(chunk)
    return web.json_response({"ok": True, "bytes": received})
