"""Replay in the simulator what cloudd's real mode measured, and compare job completion times.

The record is what ``bench/_scheduler_real.py``'s ``measure_real(quick)`` returns (or the JSON it
writes at ``bench/results/scheduler_real.json``, which holds it under ``"real"``)::

    {"nodes": [{"name": "local", "devices": 2, "generation": "cpu"}],
     "min_run_s": 2.0, "round_interval_s": 1.0, "startup_s_mean": 9.1,
     "policies": {"las": {"jobs": [{"name": "long", "devices": 2, "steps": 600, "submit": ..., "end": ...,
                                    "steps_per_s": {"cpu": 7.9}, "tail_s": 3.2,
                                    "runs": [{"startup_s": 8.7, ...}, ...], ...}, ...]},
                  "fifo": {...}}}

Each policy's jobs run in the simulator under that policy on those nodes, with the submission
times, steps and measured steps/s of the real jobs, rounds every ``round_interval_s`` and at each
event, and cloudd's lease term ``min_run_s``. Three predictions per job:

- ``sim_jct_s``: with the per-run costs real mode measured besides the steps, one figure each for
  every job: ``startup_s_mean`` (launch to first step) as the restart overhead, and the mean
  ``tail_s`` (last step to the job's end: export, gate, registry) as the finishing tail;
- ``steps_only_jct_s``: without them (steps / throughput, as a trace simulator usually assumes);
- ``own_costs_jct_s``: with each policy's own measured costs (the mean startup of that policy's
  runs and the mean tail of its jobs): the machine's load differs from one policy's run to the
  next, so this isolates how well the simulator follows the scheduling itself.

Invariant: an error is the mean over every job of every policy of |JCT_sim - JCT_real| / JCT_real;
a record missing a field raises ``ValueError`` naming it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from cloud.scheduler.cluster import Node
from cloud.scheduler.round import Scheduler
from cloud.scheduler.sim import SimConfig, simulate
from cloud.scheduler.trace import TraceJob


def _field(where: str, record: Mapping[str, Any], name: str) -> Any:
    if name not in record or record[name] is None:
        raise ValueError(f"scheduler_real {where}: {name}: missing")
    return record[name]


def _throughput(where: str, job: Mapping[str, Any], generation: str) -> dict[str, float]:
    rate = _field(where, job, "steps_per_s")
    if isinstance(rate, Mapping):
        if not rate:
            raise ValueError(f"scheduler_real {where}: steps_per_s: empty")
        return {str(g): float(r) for g, r in rate.items()}
    return {generation: float(rate)}


def simulate_policy(
    policy: str, jobs: list[Mapping[str, Any]], nodes: list[Node], config: SimConfig
) -> dict[str, float]:
    """Job name -> simulated JCT of the real jobs under ``policy``."""
    origin = min(float(_field(f"{policy} job", j, "submit")) for j in jobs)
    trace = []
    for j in jobs:
        where = f"{policy} job {j.get('name', '?')}"
        trace.append(
            TraceJob(
                str(_field(where, j, "name")),
                float(j["submit"]) - origin,
                int(_field(where, j, "devices")),
                int(_field(where, j, "steps")),
                _throughput(where, j, nodes[0].generation),
            )
        )
    record = simulate(nodes, trace, Scheduler.from_names(policy=policy), config)
    return {job.job_id: (job.finished_at or 0.0) - job.submitted_at for job in record.jobs}


def _costs(jobs: list[Mapping[str, Any]]) -> tuple[float, float]:
    """(mean launch-to-first-step over the jobs' runs, mean last-step-to-end over the jobs)."""
    startups = [
        float(r["startup_s"]) for j in jobs for r in j.get("runs", ()) if r.get("startup_s") is not None
    ]
    tails = [float(j["tail_s"]) for j in jobs if j.get("tail_s") is not None]
    return (statistics.fmean(startups) if startups else 0.0, statistics.fmean(tails) if tails else 0.0)


def compare(real: Mapping[str, Any]) -> tuple[dict[str, float], list[dict[str, float | str]]]:
    """(the three errors by name, per-job rows)."""
    record = real.get("real", real)
    nodes = [
        Node(str(n["name"]), int(n["devices"]), str(n["generation"])) for n in _field("", record, "nodes")
    ]
    policies = {
        p: _field(f"policy {p}", outcome, "jobs") for p, outcome in _field("", record, "policies").items()
    }
    round_s, min_run_s = float(_field("", record, "round_interval_s")), float(record.get("min_run_s", 0.0))

    def config(startup_s: float, tail_s: float) -> SimConfig:
        return SimConfig(
            round_s=round_s, restart_overhead_s=startup_s, finish_overhead_s=tail_s, min_run_s=min_run_s
        )

    pooled = config(
        float(_field("", record, "startup_s_mean")), _costs([j for js in policies.values() for j in js])[1]
    )
    rows: list[dict[str, float | str]] = []
    for policy, jobs in policies.items():
        predictions = {
            "sim_jct_s": simulate_policy(policy, jobs, nodes, pooled),
            "steps_only_jct_s": simulate_policy(policy, jobs, nodes, config(0.0, 0.0)),
            "own_costs_jct_s": simulate_policy(policy, jobs, nodes, config(*_costs(jobs))),
        }
        for j in jobs:
            real_jct = float(_field(f"{policy} job {j['name']}", j, "end")) - float(j["submit"])
            row: dict[str, float | str] = {"policy": policy, "job": str(j["name"]), "real_jct_s": real_jct}
            rows.append(row | {key: jct[j["name"]] for key, jct in predictions.items()})
    if not rows:
        raise ValueError("scheduler_real policies: no jobs in the record")

    def error(key: str) -> float:
        return statistics.fmean(
            abs(float(r[key]) - float(r["real_jct_s"])) / float(r["real_jct_s"]) for r in rows
        )

    return {
        "sim_vs_real_jct_error": error("sim_jct_s"),
        "sim_vs_real_jct_error_steps_only": error("steps_only_jct_s"),
        "sim_vs_real_jct_error_own_costs": error("own_costs_jct_s"),
    }, rows
