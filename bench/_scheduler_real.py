"""The real-mode scheduler experiment of issue 24, measured on a real cloudd: three digits jobs of 2
processes each (one long, two short, submitted at once, long first) on one node of 2 devices, under
LAS and under FIFO. ``measure_real`` returns, per policy and job: submit, first start and end times,
each run's launch, first step, preemption or end (with the steps it covered), the measured steps/s,
and the JCTs; ``bench/scheduler.py`` (schedsim) replays the same three jobs in the simulator and
reports ``sim_vs_real_jct_error`` against these figures.

What a run costs besides its steps is reported too: ``startup_s`` per run (launch to first step:
torchrun, imports, the plan, the resume) and ``tail_s`` per job (last step to the job's end:
export, the quality gate, the registry). Both are large next to the steps of these tiny jobs on
2 shared cores, so a simulator that counts only steps / throughput will not match.

    python -m bench._scheduler_real [--quick]   -> bench/results/scheduler_real.json

Not under a minute even with ``--quick`` (fewer steps of the long job): six torchrun jobs and their
restarts each take tens of seconds to start on 2 loaded cores.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._common import Results, parse_args
from tests.harness.cloud_http import call
from tests.harness.cloudd import OPERATOR_TOKEN, Cloudd, start_cloudd

NODES = "local:2:cpu"
NODES_RECORD = [{"name": "local", "devices": 2, "generation": "cpu"}]
MIN_RUN_S, ROUND_INTERVAL_S = 2.0, 1.0
BATCH, MICROBATCHES = 32, 2
FINAL = ("succeeded", "failed", "cancelled")


def job_steps(quick: bool) -> dict[str, int]:
    """The three jobs, in submission order: name -> steps."""
    return {"long": 600 if quick else 1500, "short-a": 10, "short-b": 10}


def job_spec(steps: int) -> dict[str, Any]:
    epochs = -(-steps // 44)  # 1437 training rows of digits / 32 per step: 44 steps an epoch
    return {
        "model": "digits_cnn",
        "nproc": 2,
        "stages": 2,
        "batch_size": BATCH,
        "microbatches": MICROBATCHES,
        "epochs": epochs,
        "max_steps": steps,
    }


def _manager_events(server: Cloudd, job_id: str) -> list[dict[str, Any]]:
    """The job's whole event stream (``/v1/jobs/<id>/events`` of an ended job ends by itself)."""
    request = urllib.request.Request(f"{server.url}/v1/jobs/{job_id}/events")
    request.add_header("Authorization", f"Bearer {OPERATOR_TOKEN}")
    events = []
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: {}":
                events.append(json.loads(line[len("data: ") :]))
    return events


def _runs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per launch: its times and the steps it trained."""
    runs: list[dict[str, Any]] = []
    for e in events:
        kind = e.get("event")
        if kind == "state" and e["state"] == "running":
            runs.append({"launch": e["time"], "first_step": None, "from_step": 0, "to_step": 0})
        elif not runs:
            continue
        elif kind == "resume":
            runs[-1]["from_step"] = e["from_step"]
        elif kind == "step":
            runs[-1]["first_step"] = runs[-1]["first_step"] or e["time"]
            runs[-1]["to_step"] = e["step"]
        elif kind == "state":
            runs[-1].update(end=e["time"], outcome=e["state"])
    for run in runs:
        run["startup_s"] = run["first_step"] - run["launch"] if run["first_step"] else None
    return runs


def _job_record(server: Cloudd, name: str, job: dict[str, Any], steps: int) -> dict[str, Any]:
    events = _manager_events(server, job["id"])
    runs = _runs(events)
    last_step = max((e["time"] for e in events if e.get("event") == "step"), default=None)
    return {
        "name": name,
        "id": job["id"],
        "state": job["state"],
        "devices": job["spec"]["nproc"],
        "steps": steps,
        "submit": job["created_ts"],
        "start": job["started_ts"],
        "end": job["finished_ts"],
        "jct_s": job["finished_ts"] - job["created_ts"],
        "preemptions": job["schedule"]["preemptions"],
        "preempted_at": [r["end"] for r in runs if r.get("outcome") == "preempted"],
        "runs": runs,
        "steps_per_s": job["schedule"]["throughput"],
        "attained_service_s": job["schedule"]["attained_service_s"],
        "tail_s": job["finished_ts"] - last_step if last_step else None,
    }


def run_policy(policy: str, quick: bool, base: Path) -> dict[str, Any]:
    """The three jobs on a fresh cloudd under ``policy``; every job's record."""
    args = ["--nodes", NODES, "--scheduler-policy", policy, "--scheduler-min-run", str(MIN_RUN_S)]
    args += ["--scheduler-round-interval", str(ROUND_INTERVAL_S)]
    server = start_cloudd(base / policy, extra_args=args)
    try:
        steps = job_steps(quick)
        ids = {}
        for name, n in steps.items():
            status, job = call(f"{server.url}/v1/jobs", OPERATOR_TOKEN, "POST", job_spec(n))
            if status != 201:
                raise RuntimeError(f"{policy}: submitting {name}: {status} {job}")
            ids[name] = job["id"]
        deadline = time.monotonic() + 1800
        while True:
            jobs = {j["id"]: j for j in call(f"{server.url}/v1/jobs", OPERATOR_TOKEN)[1]["jobs"]}
            if all(jobs[i]["state"] in FINAL for i in ids.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{policy}: jobs still running after 30 minutes")
            time.sleep(1.0)
        records = [_job_record(server, name, jobs[ids[name]], steps[name]) for name in steps]
    finally:
        server.stop()
    failed = [r["name"] for r in records if r["state"] != "succeeded"]
    if failed:
        raise RuntimeError(f"{policy}: jobs {failed} did not succeed (see {base / policy}/cloudd.log)")
    jcts = [r["jct_s"] for r in records]
    return {
        "jobs": records,
        "avg_jct_s": statistics.fmean(jcts),
        "makespan_s": max(r["end"] for r in records) - min(r["submit"] for r in records),
    }


def _replay_run(policy: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """One policy's outcome in the record ``bench/_scheduler_replay.py`` (schedsim) replays."""
    startups = [r["startup_s"] for j in outcome["jobs"] for r in j["runs"] if r["startup_s"]]
    tails = [j["tail_s"] for j in outcome["jobs"] if j["tail_s"] is not None]
    return {
        "policy": policy,
        "nodes": NODES_RECORD,
        "round_s": ROUND_INTERVAL_S,
        "start_overhead_s": statistics.fmean(startups),
        "min_run_s": MIN_RUN_S,
        "tail_s": statistics.fmean(tails) if tails else None,  # export + gate after the last step
        "jobs": [
            {
                "job_id": j["name"],
                "devices": j["devices"],
                "submit_s": j["submit"],
                "total_steps": j["steps"],
                "steps_per_s": j["steps_per_s"]["cpu"],
                "start_s": j["start"],
                "end_s": j["end"],
                "preemptions": j["preemptions"],
            }
            for j in outcome["jobs"]
        ],
    }


def measure_real(quick: bool) -> dict[str, Any]:
    """The experiment under LAS and FIFO on real cloudds (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="scheduler-real-") as tmp:
        by_policy = {policy: run_policy(policy, quick, Path(tmp)) for policy in ("las", "fifo")}
    return record(by_policy)


def record(by_policy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The experiment's record from each policy's outcome: the setting, ``startup_s_mean`` over
    every run, ``policies`` (every figure) and ``runs`` (one replay record per policy)."""
    startups = [
        r["startup_s"] for o in by_policy.values() for j in o["jobs"] for r in j["runs"] if r["startup_s"]
    ]
    return {
        "nodes": NODES_RECORD,
        "min_run_s": MIN_RUN_S,
        "round_interval_s": ROUND_INTERVAL_S,
        "startup_s_mean": statistics.fmean(startups),
        "policies": by_policy,
        "runs": [_replay_run(policy, outcome) for policy, outcome in by_policy.items()],
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args("Real-mode scheduler experiment (issue 24): 3 torchrun jobs, LAS and FIFO.", argv)
    measured = measure_real(args.quick)
    results = Results("scheduler_real", args.quick, extra=measured)  # what bench/_scheduler_replay.py reads
    for policy, outcome in measured["policies"].items():
        for job in outcome["jobs"]:
            results.add(job["name"], policy, "jct_s", job["jct_s"])
            results.add(job["name"], policy, "preemptions", job["preemptions"])
        results.add("all", policy, "avg_jct_s", outcome["avg_jct_s"])
        results.add("all", policy, "makespan_s", outcome["makespan_s"])
    for run in measured["runs"]:
        results.add("all", run["policy"], "start_overhead_s", run["start_overhead_s"])
    las, fifo = (measured["policies"][p]["avg_jct_s"] for p in ("las", "fifo"))
    results.ratio("las_vs_fifo_avg_jct_real", fifo, las)  # a time: baseline / ours
    results.write()


if __name__ == "__main__":
    main()
