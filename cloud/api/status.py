"""GET /v1/status: what each gateway and device has uploaded (JSON, for cloudctl and dashboards).

Shape: ``{"v":1, "gateways":[{id,last_seen,records,batches,duplicates}],
"devices":[{gateway,device,records,last_ts}], "totals":{records,batches}, "tasks":{...}}``
(``tasks``, when cloudd runs its task runner: ``cloud.tasks.runner.TaskRunner.status``). Gateways that have a
token but never uploaded are listed with zero counts and ``last_seen: null``. When an operator
token is configured it is required (401 ``unauthorized`` otherwise).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from cloud.api.context import CONFIG, STORE, TASKS
from cloud.api.errors import bearer_token, token_ok, unauthorized
from cloud.store.dataset import StoreCounts

STATUS_PATH = "/v1/status"


def setup(app: web.Application) -> None:
    app.router.add_get(STATUS_PATH, get_status)


def status_document(counts: StoreCounts, configured_gateways: list[str]) -> dict[str, Any]:
    """The status JSON (pure: counts in, document out)."""
    gateways = {g.id: dataclasses.asdict(g) for g in counts.gateways}
    for gateway in configured_gateways:
        gateways.setdefault(
            gateway, {"id": gateway, "last_seen": None, "records": 0, "batches": 0, "duplicates": 0}
        )
    return {
        "v": 1,
        "gateways": [gateways[k] for k in sorted(gateways)],
        "devices": [dataclasses.asdict(d) for d in counts.devices],
        "totals": {"records": counts.records, "batches": counts.batches},
    }


async def get_status(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    if config.operator_token is not None and not token_ok(bearer_token(request), config.operator_token):
        return unauthorized(request, "Authorization: Bearer operator token required for /v1/status")
    counts = await request.app[STORE].counts()
    document = status_document(counts, sorted(config.gateway_tokens))
    if TASKS in request.app:
        document["tasks"] = request.app[TASKS].status()
    return web.json_response(document)
