"""Gateway ingest benchmark (issue 26): a real gatewayd's sensor ingest against a bare paho subscriber,
on the same broker, fed by the same publisher with the same messages.

Real parts: a private mosquitto on a free port (tests/harness/broker.py), the raw-socket QoS 1
publisher and the bare paho subscriber of bench/_ingest_clients.py (each its own process), and
gatewayd run as users run it (``python -m gateway.daemon --config``, sensor ingest, no camera, its
uplink pointed at a closed port). Messages: devicesim's telemetry JSON, 20 devices round-robin.

Cases, alternating in each repetition:
- ``publisher alone`` (once, first): the publisher with nobody subscribed, PUBACKs per second: how
  far above the consumers' rates the feed is;
- ``bare paho`` (the baseline): msgs/s from the publisher's first PUBLISH to the subscriber's
  ``count``-th ``on_message`` (paho acks each as it returns), its process CPU seconds per message;
- ``gatewayd``: msgs/s from the first PUBLISH until /status says ``count`` more messages were acked
  (the ingest acks a message only once its record is durable: docs/gateway.md), polled every 0.2 s
  and the moment interpolated between the last two polls;
  its CPU seconds per message (process user+system time over the run) and its peak RSS (VmHWM).

Ratios: ``vs_bare_paho`` = median gatewayd msgs/s over median bare paho msgs/s (target >= 0.7);
``cpu_per_msg_vs_paho`` = median gatewayd CPU per message over median paho CPU per message: lower is
better, the issue's figure as named (target <= 1.6). Per-repetition ratios are in the rows (min/max).

    python -m bench.ingest [--quick]   -> bench/results/ingest.json
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench._common import Results, parse_args
from tests.harness.broker import Broker, start_broker
from tests.harness.gatewayd import Gatewayd
from tests.harness.processes import REPO, free_port, repo_env

POLL_S = 0.2  # a /status costs gatewayd about 2 ms of CPU: polled at 5 Hz, about 1% of its CPU
CLIENTS = [sys.executable, "-m", "bench._ingest_clients"]


@dataclass
class Run:
    msgs_per_s: float
    cpu_s_per_msg: float
    publisher_msgs_per_s: float
    peak_rss_mib: float = 0.0


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _start_publisher(broker: Broker, gateway_id: str, count: int) -> subprocess.Popen:
    argv = [*CLIENTS, "publish", "--port", str(broker.port), "--gateway", gateway_id, "--count", str(count)]
    return subprocess.Popen(argv, cwd=REPO, env=repo_env(), stdout=subprocess.PIPE, text=True)


def _publisher_result(proc: subprocess.Popen, count: int) -> dict[str, float]:
    out, _ = proc.communicate(timeout=600)
    result = json.loads(out.strip().splitlines()[-1])
    if result["acked"] != count:
        raise RuntimeError(f"publisher: {result['acked']} of {count} PUBACKs")
    return result


def _publisher_rate(result: dict[str, float]) -> float:
    return result["acked"] / (result["t_end"] - result["t_start"])


def publisher_alone(broker: Broker, count: int) -> float:
    return _publisher_rate(_publisher_result(_start_publisher(broker, "gw-nobody", count), count))


def bare_paho(broker: Broker, rep: int, count: int) -> Run:
    gateway_id = f"gw-paho-{rep}"
    argv = [*CLIENTS, "subscribe", "--port", str(broker.port), "--gateway", gateway_id, "--count", str(count)]
    argv += ["--client-id", f"bench-paho-{rep}"]
    sub = subprocess.Popen(
        argv, cwd=REPO, env=repo_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert sub.stdout is not None and sub.stdin is not None
        if json.loads(sub.stdout.readline()) != {"ready": True}:
            raise RuntimeError("bare paho subscriber did not subscribe")
        process = psutil.Process(sub.pid)
        cpu0 = _cpu_s(process)
        published = _publisher_result(_start_publisher(broker, gateway_id, count), count)
        done = json.loads(sub.stdout.readline())
        cpu = _cpu_s(process) - cpu0
        sub.stdin.close()
        sub.wait(10)
    finally:
        sub.kill()
        sub.wait()
    return Run(count / (done["t_last"] - published["t_start"]), cpu / count, _publisher_rate(published))


def gatewayd(broker: Broker, base: Path, rep: int, count: int) -> Run:
    gateway_id = f"gw-ingest-{rep}"
    directory = base / gateway_id
    directory.mkdir()
    http_port = free_port()
    config = directory / "gatewayd.toml"
    config.write_text(  # what a user writes; nothing listens at the cloud_url: sensor ingest alone
        f'gateway_id = "{gateway_id}"\ndata_dir = "data"\n[mqtt]\nbroker = "{broker.url}"\n'
        f'[http]\nlisten = "127.0.0.1:{http_port}"\n[uplink]\ncloud_url = "http://127.0.0.1:9"\ntoken = "t"\n'
    )
    daemon = Gatewayd(config, http_port)
    try:
        daemon.wait_ready(timeout_s=60)
        daemon.wait_status(lambda s: "ingest" in s, 20, "gatewayd's ingest running")
        time.sleep(1.0)  # its subscription made at the broker (sent on connect, SUBACK not exposed)
        process = psutil.Process(daemon.proc.pid)
        acked0 = daemon.status()["ingest"]["acked"]
        cpu0 = _cpu_s(process)
        publisher = _start_publisher(broker, gateway_id, count)
        before = (time.time(), 0)
        while True:
            time.sleep(POLL_S)
            status = daemon.status()
            now = (time.time(), status["ingest"]["acked"] - acked0)
            if now[1] >= count:  # when the count-th ack went out, between the last two polls
                t_done = before[0] + (now[0] - before[0]) * (count - before[1]) / (now[1] - before[1])
                break
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"gatewayd exited: {daemon.output()[-2000:]}")
            before = now
        cpu = _cpu_s(process) - cpu0
        rss = _peak_rss_mib(daemon.proc.pid)
        published = _publisher_result(publisher, count)
        ingest = status["ingest"]
        if ingest["accepted"] < count or any(ingest["rejected_by_reason"].values()):
            raise RuntimeError(f"gatewayd did not log every message: {ingest}")
        daemon.terminate(30)
    finally:
        daemon.kill()
    return Run(count / (t_done - published["t_start"]), cpu / count, _publisher_rate(published), rss)


def _add_runs(results: Results, case: str, system: str, runs: list[Run]) -> None:
    for metric in ("msgs_per_s", "cpu_s_per_msg", "publisher_msgs_per_s"):
        values = [getattr(run, metric) for run in runs]
        results.add(case, system, metric, statistics.median(values))
        results.add(case, system, f"{metric}_min", min(values))
        results.add(case, system, f"{metric}_max", max(values))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    results = Results("ingest", args.quick)
    count, reps = (12_000, 4) if args.quick else (50_000, 7)
    base = Path(tempfile.mkdtemp(prefix="ingest-bench-", dir=os.environ.get("BENCH_DIR")))
    broker = start_broker(base / "broker")
    try:
        case = f"{count} msgs QoS 1, devicesim telemetry, {reps} alternating reps"
        results.add(case, "publisher alone", "msgs_per_s", publisher_alone(broker, count))
        paho_runs, gatewayd_runs = [], []
        for rep in range(reps):
            paho_runs.append(bare_paho(broker, rep, count))
            gatewayd_runs.append(gatewayd(broker, base, rep, count))
            print(f"rep {rep}: paho {paho_runs[-1]}, gatewayd {gatewayd_runs[-1]}", flush=True)
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)
    _add_runs(results, case, "bare paho", paho_runs)
    _add_runs(results, case, "gatewayd", gatewayd_runs)
    results.add(case, "gatewayd", "peak_rss_mib", max(run.peak_rss_mib for run in gatewayd_runs))
    pair_rates = [g.msgs_per_s / p.msgs_per_s for g, p in zip(gatewayd_runs, paho_runs, strict=True)]
    pair_cpu = [g.cpu_s_per_msg / p.cpu_s_per_msg for g, p in zip(gatewayd_runs, paho_runs, strict=True)]
    results.add(case, "gatewayd / bare paho", "rate_pair_ratio_min", min(pair_rates))
    results.add(case, "gatewayd / bare paho", "rate_pair_ratio_max", max(pair_rates))
    results.add(case, "gatewayd / bare paho", "cpu_pair_ratio_min", min(pair_cpu))
    results.add(case, "gatewayd / bare paho", "cpu_pair_ratio_max", max(pair_cpu))
    median = statistics.median
    results.ratio(
        "vs_bare_paho", median(r.msgs_per_s for r in gatewayd_runs), median(r.msgs_per_s for r in paho_runs)
    )
    results.ratio(  # lower is better (the docstring says so): CPU per message, ours over paho's
        "cpu_per_msg_vs_paho",
        median(r.cpu_s_per_msg for r in gatewayd_runs),
        median(r.cpu_s_per_msg for r in paho_runs),
    )
    results.extra["targets"] = {"vs_bare_paho": ">= 0.7", "cpu_per_msg_vs_paho": "<= 1.6"}
    results.extra["gatewayd_peak_rss_mib"] = max(run.peak_rss_mib for run in gatewayd_runs)
    results.write()


if __name__ == "__main__":
    main()
