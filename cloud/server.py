"""cloudd: the cloud daemon's HTTP app and its one runner.

``build_app(config)`` makes the aiohttp application: shared state under the typed keys of
``cloud.api.context``, the store opened and closed by the app's cleanup context, and the route
groups of ``ROUTE_GROUPS`` (a later feature adds its module there). ``CloudServer`` is the one
runner. Invariant: it starts in order (store, then the job manager, then the task runner of
cloud/tasks, then routes, then the listening socket) and stops in reverse (stop accepting, end the
job event streams, let in-flight requests finish for up to ``shutdown_timeout``, stop the task
runner, stop the job manager (running jobs go back to queued), then close the store after its
queued writes), so nothing is acknowledged or stored after the store closes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from aiohttp import web

import models
from cloud.api import (
    alerts,
    blobs,
    devices,
    federated,
    fleet,
    health,
    ingest,
    jobs,
    openapi,
    probe,
    registry,
    roles,
    rollout,
    status,
    uploads,
)
from cloud.api.blobs import BLOBS
from cloud.api.context import CONFIG, METRICS, REGISTRY, ROLES, STORE, TASKS
from cloud.api.errors import json_errors
from cloud.api.roles import role_lifetime
from cloud.config import (
    CloudConfig,
    ConfigError,
    check_database_url,
    load_database_url,
    load_tokens_file,
    parse_token_arg,
)
from cloud.jobs.scheduling import add_scheduler_arguments, scheduler_from_args
from cloud.metrics import CloudMetrics
from cloud.notify import ModelNotifier, NotifyConfig, add_notify_arguments, parse_notify_args
from cloud.rollout.announce import announce_assignments
from cloud.rollout.flags import add_rollout_arguments, rollout_config
from cloud.rollout.verdict import GateConfig
from cloud.store import StoreLocked
from cloud.store.database import DatabaseError
from cloud.store.writer import AsyncStoreWriter
from cloud.tasks.runner import TaskRunner, TaskRunnerConfig
from cloud.web import routes as web_routes

log = logging.getLogger("cloudd")

ROUTE_GROUPS: tuple[Callable[[web.Application], None], ...] = (
    health.setup,
    roles.setup,
    ingest.setup,
    status.setup,
    probe.setup,
    blobs.setup,
    # rollout's routes before the registry's /v1/models/{name}/{version}: the router matches in order
    rollout.setup,
    # registry before jobs: jobs register versions; uploads before jobs: jobs train on them
    registry.setup,
    uploads.setup,
    jobs.setup,
    fleet.setup,
    devices.setup,
    alerts.setup,
    openapi.setup,
    web_routes.setup,
    federated.setup,
)


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    writer = app[STORE]
    await writer.open()
    recovery = writer.store.recovery
    if recovery.cut_bytes:
        log.info("store recovered: cut %d uncommitted bytes", recovery.cut_bytes)
    if recovery.corrupt:
        log.error("store corruption: committed bytes missing in %s", recovery.missing_bytes)
    try:
        yield
    finally:
        await writer.close()


def build_app(
    config: CloudConfig, *, extra_routes: Sequence[Callable[[web.Application], None]] = ()
) -> web.Application:
    """The cloudd application; ``extra_routes`` lets a caller add route groups (tests, features)."""
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[json_errors])
    app[CONFIG] = config
    app[METRICS] = CloudMetrics()
    app[ROLES] = {}
    app[STORE] = AsyncStoreWriter(
        config.data_dir, database=config.database, max_pending=config.max_pending_writes
    )
    app.cleanup_ctx.append(_store_lifetime)
    for setup in (*ROUTE_GROUPS, *extra_routes):
        setup(app)
    if config.tasks_enabled:
        runner = TaskRunner(
            app[STORE],
            app[BLOBS].store,
            app.get(REGISTRY),
            data_dir=config.data_dir,
            factory_dir=Path(models.__file__).resolve().parent / "artifacts",
            config=TaskRunnerConfig(poll_interval_s=config.tasks_poll_interval_s),
        )
        runner.register_metrics(app[METRICS].registry)
        app[TASKS] = runner
        app.cleanup_ctx.append(_tasks_lifetime)  # last: starts after everything it reads, stops first
    return app


async def _tasks_lifetime(app: web.Application) -> AsyncIterator[None]:
    runner = app[TASKS]
    async with role_lifetime(app, "tasks", runner.start, runner.stop):
        yield


class CloudServer:
    """The one runner of cloudd: owns the AppRunner and its single TCP site."""

    def __init__(self, config: CloudConfig, app: web.Application | None = None) -> None:
        self.config = config
        self.app = app if app is not None else build_app(config)
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        if self._runner is None or not self._runner.addresses:
            raise RuntimeError("CloudServer is not started")
        return self._runner.addresses[0][1]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("CloudServer already started")
        runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=self.config.shutdown_timeout)
        await runner.setup()  # runs the app's startup: opens (and recovers) the store
        self._runner = runner
        try:
            await web.TCPSite(runner, self.config.host, self.config.port).start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop accepting, drain in-flight requests (bounded), close the store. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def serve(
    config: CloudConfig,
    ready: Callable[[CloudServer], None] | None = None,
    notify: NotifyConfig | None = None,
) -> None:
    """Run cloudd until SIGTERM or SIGINT, then shut down within a deadline. With ``notify``, each
    lifecycle change of a model name is announced on MQTT to each gateway as the version it is now
    assigned (cloud/notify.py, cloud/rollout/announce.py)."""
    server = CloudServer(config)
    notifier = None
    if notify is not None:
        notifier = ModelNotifier(notify, lambda: config.gateway_tokens.keys())
        registry = server.app[REGISTRY]
        registry.add_lifecycle_listener(
            lambda name: announce_assignments(registry, name, config.gateway_tokens, notifier.notify_gateway)
        )
        notifier.start()  # connects in paho's thread: a dead broker never holds cloudd up
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        log.info(
            "cloudd listening on %s (data in %s, %d gateways)",
            server.url,
            config.data_dir,
            len(config.gateway_tokens),
        )
        if ready is not None:
            ready(server)
        await stop.wait()
        log.info("cloudd stopping")
    finally:
        try:
            # Drain gets shutdown_timeout; closing the store (queued writes) gets a little more.
            async with asyncio.timeout(config.shutdown_timeout + 5.0):
                await server.stop()
        except TimeoutError:
            log.error("cloudd: shutdown did not finish within %.0fs", config.shutdown_timeout + 5.0)
        if notifier is not None:
            await asyncio.to_thread(notifier.stop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def parse_args(argv: Sequence[str] | None = None) -> CloudConfig:
    parser = argparse.ArgumentParser(prog="cloudd", description="edgefed cloud daemon")
    parser.add_argument(
        "--data-dir",
        required=True,
        type=Path,
        help="datasets (and meta.sqlite without --database)",
    )
    parser.add_argument(
        "--database",
        metavar="URL",
        help="postgresql://USER[:PASSWORD]@HOST:PORT/DB: the metadata database replicas share "
        "(default: DATA_DIR/meta.sqlite; also [database] url in --tokens-file)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default=8700, type=int)
    parser.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="GW=TOKEN",
        help="a gateway's upload token (repeatable)",
    )
    parser.add_argument("--tokens-file", type=Path, help='TOML file: [gateways] gw1 = "token"')
    parser.add_argument("--operator-token", help="required by the operator API and dashboard when set")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0)
    parser.add_argument("--max-running-jobs", type=int, default=1, help="torchrun jobs at once")
    parser.add_argument("--max-queued-jobs", type=int, default=16, help="waiting jobs before 429")
    parser.add_argument("--max-job-nproc", type=int, default=4, help="largest nproc a job may ask for")
    add_scheduler_arguments(parser)
    parser.add_argument(
        "--max-dataset-bytes",
        type=int,
        default=512 * 1024 * 1024,
        help="largest dataset file an upload may be",
    )
    parser.add_argument("--no-tasks", action="store_true", help="run none of the tasks plans give the cloud")
    parser.add_argument(
        "--tasks-poll-interval", type=float, default=0.5, help="seconds between the task runner's reads"
    )
    parser.add_argument("--log-level", default="INFO")
    add_rollout_arguments(parser)
    add_notify_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tokens = load_tokens_file(args.tokens_file) if args.tokens_file else {}
    database = load_database_url(args.tokens_file) if args.tokens_file else None
    if args.database is not None:
        database = check_database_url(args.database, "--database")
    tokens.update(parse_token_arg(arg) for arg in args.token)
    if args.operator_token == "":
        raise ConfigError("--operator-token must not be empty")
    return CloudConfig(
        # absolute: the job steps (prepare, torchrun, export, gate) run in their job's own folder
        data_dir=Path(args.data_dir).resolve(),
        database=database,
        host=args.host,
        port=args.port,
        gateway_tokens=tokens,
        operator_token=args.operator_token,
        shutdown_timeout=args.shutdown_timeout,
        max_running_jobs=args.max_running_jobs,
        max_queued_jobs=args.max_queued_jobs,
        max_job_nproc=args.max_job_nproc,
        scheduler=scheduler_from_args(args),
        max_dataset_bytes=args.max_dataset_bytes,
        tasks_enabled=not args.no_tasks,
        tasks_poll_interval_s=args.tasks_poll_interval,
        gate=GateConfig(args.gate_tolerance, args.gate_floor_over_chance),
        rollout=rollout_config(args),
    )


def share_password(url: str) -> None:
    """Put the URL's password in ``PGPASSWORD`` for this process's children: a job's dataset step
    opens the store by the data directory's marker, which never holds the password."""
    password = urlsplit(url).password
    if password:
        os.environ["PGPASSWORD"] = unquote(password)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
        notify = parse_notify_args(argv)
    except (ConfigError, ValueError) as exc:
        print(f"cloudd: {exc}", file=sys.stderr)
        return 2
    if config.database is not None:
        share_password(config.database)
    if not config.gateway_tokens:
        log.warning("no gateway tokens configured: every upload will be refused (use --token GW=TOKEN)")
    try:
        asyncio.run(serve(config, notify=notify))
    except (StoreLocked, DatabaseError) as exc:
        print(f"cloudd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cloudd: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
