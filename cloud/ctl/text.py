"""cloudctl's text: tables and progress lines from cloudd's JSON documents.

Invariant: pure functions (a document and the time in, text out); ``-`` stands for a missing value.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns, two spaces apart; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))
    ]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _when(ts: float | None, now: float) -> str | None:
    if ts is None:
        return None
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"{stamp} ({max(0, int(now - ts))}s ago)"


def _num(value: float | None, digits: int = 4) -> str | None:
    return None if value is None else f"{value:.{digits}g}"


def format_status(doc: dict[str, Any], now: float, jobs: dict[str, Any] | None = None) -> str:
    """Gateways, devices, totals; with ``jobs`` (GET /v1/jobs) also a progress bar per running or
    queued job and for the latest finished one."""
    gateways = format_table(
        ["GATEWAY", "LAST SEEN", "RECORDS", "BATCHES", "DUPLICATES"],
        [
            [g["id"], _when(g["last_seen"], now), g["records"], g["batches"], g["duplicates"]]
            for g in doc["gateways"]
        ],
    )
    devices = format_table(
        ["GATEWAY", "DEVICE", "RECORDS", "LAST TS"],
        [[d["gateway"], d["device"], d["records"], _when(d["last_ts"], now)] for d in doc["devices"]],
    )
    totals = doc["totals"]
    text = f"{gateways}\n\n{devices}\n\ntotal: {totals['records']} records in {totals['batches']} batches"
    return text + ("\n\n" + format_job_progress(jobs) if jobs is not None else "")


def format_job_progress(doc: dict[str, Any]) -> str:
    """``job-00003  running  scene_cnn  [####......] 2/6  loss 1.1`` per live job and the latest ended."""
    live = [j for j in doc["jobs"] if j["state"] in ("running", "queued", "preempted")]
    ended = [j for j in doc["jobs"] if j["state"] not in ("running", "queued", "preempted")][-1:]
    if not live and not ended:
        return "jobs: none"
    width = max(len(j["id"]) for j in ended + live)
    lines = []
    for job in ended + live:
        bar = progress_line(job.get("progress") or {})
        line = f"{job['id'].ljust(width)}  {job['state']:<9}  {job['spec']['model']}  {bar}"
        if job.get("model"):
            line += f"  -> {job['model']['name']}@{job['model']['version']}"
        lines.append(line)
    counts = doc.get("counts", {})
    return "\n".join(lines) + f"\njobs: {counts.get('running', 0)} running, {counts.get('queued', 0)} queued"


def format_jobs(doc: dict[str, Any]) -> str:
    rows = []
    for job in doc["jobs"]:
        p = job.get("progress") or {}
        steps = f"{p.get('step')}/{p.get('total_steps')}" if p.get("total_steps") else None
        model = f"{job['model']['name']}@{job['model']['version']}" if job.get("model") else None
        rows.append(
            [
                job["id"],
                job["state"],
                job["spec"]["model"],
                job["spec"]["nproc"],
                steps,
                _num(p.get("loss")),
                _num(p.get("accuracy"), 3),
                model,
                *_schedule_cells(job.get("schedule")),
                job.get("error"),
            ]
        )
    counts = doc.get("counts", {})
    header = ["JOB", "STATE", "MODEL", "NPROC", "STEPS", "LOSS", "ACCURACY", "VERSION", "QUEUE", "PREEMPTED"]
    return (
        format_table([*header, "SERVICE_S", "ERROR"], rows)
        + f"\n\n{counts.get('running', 0)} running, {counts.get('queued', 0)} queued"
        + f", {counts.get('preempted', 0)} preempted"
    )


def _schedule_cells(schedule: dict[str, Any] | None) -> list[Any]:
    """QUEUE (position among the waiting jobs, ``#0`` next), PREEMPTED (times), SERVICE_S
    (device-seconds attained)."""
    if not schedule:
        return [None, None, None]
    position = schedule.get("queue_position")
    return [
        None if position is None else f"#{position}",
        schedule.get("preemptions"),
        _num(schedule.get("attained_service_s"), 4),
    ]


def _lineage_text(lineage: dict[str, Any] | None) -> str:
    if not lineage:
        return "uploaded by hand"
    text = f"{lineage.get('job', '?')}: {lineage.get('dataset')}"
    for gateway, logs in (lineage.get("sources") or {}).items():
        runs = "; ".join(f"{log} " + ",".join(f"{a}-{b}" for a, b in r) for log, r in logs.items())
        text += f" {gateway}({runs})"
    return text


def _evaluation_text(evaluation: dict[str, Any] | None) -> str:
    if evaluation is None:
        return "-"
    value = "nan" if evaluation["value"] is None else f"{evaluation['value']:.3f}"
    base = evaluation.get("baseline")
    against = f" vs {base['version']} {base['value']:.3f}" if base else ""
    verdict = "ok" if evaluation["promotable"] else "REFUSED"
    return f"{evaluation['metric']} {value}{against} {verdict}"


def format_models(doc: dict[str, Any], now: float) -> str:
    rows = [
        [
            m["name"],
            m["version"],
            m["seq"],
            m.get("track", "central"),
            m.get("stage", "-"),
            _evaluation_text(m.get("evaluation")),
            _when(m["uploaded_ts"], now),
            "factory model" if m.get("factory") else _lineage_text(m.get("lineage")),
        ]
        for m in doc["models"]
    ]
    return format_table(
        ["MODEL", "VERSION", "SEQ", "TRACK", "STAGE", "EVALUATION", "STORED", "LINEAGE"], rows
    )


def format_datasets(doc: dict[str, Any], now: float) -> str:
    rows = [
        [g["id"], d["device"], d["records"], _when(d["last_ts"], now)]
        for g in doc["gateways"]
        for d in g["devices"]
    ]
    return (
        format_table(["GATEWAY", "DEVICE", "RECORDS", "LAST READING"], rows)
        + f"\n\ntotal: {doc['totals']['records']} records from {doc['totals']['devices']} devices"
    )


def progress_line(summary: dict[str, Any], width: int = 30) -> str:
    """``[#####.....] 11/22  loss 1.23  acc 85.0%  812 samples/s`` from a job's progress summary."""
    step, total = summary.get("step") or 0, summary.get("total_steps")
    filled = int(width * step / total) if total else 0
    bar = "[" + "#" * filled + "." * (width - filled) + "]"
    parts = [bar, f"{step}/{total if total else '?'}"]
    if summary.get("loss") is not None:
        parts.append(f"loss {summary['loss']:.4g}")
    if summary.get("accuracy") is not None:
        parts.append(f"acc {100 * summary['accuracy']:.1f}%")
    if summary.get("samples_per_s") is not None:
        parts.append(f"{summary['samples_per_s']:.0f} samples/s")
    return "  ".join(parts)


def format_uploads(doc: dict[str, Any], now: float) -> str:
    """Datasets uploaded for jobs (GET /v1/datasets/files)."""

    def shape(values: list[int] | None) -> str | None:
        return None if values is None else "x".join(str(v) for v in values)

    rows = [
        [
            d["name"],
            d["format"],
            d["rows"],
            shape(d["x_shape"]),
            d["y_dtype"],
            d["classes"],
            d["size"],
            _when(d["uploaded_ts"], now),
        ]
        for d in doc["datasets"]
    ]
    return format_table(["DATASET", "FORMAT", "ROWS", "X", "Y", "CLASSES", "BYTES", "UPLOADED"], rows)


def format_job_detail(job: dict[str, Any]) -> str:
    """``cloudctl job``: the jobs row, then its phase, times and each feature's latest figures."""
    lines = [format_jobs({"jobs": [job], "counts": {}}).rsplit("\n\n", 1)[0], ""]
    eta = job.get("eta_s")
    lines.append(
        f"phase {job.get('phase')}  elapsed {_num(job.get('elapsed_s'), 6) or '-'}s"
        + (f"  eta {eta:.0f}s" if eta is not None else "")
    )
    schedule = job.get("schedule") or {}
    if schedule.get("reason"):
        lines.append(f"scheduler: {schedule.get('queue_state')}: {schedule['reason']}")
    if decision := schedule.get("decision"):
        applied = "" if decision.get("applied", True) else " (waits for devices)"
        lines.append(f"last decision: {decision['decision']}{applied}: {decision.get('reason') or '-'}")
    features, live = job.get("features") or {}, job.get("live") or {}
    for name, setting in features.items():
        figures = live.get(name)
        shown = "  ".join(f"{k}={v}" for k, v in figures.items()) if isinstance(figures, dict) else ""
        lines.append(f"  {name:<12} {setting!s:<14} {shown}".rstrip())
    return "\n".join(lines)
