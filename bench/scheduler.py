"""The cluster scheduler (cloud/scheduler) in its simulator: five policies on one Philly-like trace.

A generated heavy-tailed trace (``cloud.scheduler.trace.philly_like``: Poisson arrivals,
lognormal run times, 1/2/4/8 devices, speedups 1.2-3x on the new generation) runs on a simulated
64-device cluster, 4 nodes x 8 devices of each of two generations ("old", "new"), with rounds
every 300 s and at every arrival and completion, 30 s of restart overhead per (re)start, and
consolidated placement. The offered load (``LOAD``: device-time per second over the devices, on
the cluster's mix of generations) is set above 1 so that queueing matters; the table shows the
measured utilisation while jobs arrive.

Ratios (each baseline measured in the same run; JCT inverted so that higher is better):
    las_vs_fifo_avg_jct         FIFO avg JCT / LAS avg JCT              (target >= 2)
    hetero_vs_tiresias_avg_jct  Tiresias avg JCT / hetero avg JCT       (target >= 1.2)
    hetero_vs_las_avg_jct       LAS / hetero: the heterogeneity awareness alone (same LAS order)
    sim_vs_real_jct_error       mean |JCT_sim - JCT_real| / JCT_real over the real-mode jobs
                                replayed in the simulator (an error: LOWER is better, target <= 0.25),
                                with the per-run costs real mode measured (bench/_scheduler_replay.py);
                                absent, with the reason printed, when no real-mode record exists
    sim_vs_real_jct_error_steps_only  the same with steps / throughput only (no startup, no tail)
    sim_vs_real_jct_error_own_costs   the same with each policy's own measured costs

The real-mode record comes from ``bench._scheduler_real.measure_real`` (minutes); ``--quick``
reads the one ``python -m bench._scheduler_real`` last wrote to bench/results/scheduler_real.json
when it exists.

    python -m bench.scheduler [--quick] [--seed N]   -> bench/results/scheduler.json
"""

from __future__ import annotations

import importlib
import json
import math
import time
from typing import Any

from bench._common import RESULTS, Results, parser
from bench._scheduler_replay import compare
from cloud.scheduler.cluster import Node
from cloud.scheduler.outcomes import summarize
from cloud.scheduler.round import Scheduler
from cloud.scheduler.sim import SimConfig, simulate
from cloud.scheduler.trace import philly_like

POLICIES = ("fifo", "las", "srtf", "tiresias", "hetero")
NODES = [Node(f"old{i}", 8, "old") for i in range(4)] + [Node(f"new{i}", 8, "new") for i in range(4)]
LOAD = 1.5
CONFIG = SimConfig(round_s=300.0, restart_overhead_s=30.0)
METRICS = (
    ("avg_jct_s", "avg JCT s"),
    ("p95_jct_s", "p95 JCT s"),
    ("makespan_s", "makespan s"),
    ("utilisation_while_arriving", "util (arriving)"),
    ("utilisation", "util (makespan)"),
    ("avg_queueing_s", "queueing s"),
    ("avg_waiting_s", "waiting s"),
    ("avg_ftf_rho", "FTF rho avg"),
    ("max_ftf_rho", "FTF rho max"),
    ("preemptions", "preemptions"),
)


def real_record(quick: bool) -> tuple[dict[str, Any] | None, str]:
    """The real-mode record and where it came from (or why there is none). Real mode takes minutes
    (six torchrun jobs and their restarts), so ``--quick`` reads the record its last run wrote
    (``python -m bench._scheduler_real``) when there is one; otherwise it is measured now."""
    path = RESULTS / "scheduler_real.json"
    if quick and path.exists():
        return json.loads(path.read_text()), str(path)
    try:
        module = importlib.import_module("bench._scheduler_real")
    except ModuleNotFoundError:
        if path.exists():
            return json.loads(path.read_text()), str(path)
        return (
            None,
            "no bench/_scheduler_real.py and no bench/results/scheduler_real.json (real mode not wired yet)",
        )
    print("measuring real mode (bench._scheduler_real.measure_real): minutes")
    return module.measure_real(quick), "bench._scheduler_real.measure_real"


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--seed", type=int, default=1, help="trace seed")
    args = cli.parse_args()
    results = Results("scheduler", args.quick)
    n_jobs = 500 if args.quick else 2000
    capacity = sum(n.devices for n in NODES)
    trace = philly_like(n_jobs, capacity, seed=args.seed, load=LOAD)
    case = f"{n_jobs} jobs, {capacity} devices old+new, load {LOAD:g}, seed {args.seed}"
    reports: dict[str, dict[str, float]] = {}
    for policy in POLICIES:
        began = time.perf_counter()
        reports[policy] = summarize(simulate(NODES, trace, Scheduler.from_names(policy=policy), CONFIG))
        reports[policy]["sim_wall_s"] = time.perf_counter() - began
        for key, _ in METRICS:
            results.add(case, policy, key, reports[policy][key])
    print(case)
    print("policy    " + "".join(f"{label:>16}" for _, label in METRICS))
    for policy, report in reports.items():
        print(f"{policy:<10}" + "".join(f"{report[key]:>16.2f}" for key, _ in METRICS))

    avg = {p: r["avg_jct_s"] for p, r in reports.items()}
    results.ratio("las_vs_fifo_avg_jct", avg["fifo"], avg["las"])
    results.ratio("hetero_vs_tiresias_avg_jct", avg["tiresias"], avg["hetero"])
    results.ratio("hetero_vs_las_avg_jct", avg["las"], avg["hetero"])

    record, source = real_record(args.quick)
    if record is None:
        print(f"sim_vs_real_jct_error: missing: {source}")
        results.extra["sim_vs_real"] = {"missing": source}
    else:
        errors, rows = compare(record)
        results.ratios.update(errors)
        results.extra["sim_vs_real"] = {"source": source, "jobs": rows}
        print("real mode replayed, JCT s: policy job | real | simulated | steps only | own policy's costs")
        for row in rows:
            figures = (
                float(row[k]) for k in ("real_jct_s", "sim_jct_s", "steps_only_jct_s", "own_costs_jct_s")
            )
            print(f"  {row['policy']:<6} {row['job']:<10}" + "".join(f"{v:10.1f}" for v in figures))
    results.extra["trace"] = {"jobs": n_jobs, "load": LOAD, "seed": args.seed, "round_s": CONFIG.round_s}
    results.extra["sim_wall_s"] = {p: round(r["sim_wall_s"], 2) for p, r in reports.items()}
    for name, value in results.ratios.items():
        target = {"las_vs_fifo_avg_jct": ">= 2", "hetero_vs_tiresias_avg_jct": ">= 1.2"}.get(name, "")
        if name.startswith("sim_vs_real"):
            target = "<= 0.25 (an error: lower is better)"
        print(f"{name}: {value:.3f}" + (f"  target {target}" if target and not math.isnan(value) else ""))
    results.write(table=False)


if __name__ == "__main__":
    main()
