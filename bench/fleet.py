"""Benchmark of the fleet: its pages (issue 27: the device chart over a week of 10 Hz data, the fleet
page's API call at 1,000 gateways) and a thousand gateways uploading (issue 26: the load section,
bench/_fleet_deployments.py, which says what it runs and measures).

Data: one device's telemetry at 10 Hz (three readings, a seq gap now and then) for one week
(``--quick``: six hours), written into a real cloudd data directory through the store's writer
(``DatasetStore.store_batch`` on batches decoded by ``protocol.batch.decode_batch``, what cloudd's
ingest does after its HTTP checks), 6,000 records per batch. Then a real cloudd is started on that
directory with 1,000 more gateways, each of which heartbeats once over HTTP. It runs with
``--no-tasks``: its task runner would otherwise read the whole stored week (the sensor windows of
cloud/tasks) while the calls are timed, and that is not what the pages cost.

Figures (times in ms; p95 over repeated calls, after one warm-up call):

- ``device_chart_api_p95_ms``: ``GET /v1/devices/<gw>/<dev>`` for the whole window, 600 points
  (the chart, last message, rate, gaps): the issue's target is under 200 ms for a week.
- ``device_chart_query_p95_ms``: the storage function alone (``series.window``, here on the
  10-minute rollups), in this process on a read-only store.
- baseline ``scan_segments_ms``: the same chart computed without the series tables, by reading the
  gateway's segment files and bucketing every record (measured once). Ratio ``chart_vs_scan``:
  scan time / API p95.
- ``fleet_api_p95_ms``: ``GET /v1/fleet?limit=50&sort=backlog_records&desc=1`` at 1,000 gateways;
  baseline ``fleet_all_rows_p95_ms``: the same call with ``limit=1000`` (all rows in one answer, as
  the page fetched them before it was paged). Ratio ``fleet_page_vs_all_rows``.

The load section's figures, per deployment (SQLite, and 1 and 2 PostgreSQL replicas, each behind
haproxy): ``batches_per_s`` stored in each stage of a ramp (and ``refused_per_s``, 503s),
``capacity_batches_per_s`` (the best stage), the everyday pace's batch POST p50/p99 and heartbeat
p99 (ms), the fleet page's p95 during the load, the load driver's own CPU (``driver_cores``; per
stage ``driver_stage_cores``), the serving side's (``serving_cores``, ``serving_cpu_ms_per_batch``),
the machine's (``machine_busy_cores``) and its load average, and the exactly-once check's counts.
Ratios: ``replicas2_vs_1`` (the issue's target: >= 1.3 on the 2-core machine) and
``postgres_vs_sqlite``, both of capacities.

    python -m bench.fleet [--quick] [--only pages|load] [--deployments "postgresql x1,postgresql x2"]
        -> bench/results/fleet.json

``--deployments`` runs only those of the load section (names as printed; default all three), and
only the ratios whose two deployments ran. ``--server-maxconn N``: haproxy's limit per replica
(default ``SERVER_MAXCONN``; 0 runs without one, the configuration before issue 26's overload work,
for comparison).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench._common import Results, parser
from bench._fleet_deployments import DEPLOYMENT_NAMES, load_section
from cloud.store import DatasetStore, series
from protocol.batch import decode_batch, encode_batch
from tests.harness.cloud_http import call, heartbeat
from tests.harness.cloudd import OPERATOR_TOKEN, cloudd_token, make_cloudd
from tests.harness.haproxy import SERVER_MAXCONN

GATEWAY, DEVICE, LOG_ID = "site", "sensor-000", "be0c0001"
RATE_HZ, PER_BATCH, POINTS = 10, 6000, 600
FLEET = tuple(f"gw{i:04d}" for i in range(1, 1001))
GAP_EVERY = 50_000  # every this many messages one seq is never sent (the page counts gaps)


def _record(seq: int, ts: float) -> bytes:
    t = seq / RATE_HZ
    readings = b'{"temperature_c":%r,"humidity_pct":%r,"soil_moisture_pct":%r}' % (
        20 + 3 * math.sin(t / 3600),
        55 + 6 * math.cos(t / 5000),
        35 + 2 * math.sin(t / 700),
    )
    body = b'{"v":1,"device":"%s","seq":%d,"ts":%r,"readings":%s,"status":"ok"}' % (
        DEVICE.encode(),
        seq,
        ts,
        readings,
    )
    return b'{"v":1,"kind":"telemetry","device":"%s","received_ts":%r,"body":%s}' % (
        DEVICE.encode(),
        ts,
        body,
    )


def generate(data_dir: Path, start: float, seconds: float) -> tuple[int, float]:
    """Store ``seconds`` of 10 Hz telemetry from ``start`` through the store's writer; return
    (records stored, seconds taken)."""
    store = DatasetStore.open(data_dir)
    began, stored, lsn = time.perf_counter(), 0, 1
    try:
        total = int(seconds * RATE_HZ)
        for first in range(0, total, PER_BATCH):
            seqs = [s for s in range(first, min(first + PER_BATCH, total)) if s % GAP_EVERY != GAP_EVERY - 1]
            entries = [(lsn + i, _record(s, start + s / RATE_HZ)) for i, s in enumerate(seqs)]
            lsn += len(entries)
            stored += store.store_batch(decode_batch(encode_batch(GATEWAY, LOG_ID, entries))).stored
    finally:
        store.close()
    return stored, time.perf_counter() - began


def p95_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: the first call opens files and fills caches
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.quantiles(times, n=20)[-1]


def scan_chart(data_dir: Path, start: float, end: float) -> int:
    """The chart the hard way: every stored record of the gateway read and bucketed (the baseline)."""
    store = DatasetStore.open(data_dir, readonly=True)
    step = (end - start) / POINTS
    buckets: dict[tuple[str, int], list[float]] = {}
    for row in store.iter_records(GATEWAY):
        record = row.record
        if record["device"] != DEVICE or not start <= record["received_ts"] < end:
            continue
        b = int((record["received_ts"] - start) / step)
        for name, value in record["body"]["readings"].items():
            acc = buckets.setdefault((name, b), [0, 0.0, value, value])
            acc[0] += 1
            acc[1] += value
            acc[2], acc[3] = min(acc[2], value), max(acc[3], value)
    return len(buckets)


def main() -> None:
    options = parser(__doc__.splitlines()[0])
    options.add_argument("--only", choices=("pages", "load"), help="one section (default: both)")
    options.add_argument(
        "--deployments",
        type=lambda text: tuple(name.strip() for name in text.split(",")),
        default=DEPLOYMENT_NAMES,
        help="the load section's deployments, comma-separated (default: all)",
    )
    options.add_argument(
        "--server-maxconn",
        type=int,
        default=SERVER_MAXCONN,
        help="haproxy's maxconn per replica in the load section (0: no limit, the configuration before it)",
    )
    args = options.parse_args()
    results = Results("fleet", args.quick)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        if args.only in (None, "pages"):
            pages_section(results, Path(tmp) / "pages", args.quick)
        if args.only in (None, "load"):
            load_section(results, Path(tmp) / "load", args.quick, args.deployments, args.server_maxconn)
    results.write()


def pages_section(results: Results, base: Path, quick: bool) -> None:
    """Issue 27's figures: the device chart over the week, and the fleet page at 1,000 gateways."""
    seconds = 6 * 3600.0 if quick else 7 * 86400.0
    repeats = 20 if quick else 60
    case = f"{seconds / 86400:g} d at {RATE_HZ} Hz"
    end = time.time()
    start = end - seconds
    server = make_cloudd(base, gateways=(GATEWAY, *FLEET), extra_args=["--no-tasks"])
    stored, took = generate(server.data_dir, start, seconds)
    results.add(case, "store_batch", "records", stored)
    results.add(case, "store_batch", "records_per_s", stored / took)
    window = f"start={start:.3f}&end={end:.3f}&points={POINTS}"

    reader = DatasetStore.open(server.data_dir, readonly=True)
    query = p95_ms(
        lambda: reader.read(lambda c: series.window(c, GATEWAY, DEVICE, start, end, POINTS)), repeats
    )
    results.add(case, "series.window", "device_chart_query_p95_ms", query)

    server.start()
    try:
        url = f"{server.url}/v1/devices/{GATEWAY}/{DEVICE}?{window}"

        def device_call() -> None:
            status, doc = call(url, OPERATOR_TOKEN)
            assert status == 200 and doc["chart"]["series"], doc

        api = p95_ms(device_call, repeats)
        results.add(case, "GET /v1/devices", "device_chart_api_p95_ms", api)
        status, doc = call(url, OPERATOR_TOKEN)
        results.add(case, "GET /v1/devices", "gaps_found", doc["window"]["gaps"])

        for i, gw in enumerate(FLEET):
            beat = heartbeat(
                gw, interval_s=600, backlog=(i * 37) % 500, cloud_tasks=("detect",) if i % 4 == 0 else ()
            )
            status, answer = call(f"{server.url}/v1/gateways/{gw}/heartbeat", cloudd_token(gw), "POST", beat)
            assert status == 200, answer
        fleet_case = f"{len(FLEET)} gateways"

        def fleet_call(limit: int) -> None:
            status, doc = call(
                f"{server.url}/v1/fleet?limit={limit}&sort=backlog_records&desc=1", OPERATOR_TOKEN
            )
            assert status == 200 and len(doc["gateways"]) == min(limit, len(FLEET) + 1), doc["totals"]

        paged = p95_ms(lambda: fleet_call(50), repeats * 2)
        everything = p95_ms(lambda: fleet_call(1000), repeats * 2)
        results.add(fleet_case, "GET /v1/fleet limit=50", "fleet_api_p95_ms", paged)
        results.add(fleet_case, "GET /v1/fleet limit=1000 (baseline)", "fleet_all_rows_p95_ms", everything)
        results.ratio("fleet_page_vs_all_rows", everything, paged)
    finally:
        server.stop()

    began = time.perf_counter()
    scan_chart(server.data_dir, start, end)
    scan = (time.perf_counter() - began) * 1000
    results.add(case, "scan segments (baseline)", "scan_segments_ms", scan)
    results.ratio("chart_vs_scan", scan, api)


if __name__ == "__main__":
    main()
