"""Replay in the simulator what cloudd's real mode measured, and compare job completion times.

The real-mode record (``bench/_scheduler_real.py``'s ``measure_real(quick)``, or the JSON it writes
at ``bench/results/scheduler_real.json``) is one run or ``{"runs": [run, ...]}``, a run being::

    {"policy": "las",                                  # the policy real mode ran
     "nodes": [{"name": "local", "devices": 2, "generation": "cpu"}],   # optional: this default
     "round_s": 5.0,                                   # optional: the JobManager's tick (default 5)
     "start_overhead_s": 4.0,                          # optional: launch-to-first-step cost of a
                                                       #   (re)start, as measured (default 5)
     "jobs": [{"job_id": "long", "devices": 2, "submit_s": 0.0, "total_steps": 200,
               "steps_per_s": 9.5, "start_s": 0.4, "end_s": 31.0}, ...]}

Times are seconds on one clock (any origin). ``steps_per_s`` is the job's measured throughput at
its demand (the trainer's progress events); the simulator runs the same jobs with it, under the
same policy, and predicts each JCT (end - submit).

Invariant: the error is the mean over jobs of |JCT_sim - JCT_real| / JCT_real, every job of every
run counted once; a record missing a field raises ``ValueError`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cloud.scheduler.cluster import Node
from cloud.scheduler.round import Scheduler
from cloud.scheduler.sim import SimConfig, simulate
from cloud.scheduler.trace import TraceJob

DEFAULT_NODES = ({"name": "local", "devices": 2, "generation": "cpu"},)
DEFAULT_ROUND_S = 5.0
DEFAULT_START_OVERHEAD_S = 5.0


def _field(where: str, record: Mapping[str, Any], name: str) -> Any:
    if name not in record:
        raise ValueError(f"scheduler_real {where}: {name}: missing")
    return record[name]


def replay_run(run: Mapping[str, Any], index: int = 0) -> list[dict[str, float | str]]:
    """Per job: real and simulated JCT of one real-mode run."""
    where = f"run {index}"
    policy = str(_field(where, run, "policy"))
    nodes = [
        Node(str(n["name"]), int(n["devices"]), str(n["generation"])) for n in run.get("nodes", DEFAULT_NODES)
    ]
    jobs = _field(where, run, "jobs")
    origin = min(float(_field(f"{where} job", j, "submit_s")) for j in jobs)
    trace = []
    for j in jobs:
        at = f"{where} job {j.get('job_id', '?')}"
        trace.append(
            TraceJob(
                str(_field(at, j, "job_id")),
                float(j["submit_s"]) - origin,
                int(_field(at, j, "devices")),
                int(_field(at, j, "total_steps")),
                {n.generation: float(_field(at, j, "steps_per_s")) for n in nodes},
            )
        )
    config = SimConfig(
        round_s=float(run.get("round_s", DEFAULT_ROUND_S)),
        restart_overhead_s=float(run.get("start_overhead_s", DEFAULT_START_OVERHEAD_S)),
    )
    record = simulate(nodes, trace, Scheduler.from_names(policy=policy), config)
    simulated = {j.job_id: (j.finished_at or 0.0) - j.submitted_at for j in record.jobs}
    rows: list[dict[str, float | str]] = []
    for j in jobs:
        at = f"{where} job {j['job_id']}"
        real = float(_field(at, j, "end_s")) - float(j["submit_s"])
        rows.append(
            {
                "policy": policy,
                "job_id": str(j["job_id"]),
                "real_jct_s": real,
                "sim_jct_s": simulated[str(j["job_id"])],
            }
        )
    return rows


def compare(real: Mapping[str, Any]) -> tuple[float, list[dict[str, float | str]]]:
    """(mean relative JCT error, per-job rows) over every run of the record."""
    runs = real.get("runs", [real])
    rows = [row for index, run in enumerate(runs) for row in replay_run(run, index)]
    if not rows:
        raise ValueError("scheduler_real: jobs: no jobs in the record")
    errors = [abs(float(r["sim_jct_s"]) - float(r["real_jct_s"])) / float(r["real_jct_s"]) for r in rows]
    return sum(errors) / len(errors), rows
