"""cloudctl's parser and commands (the entry point ``cloud.ctl:main``; usage: ``cloud.ctl``).

Invariant: ``main`` returns 0 only when cloudd answered 2xx (and, for ``train --wait`` / ``watch``,
the job succeeded); a ``CtlError`` prints one line on stderr and returns 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from cloud.ctl.datasets import add_datasets_parser, run_datasets
from cloud.ctl.federated import add_federated_parser, run_federated
from cloud.ctl.fleet import add_fleet_parsers, run_fleet
from cloud.ctl.http import CtlError, call_json, get_json
from cloud.ctl.models import add_models_parser, run_models
from cloud.ctl.text import format_job_detail, format_jobs, format_status
from cloud.ctl.train import add_train_parser, spec_from_args, watch

DEFAULT_URL = "http://127.0.0.1:8700"


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
    add_models_parser(commands, common)
    add_federated_parser(commands, common)
    add_fleet_parsers(commands, common)
    add_datasets_parser(commands, common)
    for name in ("job", "cancel", "watch"):
        sub = commands.add_parser(name, parents=[common], help=f"{name} one job")
        sub.add_argument("job_id")
    add_train_parser(commands, common)
    return parser


def _train(args: argparse.Namespace, base: str) -> int:
    body = json.dumps(spec_from_args(args)).encode()
    job = call_json(base + "/v1/jobs", args.token, args.timeout, "POST", body)
    print(json.dumps(job) if args.json else job["id"], flush=True)
    if not args.wait:
        return 0
    code = watch(base, args.token, job["id"], args.json)
    if not args.json:
        final = get_json(f"{base}/v1/jobs/{job['id']}", args.token, args.timeout)
        model = final.get("model")
        print(
            f"{final['id']} {final['state']}"
            + (f": registered {model['name']}@{model['version']}" if model else f": {final.get('error')}")
        )
    return code


def run(args: argparse.Namespace) -> int:
    base, token, now = args.url.rstrip("/"), args.token, time.time()
    if args.command == "status":
        doc = get_json(base + "/v1/status", token, args.timeout)
        if args.json:
            print(json.dumps(doc, indent=2))
            return 0
        print(format_status(doc, now, get_json(base + "/v1/jobs", token, args.timeout)))
        return 0
    if args.command in ("fleet", "gateway"):
        return run_fleet(args, base, now)
        return 0
    if args.command == "models":
        return run_models(args, base, now)
    if args.command == "federated":
        return run_federated(args, base)
    if args.command == "datasets":
        return run_datasets(args, base, now)
    if args.command == "jobs":
        doc = get_json(base + "/v1/jobs", token, args.timeout)
        print(json.dumps(doc, indent=2) if args.json else format_jobs(doc))
        return 0
    if args.command in ("job", "cancel"):
        method, suffix = ("POST", "/cancel") if args.command == "cancel" else ("GET", "")
        body = b"" if method == "POST" else None
        job = call_json(f"{base}/v1/jobs/{args.job_id}{suffix}", token, 60.0, method, body)
        print(json.dumps(job, indent=2) if args.json else format_job_detail(job))
        return 0
    if args.command == "watch":
        return watch(base, token, args.job_id, args.json)
    return _train(args, base)


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
