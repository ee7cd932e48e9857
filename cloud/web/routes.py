"""Serve the dashboard: ``GET /`` is ``static/index.html``, ``GET /web/<file>`` its assets.

No token is needed for the files themselves (they hold no data); the page asks for the operator
token and sends it as ``Authorization: Bearer`` on every API call (see docs/dashboard.md).
Invariant: only files inside ``static/`` are served (aiohttp's static route refuses ``..``).
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).resolve().parent / "static"


async def get_index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def setup(app: web.Application) -> None:
    app.router.add_get("/", get_index)
    app.router.add_static("/web/", STATIC_DIR, show_index=False)
