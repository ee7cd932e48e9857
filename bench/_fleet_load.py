"""A fleet of light gateways as load for cloudd: N gateways, each a real ``EpochLog`` and the real
``Uplink`` of gatewayd sending real batches over HTTP, plus the gateway's heartbeats, from a few
worker processes (so that one event loop's lag does not become the latency measured).

What load, as data: bench/_fleet_plan.py's ``FleetPlan``. Before the stages begin each gateway's
log holds ``backlog_batches`` batches of records (durable, not sent: what an outage leaves). In a
paced stage every gateway appends ``records_per_batch`` telemetry records (soil readings of 10
devices, round robin) every ``batch_every_s`` seconds, flushes them (one epoch) and wakes its
uplink, whose ``batch_max_records`` is ``records_per_batch``: a gateway that keeps up sends one
batch per append, one that is behind sends full batches back to back (up to its
``in_flight_batches``), backing off as gatewayd does when cloudd answers 503 ``busy``. Gateway
``i`` starts at ``i / N`` of the period (the fleet is spread over it, not in lock step), and
heartbeats every ``heartbeat_every_s`` with its backlog and counters (the body gatewayd's
``HeartbeatSender`` makes; a worker's gateways share one HTTP session for them). The logs live
under the plan's ``log_root`` (tmpfs by default: the driver must not spend the disk cloudd needs).

Measured at the driver: every batch POST with its outcome, every heartbeat, each with its
wall-clock end; each worker's CPU seconds (``getrusage``, its threads included) from the start
until its gateways drained.

Invariant: when ``run_fleet`` returns, every record a gateway appended is acknowledged by cloudd
(the uplinks drained), or it raises ``FleetNotDrained`` naming the gateways still behind. Before
any worker starts, cloudd must answer ``GET /healthz`` within ``PROBE_TIMEOUT_S``, or it raises
``FleetUnreachable`` (a thousand uplinks would otherwise retry a dead URL until the drain's
deadline, minutes, saying nothing).

    python -m bench._fleet_load --url http://127.0.0.1:8700 --gateways 1000 [--seconds 30 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import logging
import multiprocessing
import resource
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from bench._fleet_plan import FleetPlan, Stage, WorkerReport, drain_figures, driver_cpu, stage_figures
from gateway.heartbeat import HeartbeatSender, heartbeat_counters
from gateway.storage.epoch_log import EpochLog
from gateway.uplink.sender import Uplink
from protocol.config import UplinkConfig
from protocol.records import telemetry_record

DEVICES_PER_GATEWAY = 10
HEARTBEATS_IN_FLIGHT = 64  # per worker; a heartbeat due while this many wait is skipped (counted)
START_TIMEOUT_S = 300.0  # the workers' logs and uplinks opened
PROBE_TIMEOUT_S = 5.0  # cloudd answers GET /healthz within this before the fleet starts


class FleetNotDrained(RuntimeError):
    pass


class FleetUnreachable(RuntimeError):
    pass


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ``FleetUnreachable`` unless ``GET url/healthz`` answers 200 within ``timeout_s``."""
    target = f"{url.rstrip('/')}/healthz"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the uplinks: no proxy
    try:
        with direct.open(target, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:  # refused, no route, timed out, not a URL
        raise FleetUnreachable(f"cloudd at {url} does not answer GET /healthz: {exc}") from exc
    if status != 200:
        raise FleetUnreachable(f"cloudd at {url} answered GET /healthz with {status}, not 200")


class LightGateway:
    """One gateway's log and uplink; ``append_batch`` is what its sensors would have produced."""

    def __init__(
        self,
        gateway: str,
        index: int,
        directory: Path,
        plan: FleetPlan,
        times: list[tuple[float, float, str]],
    ) -> None:
        self.gateway, self.index, self._seq = gateway, index, 0
        self.log = EpochLog(directory, segment_bytes=1 << 20, max_bytes=64 << 20, writer_threads=1)
        token = plan.token_format.format(gateway=gateway)
        # a long timeout: a slow answer under overload is cloudd's queue, measured as latency, not
        # a request to abandon and send again
        config = UplinkConfig(
            cloud_url=plan.url, token=token, batch_max_records=plan.records_per_batch, timeout_s=120.0
        )
        # each POST timed with its outcome: the link monitor's feed cannot tell a 503 from a stored batch
        self.uplink = Uplink(
            self.log,
            gateway,
            config,
            on_answer=lambda outcome, seconds: times.append((time.time(), seconds, outcome.kind)),
        )
        self.heartbeat = HeartbeatSender(gateway, plan.url, token, plan.heartbeat_every_s, self._describe)
        self.heartbeat_url = f"{plan.url.rstrip('/')}/v1/gateways/{gateway}/heartbeat"
        self.heartbeat_headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def open(self, backlog_batches: int, records_per_batch: int) -> None:
        """Open the log with ``backlog_batches`` batches of records in it, durable, not sent yet."""
        await self.log.open()
        for _ in range(backlog_batches):
            await self.append_batch(records_per_batch)
        await self.log.flush(wait=True)

    async def stop(self) -> None:
        await self.uplink.stop()
        await self.log.close()

    async def append_batch(self, count: int) -> None:
        now = time.time()
        for _ in range(count):
            self._seq += 1
            device = f"sensor-{self._seq % DEVICES_PER_GATEWAY:03d}"
            body = (
                b'{"v":1,"device":"%s","seq":%d,"ts":%.3f,"readings":{"soil_moisture_pct":%.2f},"status":"ok"}'
                % (
                    device.encode(),
                    self._seq,
                    now,
                    30 + (self._seq * 7 % 100) / 10,
                )
            )
            await self.log.append(telemetry_record(device, now, body))
        epoch = await self.log.flush()
        epoch.durable.add_done_callback(lambda _: self.uplink.wake())

    def _describe(self) -> dict[str, Any]:
        return {
            "backlog_records": self.uplink.backlog,
            "counters": heartbeat_counters(self.log.stats(), {}, self.uplink.figures),
        }


async def _produce(gateways: list[LightGateway], plan: FleetPlan, began: float) -> None:
    """Every gateway's appends, stage by stage, each gateway at its phase of the period."""
    stage_start = began
    for stage in plan.stages:
        end, period = stage_start + stage.seconds, stage.batch_every_s
        due = (
            []
            if period is None
            else [(stage_start + g.index / plan.gateways * period, i) for i, g in enumerate(gateways)]
        )
        heapq.heapify(due)
        while due and due[0][0] < end:
            assert period is not None
            at, i = heapq.heappop(due)
            if at > time.time():
                await asyncio.sleep(at - time.time())
            await gateways[i].append_batch(plan.records_per_batch)
            heapq.heappush(due, (at + period, i))
        await asyncio.sleep(max(0.0, end - time.time()))
        stage_start = end


async def _heartbeats(
    gateways: list[LightGateway], plan: FleetPlan, began: float, report: WorkerReport
) -> None:
    """Every gateway's heartbeat at its phase of ``heartbeat_every_s``; this task owns the requests."""
    period = plan.heartbeat_every_s
    due = [(began + g.index / plan.gateways * period, i) for i, g in enumerate(gateways)]
    heapq.heapify(due)
    in_flight: set[asyncio.Task[None]] = set()
    connector = aiohttp.TCPConnector(limit=HEARTBEATS_IN_FLIGHT)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        try:
            while True:
                at, i = heapq.heappop(due)
                await asyncio.sleep(max(0.0, at - time.time()))
                heapq.heappush(due, (at + period, i))
                if len(in_flight) >= HEARTBEATS_IN_FLIGHT:
                    report.heartbeats_skipped += 1
                    continue
                task = asyncio.create_task(_beat(session, gateways[i], report))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        finally:
            for task in list(in_flight):
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)


async def _beat(session: aiohttp.ClientSession, gateway: LightGateway, report: WorkerReport) -> None:
    body = gateway.heartbeat.body()  # what gatewayd's HeartbeatSender sends
    began = time.perf_counter()
    try:
        async with session.post(
            gateway.heartbeat_url, data=body, headers=gateway.heartbeat_headers
        ) as response:
            await response.read()
            status = response.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        status = 0
    report.heartbeats.append((time.time(), time.perf_counter() - began, status))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _worker(plan: FleetPlan, part: list[tuple[int, str]], root: Path, barrier: Any) -> WorkerReport:
    report = WorkerReport()
    gateways = [LightGateway(gw, index, root / gw, plan, report.batches) for index, gw in part]
    try:
        for gateway in gateways:
            await gateway.open(plan.backlog_batches, plan.records_per_batch)
        # every worker ready: the stages begin together
        await asyncio.to_thread(barrier.wait, START_TIMEOUT_S)
        report.started, cpu_before = time.time(), _cpu_s()
        for gateway in gateways:
            await gateway.uplink.start()
        beating = asyncio.create_task(_heartbeats(gateways, plan, report.started, report))
        try:
            await _produce(gateways, plan, report.started)
            report.behind = await _drain(gateways, plan.drain_s)
        finally:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)
        report.ended, report.cpu_s = time.time(), _cpu_s() - cpu_before
        for g in gateways:
            report.appended[g.gateway] = (g.log.log_id, g.log.durable_lsn)
            for kind, count in g.uplink.failures.items():
                report.failures[kind] = report.failures.get(kind, 0) + count
    finally:
        for gateway in gateways:
            await gateway.stop()
    return report


async def _drain(gateways: list[LightGateway], seconds: float) -> list[str]:
    """Wait up to ``seconds`` for every uplink to have its log acknowledged; the gateways behind."""
    deadline = time.time() + seconds
    behind = [g for g in gateways if g.uplink.backlog]
    while behind and time.time() < deadline:
        await asyncio.sleep(0.2)
        behind = [g for g in behind if g.uplink.backlog]
    return [g.gateway for g in behind]


def _worker_main(plan: FleetPlan, part: list[tuple[int, str]], root: str, barrier: Any, results: Any) -> None:
    # a thousand uplinks' retry warnings would drown the bench's output; they are counted instead
    logging.getLogger("gateway").setLevel(logging.ERROR)
    try:
        results.put(asdict(asyncio.run(_worker(plan, part, Path(root), barrier))))
    except BaseException as exc:
        barrier.abort()
        results.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


def run_fleet(plan: FleetPlan) -> list[WorkerReport]:
    """Run the plan's stages from ``plan.processes`` worker processes; their reports once drained."""
    probe(plan.url)
    ids = list(enumerate(plan.gateway_ids()))
    parts = [ids[w :: plan.processes] for w in range(plan.processes) if ids[w :: plan.processes]]
    context = multiprocessing.get_context("spawn")  # no inherited event loop or threads
    barrier, results = context.Barrier(len(parts)), context.Queue()
    root = tempfile.mkdtemp(prefix="fleet-logs-", dir=plan.log_root)
    workers = [
        context.Process(target=_worker_main, args=(plan, part, root, barrier, results), name=f"fleet-{w}")
        for w, part in enumerate(parts)
    ]
    started: list[Any] = []
    try:
        for worker in workers:
            worker.start()
            started.append(worker)
        timeout = START_TIMEOUT_S + sum(s.seconds for s in plan.stages) + plan.drain_s + 120
        documents = [results.get(timeout=timeout) for _ in workers]
    finally:
        for worker in started:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
        shutil.rmtree(root, ignore_errors=True)
    errors = [d["error"] for d in documents if "error" in d]
    if errors:
        raise RuntimeError(f"fleet worker failed: {'; '.join(errors)}")
    reports = [WorkerReport(**d) for d in documents]
    behind = sorted(gw for r in reports for gw in r.behind)
    if behind:
        raise FleetNotDrained(f"{len(behind)} gateways not drained after {plan.drain_s}s: {behind[:10]}")
    return reports


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="cloudd (or its load balancer)")
    parser.add_argument("--gateways", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the paced stage")
    parser.add_argument("--batch-every-s", type=float, default=10.0, help="each gateway's pace")
    parser.add_argument("--records-per-batch", type=int, default=50)
    parser.add_argument("--backlog-batches", type=int, default=0, help="in each log at the start")
    parser.add_argument("--heartbeat-every-s", type=float, default=15.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--token-format", default="token-{gateway}", help="each gateway's upload token")
    args = parser.parse_args(argv)
    plan = FleetPlan(
        url=args.url,
        gateways=args.gateways,
        stages=(Stage("paced", args.seconds, args.batch_every_s),),
        records_per_batch=args.records_per_batch,
        backlog_batches=args.backlog_batches,
        heartbeat_every_s=args.heartbeat_every_s,
        processes=args.processes,
        token_format=args.token_format,
    )
    try:
        reports = run_fleet(plan)
    except FleetUnreachable as exc:
        sys.exit(f"fleet: {exc}")
    summary = {**stage_figures(plan, reports, warmup_s=min(5.0, args.seconds / 4)), **driver_cpu(reports)}
    if plan.backlog_batches:
        summary["backlog"] = drain_figures(plan, reports)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
