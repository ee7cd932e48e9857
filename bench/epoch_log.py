"""Benchmark of the epoch log (issue 3): writer throughput, flush->durable latency, recovery, and
reading the backlog back: a plain ``read`` (every record returned) beside a scrub (``verify``: the
same checks, no records returned), both in MB/s of segment bytes (issue 20).

Baselines measured in the same run: fsync after every record, SQLite WAL synchronous=FULL (one
transaction per epoch), SQLite synchronous=NORMAL, and the same log with fsync disabled (ceiling).
Writer throughput is what the writer sees: appends and flush() calls, waiting only at the end.

The headline case (1 KiB records, 256 per epoch), from which the three ratios are taken, is run as
alternating pairs (with fsync, then without) and the ratios use the medians: one run of a few
thousand records lasts milliseconds and a shared 2-core box preempts the writer for as long, so a
single pair says little. Its rows also split the writer's wall time (Linux schedstat): on CPU,
preempted (runnable, waiting for a core: machine load) and blocked (asleep: waiting for buffer
space or the GIL, i.e. for the log). Blocked time is the coupling to the disk this log avoids.

    python -m bench.epoch_log [--quick]   -> bench/results/epoch_log.json
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from bench._common import Results, parse_args
from gateway.storage.epoch_log import EpochLog
from gateway.storage.filelayer import OsFileLayer
from gateway.storage.recovery import recover_all

SIZES = (128, 1024, 65536)
EPOCHS = (1, 16, 256)
GRID_SYNC_METRICS = ("records_per_s_durable", "p50_ms", "p99_ms")


def _label(size: int, per_epoch: int) -> str:
    return f"{size // 1024}KiB x {per_epoch}/epoch" if size >= 1024 else f"{size}B x {per_epoch}/epoch"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _schedstat() -> tuple[float, float] | None:
    """(seconds on CPU, seconds runnable but waiting for a CPU) of the calling thread, if Linux says."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return None


def _durable_after(latencies: list[float], t0: float, _done: object) -> None:
    """A flush's durable future completed: its flush->durable latency."""
    latencies.append(time.perf_counter() - t0)


async def _log_run(
    directory: Path, size: int, per_epoch: int, records: int, sync: bool, latencies: list[float] | None = None
) -> dict[str, float]:
    log = EpochLog(directory, segment_bytes=64 << 20, max_bytes=64 << 30, file_layer=OsFileLayer(sync=sync))
    await log.open()
    record = os.urandom(size)
    sink: list[float] = [] if latencies is None else latencies
    append, flush = log.append, log.flush
    sched = _schedstat()
    started = time.perf_counter()
    last = None
    for _ in range(records // per_epoch):
        for _ in range(per_epoch):
            await append(record)
        t0 = time.perf_counter()
        last = await flush()
        last.durable.add_done_callback(partial(_durable_after, sink, t0))
    written = time.perf_counter() - started
    sched_after = _schedstat()
    if last is not None:  # every epoch durable: the last one is, and they become durable in order
        await last
    durable = time.perf_counter() - started
    await log.close()
    n = (records // per_epoch) * per_epoch
    out = {
        "records_per_s": n / written,
        "mb_per_s": n * size / written / 1e6,
        "records_per_s_durable": n / durable,
        "p50_ms": _percentile(sink, 0.5) * 1e3,
        "p99_ms": _percentile(sink, 0.99) * 1e3,
    }
    if sched is not None and sched_after is not None:
        on_cpu, preempted = sched_after[0] - sched[0], sched_after[1] - sched[1]
        out.update(
            writer_on_cpu_ms=on_cpu * 1e3,
            writer_preempted_ms=preempted * 1e3,
            writer_blocked_ms=max(0.0, written - on_cpu - preempted) * 1e3,
        )
    return out


async def _headline(base: Path, pairs: int, records: int, results: Results) -> tuple[float, float]:
    """1 KiB x 256/epoch, alternating (fsync, no fsync) pairs; (median ours, median ceiling) records/s."""
    case = f"{_label(1024, 256)} (median of {pairs} alternating pairs of {records} records)"
    runs: dict[str, list[dict[str, float]]] = {"epoch_log": [], "epoch_log_no_fsync": []}
    latencies: list[float] = []
    for pair in range(pairs):
        for system, sync in (("epoch_log", True), ("epoch_log_no_fsync", False)):
            run = await _log_run(
                base / f"headline-{system}-{pair}", 1024, 256, records, sync, latencies if sync else None
            )
            runs[system].append(run)
    for system, rows in runs.items():
        for metric in rows[0]:
            if metric in ("p50_ms", "p99_ms", "records_per_s_durable") and system != "epoch_log":
                continue
            if metric not in ("p50_ms", "p99_ms"):
                results.add(case, system, metric, statistics.median(r[metric] for r in rows))
        rates = [r["records_per_s"] for r in rows]
        results.add(case, system, "records_per_s_min", min(rates))
        results.add(case, system, "records_per_s_max", max(rates))
    results.add(case, "epoch_log", "p50_ms", _percentile(latencies, 0.5) * 1e3)
    results.add(case, "epoch_log", "p99_ms", _percentile(latencies, 0.99) * 1e3)
    pair_ratios = [
        a["records_per_s"] / b["records_per_s"]
        for a, b in zip(runs["epoch_log"], runs["epoch_log_no_fsync"], strict=True)
    ]
    results.add(case, "epoch_log / no_fsync", "pair_ratio_min", min(pair_ratios))
    results.add(case, "epoch_log / no_fsync", "pair_ratio_max", max(pair_ratios))
    return (
        statistics.median(r["records_per_s"] for r in runs["epoch_log"]),
        statistics.median(r["records_per_s"] for r in runs["epoch_log_no_fsync"]),
    )


def _fsync_per_record(path: Path, size: int, records: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    record = os.urandom(size)
    started = time.perf_counter()
    for _ in range(records):
        os.write(fd, record)
        os.fsync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    return records / elapsed


def _sqlite(path: Path, size: int, per_epoch: int, records: int, synchronous: str) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE log (lsn INTEGER PRIMARY KEY, data BLOB)")
    record = os.urandom(size)
    rows = [(record,)] * per_epoch
    started = time.perf_counter()
    for _ in range(records // per_epoch):
        db.execute("BEGIN")
        db.executemany("INSERT INTO log (data) VALUES (?)", rows)
        db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    db.close()
    return (records // per_epoch) * per_epoch / elapsed


async def _recovery(directory: Path, records: int) -> dict[str, float]:
    log = EpochLog(directory, segment_bytes=64 << 20, max_bytes=64 << 30)
    await log.open()
    record = os.urandom(1024)
    for i in range(records):
        await log.append(record)
        if i % 256 == 255:
            await log.flush()
    await log.flush(wait=True)
    await log.close()
    started = time.perf_counter()
    reopened = EpochLog(directory, segment_bytes=64 << 20, max_bytes=64 << 30)
    await reopened.open()
    await reopened.append(b"new record")
    until_append = time.perf_counter() - started
    backlog = reopened.durable_lsn - reopened.trimmed_lsn
    read_mb_s, scrub_mb_s = await _read_and_scrub(reopened, records)
    await reopened.close()
    started = time.perf_counter()
    full = recover_all(OsFileLayer(), str(directory), collect=False)
    full_scan = time.perf_counter() - started
    assert full.damage is None and full.last_lsn >= records and backlog >= records
    return {
        "open_to_first_append_s": until_append,
        "full_recovery_scan_s": full_scan,
        "read_mb_per_s": read_mb_s,
        "scrub_mb_per_s": scrub_mb_s,
    }


async def _read_and_scrub(log: EpochLog, records: int, rounds: int = 3) -> tuple[float, float]:
    """Medians of ``rounds`` alternating (read everything, verify everything) passes, in MB/s of
    the segment bytes each covers (a verify pass reports them; a read covers the same)."""
    reads, scrubs = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        count = sum([1 async for _ in log.read(1)])
        read_s = time.perf_counter() - started
        report = await log.verify()
        assert count >= records and report.records >= records and not report.damage
        reads.append(report.bytes / read_s / 1e6)
        scrubs.append(report.mb_per_s)
    return statistics.median(reads), statistics.median(scrubs)


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    results = Results("epoch_log", args.quick)
    budget = (4 << 20) if args.quick else (64 << 20)  # bytes written per case
    base = Path(tempfile.mkdtemp(prefix="epochlog-bench-", dir=os.environ.get("BENCH_DIR", ".")))
    try:
        for size in SIZES:
            for per_epoch in EPOCHS:
                records = max(per_epoch, min(budget // size, 200_000 if not args.quick else 20_000))
                records -= records % per_epoch
                case = _label(size, per_epoch)
                for system, sync in (("epoch_log", True), ("epoch_log_no_fsync", False)):
                    directory = base / f"{system}-{size}-{per_epoch}"
                    run = await _log_run(directory, size, per_epoch, records, sync)
                    for metric, value in run.items():
                        if metric in ("records_per_s", "mb_per_s") or (sync and metric in GRID_SYNC_METRICS):
                            results.add(case, system, metric, value)
        per_record_n = 500 if args.quick else 3000
        fsync_rate = _fsync_per_record(base / "fsync-per-record", 1024, per_record_n)
        results.add("1KiB x 1/record", "fsync_per_record", "records_per_s", fsync_rate)
        sqlite_n = 25_600 if args.quick else 256_000
        full = _sqlite(base / "full.db", 1024, 256, sqlite_n, "FULL")
        normal = _sqlite(base / "normal.db", 1024, 256, sqlite_n, "NORMAL")
        results.add(_label(1024, 256), "sqlite_wal_full", "records_per_s", full)
        results.add(_label(1024, 256), "sqlite_wal_normal", "records_per_s", normal)
        pairs, headline_records = (7, 32_768) if args.quick else (9, 65_536)
        headline, ceiling_rate = await _headline(base, pairs, headline_records, results)
        results.ratio("vs_sqlite_wal_full", headline, full)
        results.ratio("vs_fsync_per_record", headline, fsync_rate)
        results.ratio("vs_no_fsync_ceiling", headline, ceiling_rate)
        backlog = 100_000 if args.quick else 1_000_000
        recovery = await _recovery(base / "recovery", backlog)
        for metric, value in recovery.items():
            results.add(
                f"backlog {backlog} x 1KiB" + (" (quick: not 1,000,000)" if args.quick else ""),
                "epoch_log",
                metric,
                value,
            )
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    results.write()


if __name__ == "__main__":
    asyncio.run(main())
