"""Uplink drain benchmark: a large backlog drains while live records keep a bounded delay.

Real parts: an EpochLog on disk, the real Uplink, a real cloudd subprocess on loopback. Cases:
- ``no-backlog``: live records only (the baseline live delay);
- ``priority``: N backlog records in the log when the uplink starts (1M; --quick 30k), live records
  arriving during the drain; batches alternate live tail / backlog (classes alert > summary > raw);
- ``fifo``: the same backlog drained strictly in LSN order (backlog mode never entered), the
  behaviour before this feature: live records wait behind the backlog.
Live delay: from the record being durable in the log to the cloud's acknowledgement (polled every
5 ms). Ratios (higher is better): ``live_p95_fifo_over_priority``, how much sooner live data gets
through than behind a FIFO drain; ``live_p95_no_backlog_over_priority`` and
``live_p50_no_backlog_over_priority``, live delay with no backlog (the baseline, same run) over
live delay while the backlog drains: 1.0 means draining costs live data nothing.

    python -m bench.uplink [--quick] [--backlog N]   -> bench/results/uplink.json
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import Results, parse_args
from gateway.storage.epoch_log import EpochLog
from gateway.uplink.sender import Uplink
from protocol.config import UplinkConfig
from protocol.records import Record, encode_record

REPO = Path(__file__).resolve().parent.parent
LIVE_HZ = 50.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _record(i: int) -> bytes:
    if i % 1000 == 0:
        return encode_record(
            Record(kind="event", device="cam-1", received_ts=float(i), body={"severity": "alert", "i": i})
        )
    if i % 10 == 0:
        return encode_record(
            Record(
                kind="event",
                device="s1",
                received_ts=float(i),
                body={"severity": "info", "mean": 20.5, "i": i},
            )
        )
    return encode_record(
        Record(
            kind="telemetry",
            device="s1",
            received_ts=float(i),
            body={"v": 1, "device": "s1", "seq": i, "readings": {"t": 21.5}},
        )
    )


def _start_cloud(base: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cloud.server",
            "--data-dir",
            str(base / "cloud"),
            "--port",
            str(port),
            "--token",
            "gw1=t",
            "--log-level",
            "WARNING",
        ],
        cwd=REPO,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("cloudd did not start")


async def _case(base: Path, backlog: int, fifo: bool, live_s: float | None) -> dict[str, float]:
    proc, url = _start_cloud(base)
    log = EpochLog(base / "log", segment_bytes=64 << 20, max_bytes=4 << 30)
    await log.open()
    filled = time.perf_counter()
    # Setup, not measured. An epoch of 1000 records, waited for, keeps each written group small, as
    # a daemon flushing every few ms does: a reader must scan a whole group to reach a record in it
    # (its CRC chain starts at the group), so 50k-record groups would make every backlog read slow.
    for i in range(1, backlog + 1):
        await log.append(_record(i))
        if i % 1000 == 0:
            await log.flush(wait=True)
    await log.flush(wait=True)
    print(f"  filled {backlog} records in {time.perf_counter() - filled:.1f}s", flush=True)
    config = UplinkConfig(
        cloud_url=url,
        token="t",
        batch_max_records=1000,
        backoff_initial_s=0.05,
        backoff_max_s=0.5,
        backlog_threshold_records=10**9 if fifo else 2000,
    )
    uplink = Uplink(log, "gw1", config)
    delays: list[float] = []
    pending: dict[int, float] = {}
    started = time.perf_counter()
    await uplink.start()
    drained_at: float | None = None
    n = 0
    try:
        while True:
            now = time.perf_counter()
            if (
                drained_at is None
                and backlog
                and uplink.acknowledged(backlog)
                and uplink.backlog <= len(pending)
            ):
                drained_at = now - started
            done = (drained_at is not None or not backlog) and (live_s is None or now - started >= live_s)
            if done and not pending:
                break
            if not done and now - started >= n / LIVE_HZ:
                n += 1
                lsn = await log.append(_record(backlog + n))
                await log.flush(wait=True)
                pending[lsn] = time.perf_counter()
                uplink.wake()
            for lsn in [x for x in pending if uplink.acknowledged(x)]:
                delays.append(time.perf_counter() - pending.pop(lsn))
            await asyncio.sleep(0.005)
    finally:
        await uplink.stop()
        await log.close()
        proc.terminate()
        proc.wait(20)
    delays.sort()
    return {
        "live_records": len(delays),
        "live_mean_s": statistics.mean(delays),
        "live_p50_s": delays[int(0.5 * (len(delays) - 1))],
        "live_p95_s": delays[int(0.95 * (len(delays) - 1))],
        "live_max_s": delays[-1],
        "drain_s": drained_at or 0.0,
        "drain_records_per_s": backlog / drained_at if drained_at else 0.0,
    }


async def main() -> None:
    sizes = argparse.ArgumentParser(add_help=False)
    sizes.add_argument("--backlog", type=int, default=None, help="backlog records (default 1M; --quick 30k)")
    known, rest = sizes.parse_known_args()
    args = parse_args(__doc__.split("\n")[0], rest)
    backlog = known.backlog or (30_000 if args.quick else 1_000_000)  # --quick: < 1 minute on 2 cores
    results = Results("uplink", args.quick)
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, n, fifo, live_s in (
            ("no-backlog", 0, False, 5.0),
            ("priority", backlog, False, None),
            ("fifo", backlog, True, None),
        ):
            base = Path(tmp) / name
            base.mkdir()
            figures[name] = await _case(base, n, fifo, live_s)
            case = f"backlog {n}"
            for metric, value in figures[name].items():
                results.add(case, name, metric, value)
            print(name, {k: round(v, 4) for k, v in figures[name].items()}, flush=True)
    results.ratio(
        "live_p95_fifo_over_priority", figures["fifo"]["live_p95_s"], figures["priority"]["live_p95_s"]
    )
    for q in ("p95", "p50"):
        results.ratio(
            f"live_{q}_no_backlog_over_priority",
            figures["no-backlog"][f"live_{q}_s"],
            figures["priority"][f"live_{q}_s"],
        )
    results.write()


if __name__ == "__main__":
    asyncio.run(main())
