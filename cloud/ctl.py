"""cloudctl: the operator's command line for a running cloudd.

    cloudctl [--url URL] [--token TOK] status|jobs|models|fleet|datasets [--json]
                                         (status: also a progress bar per live job)
    cloudctl train [--file job.toml | --model M --nproc N --epochs E ...] [--wait] [--json]
    cloudctl watch JOB [--json]          live progress bar and figures (plain lines when not a TTY)
    cloudctl job JOB | cancel JOB [--json]

The token may also come from $CLOUDCTL_TOKEN. Invariant: exit 0 only when cloudd answered 2xx
(and, for ``train --wait`` / ``watch``, the job succeeded); an unreachable cloudd or an HTTP error
prints one line saying which and exits 1. Formatting (``format_*``, ``progress_line``) is pure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from runtime.backoff import Backoff

DEFAULT_URL = "http://127.0.0.1:8700"
STREAM_TRIES = 5  # event-stream connections in a row without an event before giving up


class CtlError(Exception):
    """A request cloudctl could not complete; the message says why."""


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
    live = [j for j in doc["jobs"] if j["state"] in ("running", "queued")]
    ended = [j for j in doc["jobs"] if j["state"] not in ("running", "queued")][-1:]
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
                job.get("error"),
            ]
        )
    counts = doc.get("counts", {})
    return (
        format_table(
            ["JOB", "STATE", "MODEL", "NPROC", "STEPS", "LOSS", "ACCURACY", "VERSION", "ERROR"], rows
        )
        + f"\n\n{counts.get('running', 0)} running, {counts.get('queued', 0)} queued"
    )


def _lineage_text(lineage: dict[str, Any] | None) -> str:
    if not lineage:
        return "uploaded by hand"
    text = f"{lineage.get('job', '?')}: {lineage.get('dataset')}"
    for gateway, logs in (lineage.get("sources") or {}).items():
        runs = "; ".join(f"{log} " + ",".join(f"{a}-{b}" for a, b in r) for log, r in logs.items())
        text += f" {gateway}({runs})"
    return text


def format_models(doc: dict[str, Any], now: float) -> str:
    return format_table(
        ["MODEL", "VERSION", "SEQ", "BYTES", "STORED", "LINEAGE"],
        [
            [
                m["name"],
                m["version"],
                m["seq"],
                m["size"],
                _when(m["uploaded_ts"], now),
                _lineage_text(m.get("lineage")),
            ]
            for m in doc["models"]
        ],
    )


def format_fleet(doc: dict[str, Any], now: float) -> str:
    rows = []
    for g in doc["gateways"]:
        link = g.get("link")
        link_text = (
            None if link is None else ("down" if not link["up"] else f"{link.get('rtt_ms') or 0:.0f}ms")
        )
        cloud = [p for p in g["placement"] if p["where"] == "cloud"]
        placement = f"{len(g['placement']) - len(cloud)}gw/{len(cloud)}cloud" if g["placement"] else None
        rows.append(
            [
                g["id"],
                "online" if g["online"] else "offline",
                _when(g["last_seen"], now),
                g["backlog_records"],
                link_text,
                placement,
                g["records"],
            ]
        )
    t = doc["totals"]
    return (
        format_table(["GATEWAY", "STATE", "LAST SEEN", "BACKLOG", "LINK", "PLACEMENT", "RECORDS"], rows)
        + f"\n\n{t['online']} online, {t['offline']} offline of {t['gateways']}"
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


# -- HTTP --------------------------------------------------------------------------------------------
def _request(
    url: str,
    token: str | None,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str = "application/json",
) -> urllib.request.Request:
    request = urllib.request.Request(url, data=body, method=method, headers={"Accept": "application/json"})
    if body is not None:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return request


def _http_error(url: str, exc: urllib.error.HTTPError) -> CtlError:
    try:
        body = json.loads(exc.read())
        why = f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        why = exc.reason
    return CtlError(f"{url}: HTTP {exc.code} ({why})")


def call_json(
    url: str,
    token: str | None,
    timeout: float = 10.0,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str = "application/json",
) -> dict[str, Any]:
    request = _request(url, token, method, body, content_type)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise _http_error(url, exc) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CtlError(f"cannot reach cloudd at {url}: {reason}") from None
    except ValueError:
        raise CtlError(f"{url}: answer is not JSON") from None


def get_json(url: str, token: str | None, timeout: float = 10.0) -> dict[str, Any]:
    return call_json(url, token, timeout)


def iter_events(url: str, token: str | None, timeout: float = 60.0) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, data) per server-sent event, until the stream says ``end``. A stream that drops or
    closes early is resumed from the last id, backing off; ``STREAM_TRIES`` tries in a row without
    an event give up with CtlError."""
    next_id, retry = 0, Backoff(0.5, 4.0)
    while True:
        try:
            request = _request(f"{url}?since={next_id}", token)
            with urllib.request.urlopen(request, timeout=timeout) as response:
                kind, data = "message", ""
                for raw in response:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        data += line[6:]
                    elif line.startswith("id: "):
                        next_id = int(line[4:]) + 1
                    elif line == "" and data:
                        if kind == "end":
                            return
                        retry.succeeded()
                        yield kind, json.loads(data)
                        kind, data = "message", ""
        except urllib.error.HTTPError as exc:
            raise _http_error(url, exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = str(getattr(exc, "reason", exc))
        else:
            reason = "the stream closed before its end"
        if retry.failures + 1 >= STREAM_TRIES:
            raise CtlError(f"event stream {url}: {reason}")
        time.sleep(retry.failed())


def watch(base: str, token: str | None, job_id: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Follow a job to its end; 0 if it succeeded."""
    summary: dict[str, Any] = {"step": 0, "total_steps": None}
    tty, state, last_plain = out.isatty(), None, 0.0
    for kind, event in iter_events(f"{base}/v1/jobs/{job_id}/events", token):
        if as_json:
            print(json.dumps(event), file=out, flush=True)
        if kind == "start":
            summary["total_steps"] = event.get("total_steps")
        elif kind == "step":
            summary.update({k: event.get(k) for k in ("step", "loss", "samples_per_s")})
        elif kind == "eval":
            summary["accuracy"] = event.get("accuracy")
        elif kind == "state":
            state = event.get("state")
        if as_json:
            continue
        if tty and kind in ("step", "eval"):
            print("\r" + progress_line(summary), end="", file=out, flush=True)
        elif kind in ("step", "eval") and (
            time.monotonic() - last_plain >= 2.0 or summary["step"] == summary["total_steps"]
        ):
            print(progress_line(summary), file=out, flush=True)
            last_plain = time.monotonic()
        elif kind in ("state", "registered", "error"):
            detail = event.get("model") or event.get("error") or event.get("message") or ""
            text = f"{kind}: {event.get('state', '')} {json.dumps(detail) if detail else ''}".strip()
            print(("\n" if tty else "") + text, file=out, flush=True)
    return 0 if state == "succeeded" else 1


def spec_from_args(args: argparse.Namespace) -> tuple[bytes, str]:
    if args.file is not None:
        text = Path(args.file).read_text()
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise CtlError(f"{args.file}: {exc}") from None
        return text.encode(), "application/toml"
    spec = {"model": args.model, "nproc": args.nproc, "epochs": args.epochs, "schedule": args.schedule}
    for key in ("lr", "batch_size", "microbatches", "max_steps", "registry_name"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if args.gateway:
        spec["gateways"] = args.gateway
    return json.dumps(spec).encode(), "application/json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cloudctl", description="talk to a running cloudd")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"cloudd base URL (default {DEFAULT_URL})")
    parser.add_argument(
        "--token", default=os.environ.get("CLOUDCTL_TOKEN"), help="operator token (default $CLOUDCTL_TOKEN)"
    )
    parser.add_argument("--timeout", type=float, default=10.0)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print cloudd's JSON")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", parents=[common], help="gateways and per-device record counts")
    commands.add_parser("jobs", parents=[common], help="training jobs")
    commands.add_parser("models", parents=[common], help="model versions and their lineage")
    commands.add_parser("fleet", parents=[common], help="gateways: online, backlog, link, placement")
    commands.add_parser("datasets", parents=[common], help="uploaded records per gateway and device")
    for name in ("job", "cancel", "watch"):
        sub = commands.add_parser(name, parents=[common], help=f"{name} one job")
        sub.add_argument("job_id")
    train = commands.add_parser("train", parents=[common], help="submit a training job; prints its id")
    train.add_argument("--file", help="a job spec as TOML (the other flags are then ignored)")
    # cloud.jobs.spec's ModelName and cloud.training.schedules' ScheduleName, written out: importing
    # cloud.jobs.spec would add pydantic's import time to every cloudctl command; cloudd checks anyway.
    train.add_argument(
        "--model", default="digits_cnn", choices=["digits_cnn", "anomaly_autoencoder", "scene_cnn"]
    )
    train.add_argument("--nproc", type=int, default=2)
    train.add_argument("--epochs", type=int, default=1)
    train.add_argument("--schedule", default="1f1b-flush", choices=["gpipe", "1f1b-flush", "1f1b-stash"])
    train.add_argument("--lr", type=float)
    train.add_argument("--batch-size", type=int)
    train.add_argument("--microbatches", type=int)
    train.add_argument("--max-steps", type=int)
    train.add_argument(
        "--registry-name", help="model name in the registry (default: digits / anomaly / scene)"
    )
    train.add_argument(
        "--gateway",
        action="append",
        default=[],
        help="uploaded data (sensor windows, camera frames) of this gateway only",
    )
    train.add_argument(
        "--wait", action="store_true", help="follow the job to its end (exit 1 unless it succeeded)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    base, token, now = args.url.rstrip("/"), args.token, time.time()
    if args.command == "status":
        doc = get_json(base + "/v1/status", token, args.timeout)
        if args.json:
            print(json.dumps(doc, indent=2))
            return 0
        print(format_status(doc, now, get_json(base + "/v1/jobs", token, args.timeout)))
        return 0
    simple = {
        "models": ("/v1/models", format_models),
        "fleet": ("/v1/fleet", format_fleet),
        "datasets": ("/v1/datasets", format_datasets),
    }
    if args.command in simple:
        path, formatter = simple[args.command]
        doc = get_json(base + path, token, args.timeout)
        print(json.dumps(doc, indent=2) if args.json else formatter(doc, now))
        return 0
    if args.command == "jobs":
        doc = get_json(base + "/v1/jobs", token, args.timeout)
        print(json.dumps(doc, indent=2) if args.json else format_jobs(doc))
        return 0
    if args.command in ("job", "cancel"):
        method, suffix = ("POST", "/cancel") if args.command == "cancel" else ("GET", "")
        body = b"" if method == "POST" else None
        job = call_json(f"{base}/v1/jobs/{args.job_id}{suffix}", token, 60.0, method, body)
        text = format_jobs({"jobs": [job], "counts": {}}).rsplit("\n\n", 1)[0]
        print(json.dumps(job, indent=2) if args.json else text)
        return 0
    if args.command == "watch":
        return watch(base, token, args.job_id, args.json)
    body, content_type = spec_from_args(args)
    job = call_json(base + "/v1/jobs", token, args.timeout, "POST", body, content_type)
    print(json.dumps(job) if args.json else job["id"], flush=True)
    if not args.wait:
        return 0
    code = watch(base, token, job["id"], args.json)
    if not args.json:
        final = get_json(f"{base}/v1/jobs/{job['id']}", token, args.timeout)
        model = final.get("model")
        print(
            f"{final['id']} {final['state']}"
            + (f": registered {model['name']}@{model['version']}" if model else f": {final.get('error')}")
        )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except CtlError as exc:
        print(f"cloudctl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
