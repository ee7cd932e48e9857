"""Job traces: the replay file format and a Philly-like generator.

The format is JSON Lines, one job per line (docs/scheduler.md, "Traces")::

    {"job_id": "j0001", "submit_s": 12.5, "devices": 4, "total_steps": 3000,
     "throughput": {"k80": 1.0, "v100": 2.4}, "user": "u3", "kind": "resnet50"}

``throughput`` is steps per second at the job's full demand on each generation; ``user`` and
``kind`` are optional. Lines starting with ``#`` and blank lines are skipped.

The generator (``philly_like``) follows the published shape of Microsoft's Philly trace (Jeon et
al., ATC'19) as Gavel's generator draws it: Poisson arrivals, device counts 1/2/4/8 with
probabilities 0.70/0.10/0.15/0.05, heavy-tailed run times (lognormal, median ``median_s``,
``sigma``; capped at ``max_s``), and a job kind per job whose speedup on the newer generation is
that kind's (1.2x to 3x, ``KINDS``). The arrival rate is set from ``load``: the device-time
offered per second over the cluster's devices, a job's device-time being its run time on a device
of the cluster's mix (``new_fraction`` of the devices of the new generation).

Invariant: ``load(save(t)) == t`` for every trace ``t``; a bad line raises ``TraceError`` naming
its line and field.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEVICE_COUNTS = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
# kind -> (steps/s on the old generation, speedup on the new): a model zoo's spread, 1.2x to 3x.
KINDS: dict[str, tuple[float, float]] = {
    "lstm": (4.0, 1.2),
    "transformer": (3.0, 1.6),
    "resnet18": (6.0, 2.0),
    "recommendation": (8.0, 2.5),
    "resnet50": (2.0, 3.0),
}


class TraceError(ValueError):
    """A trace line that cannot be a job; the message names the line and the field."""


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit_s: float
    devices: int
    total_steps: int
    throughput: dict[str, float] = field(default_factory=dict)
    user: str = "default"
    kind: str = ""


def _parse(line_no: int, raw: str) -> TraceJob:
    def fail(field_name: str, why: str) -> TraceError:
        return TraceError(f"trace line {line_no}: {field_name}: {why}")

    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise fail("(line)", f"not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise fail("(line)", "not a JSON object")
    unknown = set(row) - {f for f in TraceJob.__dataclass_fields__}
    if unknown:
        raise fail(sorted(unknown)[0], "unknown field")
    for name, kind in (("job_id", str), ("submit_s", (int, float)), ("devices", int), ("total_steps", int)):
        if name not in row:
            raise fail(name, "missing")
        if not isinstance(row[name], kind) or isinstance(row[name], bool):
            raise fail(name, f"wrong type {type(row[name]).__name__}")
    if not row["job_id"]:
        raise fail("job_id", "empty")
    if not (math.isfinite(row["submit_s"]) and row["submit_s"] >= 0):
        raise fail("submit_s", f"{row['submit_s']} must be a finite number >= 0")
    if row["devices"] < 1 or row["total_steps"] < 1:
        raise fail("devices" if row["devices"] < 1 else "total_steps", "must be >= 1")
    throughput = row.get("throughput", {})
    if not isinstance(throughput, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in throughput.values()
    ):
        raise fail("throughput", "must map generation names to steps/s > 0")
    for name in ("user", "kind"):
        if not isinstance(row.get(name, ""), str):
            raise fail(name, "must be a string")
    return TraceJob(**{**row, "throughput": {str(k): float(v) for k, v in throughput.items()}})


def parse(lines: Iterable[str]) -> list[TraceJob]:
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for line_no, raw in enumerate(lines, 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        job = _parse(line_no, raw)
        if job.job_id in seen:
            raise TraceError(f"trace line {line_no}: job_id: duplicate {job.job_id!r}")
        seen.add(job.job_id)
        jobs.append(job)
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def load(path: str | Path) -> list[TraceJob]:
    with open(path, encoding="utf-8") as f:
        return parse(f)


def dumps(jobs: Sequence[TraceJob]) -> str:
    return "".join(json.dumps(asdict(j), sort_keys=True) + "\n" for j in jobs)


def save(jobs: Sequence[TraceJob], path: str | Path) -> None:
    Path(path).write_text(dumps(jobs), encoding="utf-8")


def _draw(rng: random.Random, table: Sequence[tuple[int, float]]) -> int:
    pick, total = rng.random(), 0.0
    for value, p in table:
        total += p
        if pick < total:
            return value
    return table[-1][0]


def philly_like(
    n_jobs: int,
    capacity: int,
    seed: int = 0,
    load: float = 0.9,
    old: str = "old",
    new: str = "new",
    median_s: float = 1800.0,
    sigma: float = 1.6,
    max_s: float = 2 * 86400.0,
    users: int = 8,
    new_fraction: float = 0.5,
) -> list[TraceJob]:
    """``n_jobs`` jobs (run time drawn for the ``old`` generation) arriving at the rate that offers
    ``load`` x ``capacity`` devices of work on the cluster's mix; same seed, same trace."""
    if n_jobs < 1 or capacity < 1 or not load > 0 or not 0 <= new_fraction <= 1:
        raise ValueError(
            f"philly_like: n_jobs {n_jobs}, capacity {capacity}, load {load} must be positive, "
            f"new_fraction {new_fraction} in [0, 1]"
        )
    rng = random.Random(seed)
    kinds = sorted(KINDS)
    drawn = []
    for _ in range(n_jobs):
        devices = _draw(rng, DEVICE_COUNTS)
        run_s = min(max_s, max(60.0, rng.lognormvariate(math.log(median_s), sigma)))
        drawn.append((devices, run_s, rng.choice(kinds), rng.randrange(users)))

    def mixed(run_s: float, kind: str) -> float:  # run time on a device of the cluster's mix
        return run_s * ((1 - new_fraction) + new_fraction / KINDS[kind][1])

    mean_work = sum(d * mixed(s, k) for d, s, k, _ in drawn) / n_jobs  # device-seconds per job
    rate = load * capacity / mean_work  # jobs per second
    jobs, t = [], 0.0
    for i, (devices, run_s, kind, user) in enumerate(drawn):
        t += rng.expovariate(rate)
        base, speedup = KINDS[kind]
        steps = max(1, round(run_s * base))
        throughput = {old: base, new: round(base * speedup, 6)}
        jobs.append(TraceJob(f"j{i:05d}", round(t, 3), devices, steps, throughput, f"u{user}", kind))
    return jobs
