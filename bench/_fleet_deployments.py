"""The fleet bench's load section (issue 26): a thousand gateways (bench/_fleet_load.py) against
three deployments of cloudd, each behind the same haproxy (tests/harness/haproxy.py):

- ``sqlite x1``: one cloudd on its data directory's SQLite file (the embedded default);
- ``postgresql x1`` and ``postgresql x2``: one and two cloudd replicas on one PostgreSQL database
  (its own cluster, fsync on, as SQLite syncs) and one shared data directory
  (tests/harness/replicas.py).

Each runs one ``FleetPlan`` of stages, batches of ``RECORDS_PER_BATCH`` records: first the
everyday pace (one batch every ``PACE_S`` per gateway: a gateway with five sensors at 1 Hz that
uploads every 10 s), which gives the latencies (batch POST p99, heartbeat p99); then ``RAMP``, the
same fleet at 1.5, 2, 2.5 and 3 times that pace. cloudd's capacity is the most batches it stored per
second in any stage (each stage's window after its first seconds). Why a ramp and not a backlog
drained as fast as cloudd takes it: a thousand gateways with a backlog each offer ~3,000 POSTs at
once, cloudd answers most with 503 ``busy``, the uplinks back off, and the rate stored is then the
fleet's retry rhythm rather than cloudd's capacity (measured: 65-86 batches/s stored against
300-400 refused per second, where the same deployment kept up with 100/s paced).
Each stage also gets the CPU its window cost the serving side (cloudd, haproxy, PostgreSQL), the
driver and the machine, and the serving side's CPU per stored batch (bench/_fleet_cpu.py): on the
shared machine the rest of its work moves the stored rate more than a change to cloudd does.
Meanwhile a poller asks for the fleet page's call (``GET /v1/fleet?limit=50&sort=...``, the sorts
in turn) every ``FLEET_POLL_S`` and times it. Afterwards every record the gateways appended must
be stored exactly once (read from the store), or the bench fails. cloudd runs with
``--log-level WARNING`` (no access log line per request) and ``--no-tasks``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from bench._common import Results
from bench._fleet_cpu import ServingCpu, postmaster_pid
from bench._fleet_load import run_fleet
from bench._fleet_plan import (
    FleetPlan,
    Stage,
    driver_cpu,
    fleet_gateways,
    percentile,
    stage_figures,
    stage_windows,
    verify_exactly_once,
)
from cloud.store import DatasetStore
from tests.harness.cloud_http import call
from tests.harness.cloudd import OPERATOR_TOKEN, make_cloudd
from tests.harness.haproxy import SERVER_MAXCONN, start_haproxy
from tests.harness.postgres import Postgres, start_postgres
from tests.harness.replicas import start_replicas

RECORDS_PER_BATCH = 50
PACE_S = 10.0
RAMP = (1.5, 2, 2.5, 3)  # the paces after the everyday one, as multiples of it
FLEET_POLL_S = 0.5
WARMUP_S = 3.0  # each stage's first seconds, left out of its figures
STAGE_METRICS = (
    "batches_per_s",
    "refused_per_s",
    "serving_cores",  # cloudd, haproxy and PostgreSQL (bench/_fleet_cpu.py)
    "serving_cpu_ms_per_batch",
    "driver_stage_cores",  # the load driver's worker processes
    "machine_busy_cores",  # everything on the machine: the serving side, the driver, the rest
)
SORTS = ("backlog_records", "last_seen", "records", "id")
CLOUDD_ARGS = ("--log-level", "WARNING", "--no-tasks")


@dataclass(frozen=True)
class Deployment:
    name: str
    database: str  # "sqlite" | "postgresql"
    replicas: int
    maxconn: int = SERVER_MAXCONN  # haproxy's per replica (tests/harness/haproxy.py); 0: no limit


DEPLOYMENTS = (
    Deployment("sqlite x1", "sqlite", 1),
    Deployment("postgresql x1", "postgresql", 1),
    Deployment("postgresql x2", "postgresql", 2),
)
DEPLOYMENT_NAMES = tuple(deployment.name for deployment in DEPLOYMENTS)
# name -> (deployment, over deployment): capacities compared
RATIOS = (
    ("replicas2_vs_1", "postgresql x2", "postgresql x1"),
    ("postgres_vs_sqlite", "postgresql x1", "sqlite x1"),
)


@contextlib.contextmanager
def deployed(
    base: Path, deployment: Deployment, gateways: tuple[str, ...], pg: Postgres | None
) -> Iterator[tuple[str, Path, list[int]]]:
    """The deployment running behind haproxy; yields the balancer's URL, the data directory and the
    pids of the serving side (cloudd, haproxy, PostgreSQL's server)."""
    if deployment.database == "sqlite":
        server = make_cloudd(base / "sqlite", gateways=gateways, extra_args=CLOUDD_ARGS)
        server.start()
        try:
            balancer = start_haproxy(base / "sqlite-haproxy", [server.port], deployment.maxconn)
            try:
                assert server.proc is not None
                yield balancer.url, server.data_dir, [server.proc.pid, balancer.proc.pid]
            finally:
                balancer.stop()
        finally:
            server.stop()
        return
    assert pg is not None
    database = pg.create_database(f"fleet{uuid.uuid4().hex[:10]}")
    cluster = start_replicas(
        base / f"pg{deployment.replicas}",
        database,
        count=deployment.replicas,
        gateways=gateways,
        extra_args=CLOUDD_ARGS,
        maxconn=deployment.maxconn,
    )
    pids = [r.proc.pid for r in cluster.replicas if r.proc is not None]
    try:
        yield cluster.url, cluster.data_dir, [*pids, cluster.balancer.proc.pid, postmaster_pid(pg.data)]
    finally:
        cluster.stop()


class FleetPagePoller:
    """Asks for the fleet page's call every ``FLEET_POLL_S`` on a thread of its own (its owner
    stops it), sorting by each of ``SORTS`` in turn; keeps each whole answer's time, and counts the
    others (an error, or fewer than 50 rows)."""

    def __init__(self, url: str) -> None:
        self.url, self.failed = url, 0
        self.failures: Counter[str] = Counter()  # by status, or the error that came instead
        self.times_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-page-poller")

    def __enter__(self) -> FleetPagePoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        turn = 0
        while not self._stop.wait(FLEET_POLL_S):
            sort = SORTS[turn % len(SORTS)]
            turn += 1
            began = time.perf_counter()
            status: int | str
            try:
                status, doc = call(
                    f"{self.url}/v1/fleet?limit=50&sort={sort}&desc=1", OPERATOR_TOKEN, timeout=30
                )
            except (OSError, ValueError) as exc:  # no answer, or one that is not cloudd's JSON
                status, doc = type(exc).__name__, {}
            if status == 200 and len(doc.get("gateways", ())) == 50:
                self.times_ms.append((time.perf_counter() - began) * 1000)
            else:
                self.failed += 1
                self.failures[str(status)] += 1


def _stored_keys(data_dir: Path) -> Iterator[tuple[str, str, int]]:
    """(gateway, log id, LSN) of every record the store holds (its marker names its database)."""
    store = DatasetStore.open(data_dir, readonly=True)
    try:
        for row in store.iter_records():
            yield row.gateway, row.log_id, row.lsn
    finally:
        store.close()


def run_deployment(
    results: Results,
    base: Path,
    deployment: Deployment,
    plan_for: Callable[[str], FleetPlan],
    pg: Postgres | None,
) -> dict[str, float]:
    """One deployment under the fleet; its rows added to ``results``; returns its headline figures."""
    gateways = fleet_gateways(plan_for("").gateways)
    with deployed(base, deployment, gateways, pg) as (url, data_dir, serving_pids):
        plan = plan_for(url)
        load_before = os.getloadavg()[0]
        with FleetPagePoller(url) as poller, ServingCpu(serving_pids) as serving:
            reports = run_fleet(plan)
        load_after = os.getloadavg()[0]
        check = verify_exactly_once(reports, _stored_keys(data_dir))
    if check["missing"] or check["duplicates"] or check["unexpected"] or check["stored"] != check["appended"]:
        raise AssertionError(f"{deployment.name}: not exactly once: {check}")
    stages = stage_figures(plan, reports, warmup_s=WARMUP_S)
    for name, (lo, hi) in stage_windows(plan, reports, WARMUP_S).items():
        cpu_s = serving.cpu_s(lo, hi)
        stages[name]["serving_cores"] = cpu_s / (hi - lo)
        stages[name]["driver_stage_cores"] = serving.driver_s(lo, hi) / (hi - lo)
        stages[name]["machine_busy_cores"] = serving.machine_s(lo, hi) / (hi - lo)
        stored = stages[name]["batches_per_s"] * (hi - lo)
        stages[name]["serving_cpu_ms_per_batch"] = cpu_s * 1000 / stored if stored else float("nan")
    everyday = stages["everyday"]
    capacity = max(figures["batches_per_s"] for figures in stages.values())
    cpu = driver_cpu(reports)
    case = f"{plan.gateways} gateways, {deployment.name}"
    for name, figures in stages.items():
        system = f"{figures['offered_batches_per_s']:.0f} batches/s offered ({name})"
        for metric in STAGE_METRICS:
            results.add(case, system, metric, figures[metric])
    for metric in ("batch_p50_ms", "batch_p99_ms", "heartbeat_p99_ms"):
        results.add(case, "everyday pace", metric, everyday[metric])
    results.add(case, "best stage", "capacity_batches_per_s", capacity)
    page_p95 = percentile(poller.times_ms, 0.95)
    results.add(case, "GET /v1/fleet limit=50 during load", "fleet_api_p95_ms", page_p95)
    results.add(case, "GET /v1/fleet limit=50 during load", "fleet_api_failed", poller.failed)
    results.add(case, "driver (4 processes)", "driver_cpu_s", cpu["driver_cpu_s"])
    results.add(case, "driver (4 processes)", "driver_cores", cpu["driver_cores"])
    results.add(case, "machine", "loadavg_1min_after", load_after)
    results.add(case, "exactly once", "records_stored", check["stored"])
    results.add(case, "exactly once", "records_missing_or_doubled", check["missing"] + check["duplicates"])
    beats_failed = sum(f["heartbeats_failed"] for f in stages.values())
    results.add(case, "heartbeats", "heartbeats_failed", beats_failed)
    print(
        f"{case}: stored/s by stage {[round(f['batches_per_s']) for f in stages.values()]}, "
        f"refused/s {[round(f['refused_per_s']) for f in stages.values()]}, "
        f"serving CPU ms/batch {[round(f['serving_cpu_ms_per_batch'], 1) for f in stages.values()]} "
        f"cores {[round(f['serving_cores'], 2) for f in stages.values()]} "
        f"driver {[round(f['driver_stage_cores'], 2) for f in stages.values()]} "
        f"of the machine's busy {[round(f['machine_busy_cores'], 2) for f in stages.values()]}, "
        f"everyday p99 {everyday['batch_p99_ms']:.0f} ms, "
        f"heartbeat p99 {everyday['heartbeat_p99_ms']:.0f} ms, "
        f"fleet page p95 {page_p95:.0f} ms (failed: {dict(poller.failures)}), "
        f"driver {cpu['driver_cores']:.2f} cores, "
        f"load {load_before:.1f}->{load_after:.1f}",
        flush=True,
    )
    return {"batches_per_s": capacity, **cpu}


def fleet_plan(url: str, quick: bool) -> FleetPlan:
    """The load every deployment gets (module docstring)."""
    return FleetPlan(
        url=url,
        gateways=1000,
        records_per_batch=RECORDS_PER_BATCH,
        stages=(
            Stage("everyday", 12.0 if quick else 60.0, PACE_S),
            *(Stage(f"x{k}", 10.0 if quick else 30.0, PACE_S / k) for k in RAMP),
        ),
    )


def load_section(
    results: Results,
    base: Path,
    quick: bool,
    names: tuple[str, ...] = DEPLOYMENT_NAMES,
    maxconn: int = SERVER_MAXCONN,
) -> None:
    """The deployments ``names`` (default: all) under the fleet, then the ratios of those run:
    ``replicas2_vs_1`` (two PostgreSQL replicas' capacity over one's, the same balancer) and
    ``postgres_vs_sqlite`` (one replica). ``maxconn``: haproxy's limit per replica (0: none)."""
    unknown = set(names) - set(DEPLOYMENT_NAMES)
    if unknown:
        raise ValueError(f"no deployment {sorted(unknown)}; there are {list(DEPLOYMENT_NAMES)}")
    capacity: dict[str, float] = {}
    pg = start_postgres(fsync=True)
    try:
        for deployment in (replace(d, maxconn=maxconn) for d in DEPLOYMENTS if d.name in names):
            figures = run_deployment(results, base, deployment, lambda url: fleet_plan(url, quick), pg)
            capacity[deployment.name] = figures["batches_per_s"]
    finally:
        pg.stop()
    for ratio, ours, baseline in RATIOS:
        if ours in capacity and baseline in capacity:
            results.ratio(ratio, capacity[ours], capacity[baseline])
