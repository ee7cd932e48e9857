"""Training jobs over HTTP (operator token on every route).

    POST /v1/jobs                   body: a JobSpec as JSON (or TOML with Content-Type application/toml)
                                    201 the job | 400 invalid_spec | 429 queue_full
    GET  /v1/jobs                   {"jobs": [job, ...], "counts": {...}, "limits": {...},
                                    "scheduler": {...}}, oldest first; limits: max_nproc,
                                    max_running, max_queued (what cloudd enforces: --max-job-nproc,
                                    --max-running-jobs, --max-queued-jobs); scheduler: the policy,
                                    placement, admission, nodes and the round counters
    GET  /v1/jobs/{job_id}          the job | 404 not_found
    POST /v1/jobs/{job_id}/cancel   the job, now cancelled | 409 already_finished
    GET  /v1/jobs/{job_id}/events   text/event-stream; ``?since=N`` or Last-Event-ID resumes

A job document is the ``JobTable`` row plus ``progress`` (step, total_steps, loss, accuracy,
samples_per_s, epoch), ``events`` (how many), ``phase`` (queued, starting, training, evaluating,
exporting, or the final state), ``features`` (the start event's: compression, wire_codec, sync,
balance, toggle, precision, device), ``live`` ({feature: the latest step's figures of it}),
``elapsed_s`` and ``eta_s`` (``cloud.jobs.events``), and ``schedule`` (queue position, the
policy's reason, the last decision, preemptions, attained service: ``JobManager.summary``).
Each server-sent event has ``id: <seq>``, ``event: <kind>`` (start, step, eval, checkpoint,
done, preempted, error, state, registered, ...) and ``data: <the progress line as JSON>``; the
stream ends with ``event: end`` once the job ended.

Invariant: the manager is started after the store opens and stopped before it closes (it is
the app's cleanup context appended after the store's), and every open event stream returns when
cloudd shuts down (``on_shutdown`` closes them before aiohttp waits for in-flight requests).
With replicas on PostgreSQL the manager runs only on the replica holding the ``jobs`` role
(cloud/roles.py); the others answer every route here 503 ``standby`` (the load balancer
sends these paths to the holder: docs/cloud.md, "Replicas").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from cloud.api.auth import operator_refusal
from cloud.api.context import CONFIG, JOBS, REGISTRY, STORE, UPLOADS
from cloud.api.errors import reject
from cloud.api.roles import role_lifetime, standby_refusal
from cloud.jobs.manager import JobManager, JobNotFound, QueueFull
from cloud.jobs.scheduling import scheduler_settings
from cloud.jobs.spec import JobSpec, SpecError, parse_spec
from cloud.jobs.table import FINAL, JobRow
from cloud.jobs.uploads import fits_loss

MAX_SPEC_BYTES = 64 * 1024
KEEPALIVE_S = 15.0


def setup(app: web.Application) -> None:
    config = app[CONFIG]
    app[JOBS] = JobManager(
        config.data_dir,
        app[REGISTRY],
        uploads=app[UPLOADS],
        max_running=config.max_running_jobs,
        max_queued=config.max_queued_jobs,
        gate=config.gate,
        scheduler=config.scheduler or scheduler_settings(default_devices=config.max_job_nproc),
    )
    app.cleanup_ctx.append(_manager_lifetime)
    app.on_shutdown.append(_close_streams)
    app.router.add_post("/v1/jobs", post_job)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel_job)
    app.router.add_get("/v1/jobs/{job_id}/events", job_events)


async def _manager_lifetime(app: web.Application) -> AsyncIterator[None]:
    manager, db = app[JOBS], app[STORE].store.db
    manager.database = db if db.shared else None  # SQLite: the jobs' own file, as before replicas
    async with role_lifetime(app, "jobs", manager.start, manager.stop):
        yield


def _refusal(request: web.Request) -> web.Response | None:
    """The operator's token, then whether this replica runs jobs."""
    return operator_refusal(request) or standby_refusal(request, "jobs")


async def _close_streams(app: web.Application) -> None:
    app[JOBS].close_streams()


def _job_or_404(request: web.Request, manager: JobManager) -> JobRow | web.Response:
    job_id = request.match_info["job_id"]
    try:
        return manager.get(job_id)
    except JobNotFound:
        return reject(request, 404, "not_found", f"no job {job_id!r}")


async def post_job(request: web.Request) -> web.Response:
    if (refusal := _refusal(request)) is not None:
        return refusal
    if (request.content_length or 0) > MAX_SPEC_BYTES:
        return reject(request, 413, "too_large", f"job spec > {MAX_SPEC_BYTES} bytes")
    body = await request.read()
    manager = request.app[JOBS]
    try:
        spec = parse_spec(body, max_nproc=request.app[CONFIG].max_job_nproc, upload_exists=_uploads(request))
        _check_upload_fits(request, spec)
        _check_fits_a_placement(manager, spec)
    except SpecError as exc:
        return reject(request, 400, "invalid_spec", str(exc))
    try:
        row = manager.submit(spec)
    except QueueFull as exc:
        return reject(request, 429, "queue_full", str(exc), headers={"Retry-After": "30"})
    return web.json_response(manager.summary(row), status=201)


def _uploads(request: web.Request) -> Callable[[str], bool]:
    return request.app[UPLOADS].exists


def _check_upload_fits(request: web.Request, spec: JobSpec) -> None:
    """An uploaded .npz whose rows or y do not fit the job is refused now, not after a queue wait."""
    meta = request.app[UPLOADS].meta(spec.upload) if spec.upload else None
    why = fits_loss(meta, spec.data_loss, spec.min_rows) if meta else None
    if why:
        raise SpecError(f"dataset: upload {spec.upload!r}: {why}")


def _check_fits_a_placement(manager: JobManager, spec: JobSpec) -> None:
    """A job larger than the whole cluster would wait forever: refused now."""
    if spec.nproc > manager.settings.devices:
        raise SpecError(
            f"nproc: {spec.nproc} > the {manager.settings.devices} devices of this cloudd's nodes (--nodes)"
        )


def job_limits(app: web.Application) -> dict[str, int]:
    """What cloudd enforces on jobs; the dashboard's form and /v1/status show these very numbers."""
    config = app[CONFIG]
    return {
        "max_nproc": config.max_job_nproc,
        "max_running": config.max_running_jobs,
        "max_queued": config.max_queued_jobs,
    }


async def list_jobs(request: web.Request) -> web.Response:
    if (refusal := _refusal(request)) is not None:
        return refusal
    manager = request.app[JOBS]
    return web.json_response(
        {
            "jobs": [manager.summary(row) for row in manager.list()],
            "counts": manager.counts(),
            "limits": job_limits(request.app),
            "scheduler": {
                **manager.settings.describe(),
                "metrics": manager.backend.scheduler.metrics.snapshot(),
            },
        }
    )


async def get_job(request: web.Request) -> web.Response:
    if (refusal := _refusal(request)) is not None:
        return refusal
    manager = request.app[JOBS]
    row = _job_or_404(request, manager)
    return row if isinstance(row, web.Response) else web.json_response(manager.summary(row))


async def cancel_job(request: web.Request) -> web.Response:
    if (refusal := _refusal(request)) is not None:
        return refusal
    manager = request.app[JOBS]
    row = _job_or_404(request, manager)
    if isinstance(row, web.Response):
        return row
    if row.state in FINAL:
        return reject(request, 409, "already_finished", f"job {row.id} is already {row.state}")
    row = await manager.cancel(row.id)
    return web.json_response(manager.summary(row))


def _start_at(request: web.Request) -> int | web.Response:
    text = request.query.get("since", request.headers.get("Last-Event-ID"))
    if text is None:
        return 0
    try:
        value = int(text)
    except ValueError:
        return reject(
            request, 400, "invalid_since", f"since / Last-Event-ID must be an integer, not {text!r}"
        )
    # Last-Event-ID names the last event seen; since names the first one wanted.
    return value if "since" in request.query else value + 1


async def job_events(request: web.Request) -> web.StreamResponse:
    if (refusal := _refusal(request)) is not None:
        return refusal
    manager = request.app[JOBS]
    row = _job_or_404(request, manager)
    if isinstance(row, web.Response):
        return row
    start = _start_at(request)
    if isinstance(start, web.Response):
        return start
    events = manager.events(row.id)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    sent = start
    while True:
        batch = events.since(sent)
        if batch:
            text = "".join(
                f"id: {e['seq']}\nevent: {e.get('event', 'message')}\ndata: {json.dumps(e)}\n\n"
                for e in batch
            )
            await response.write(text.encode())
            sent = batch[-1]["seq"] + 1
        elif events.closed:
            await response.write(b"event: end\ndata: {}\n\n")
            break
        elif not await events.wait(sent, KEEPALIVE_S):
            await response.write(b": keepalive\n\n")
    await response.write_eof()
    return response
