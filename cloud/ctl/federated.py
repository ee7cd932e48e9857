"""``cloudctl federated start|status|stop``: federated training without a hand-written HTTP PUT.

    cloudctl federated start [--job FILE.json] [--model M] [--aggregator A] [--arch K] [--width W]
                             [--buffer-k K] [--min-updates N] [--onnx-every N] [--seed S]
    cloudctl federated status
    cloudctl federated stop

``start`` PUTs a ``protocol.federated.FederatedJob``: the file's fields, then each flag given (cloudd
validates it and names a bad field). Invariant: exit 0 only on cloudd's 2xx.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cloud.ctl.http import CtlError, call_json, get_json

PATH = "/v1/federated/job"
FLAGS = {  # flag -> (FederatedJob field, type)
    "model": ("model", str),
    "aggregator": ("aggregator", str),
    "buffer_k": ("buffer_k", int),
    "min_updates": ("min_updates", int),
    "onnx_every": ("onnx_every", int),
    "seed": ("seed", int),
}


def add_federated_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    federated = commands.add_parser(
        "federated", parents=[common], help="start, watch or stop federated training"
    )
    actions = federated.add_subparsers(dest="federated_action", required=True)
    start = actions.add_parser(
        "start", parents=[common], help="start a federated job (PUT /v1/federated/job)"
    )
    start.add_argument("--job", type=Path, help="a FederatedJob JSON file; flags override its fields")
    for flag, (_, kind) in FLAGS.items():
        start.add_argument("--" + flag.replace("_", "-"), type=kind)
    start.add_argument("--arch", choices=["digits_mlp", "digits_cnn"])
    start.add_argument("--width", type=int)
    actions.add_parser("status", parents=[common], help="rounds, participants, staleness, bytes")
    actions.add_parser("stop", parents=[common], help="stop the running federated job")


def job_from_args(args: argparse.Namespace) -> dict[str, Any]:
    job: dict[str, Any] = {}
    if args.job is not None:
        try:
            job = json.loads(args.job.read_text())
        except (OSError, ValueError) as exc:
            raise CtlError(f"--job {args.job}: {exc}") from None
    for flag, (field, _) in FLAGS.items():
        if getattr(args, flag) is not None:
            job[field] = getattr(args, flag)
    arch = {k: v for k, v in (("kind", args.arch), ("width", args.width)) if v is not None}
    if arch:
        job["arch"] = {**job.get("arch", {}), **arch}
    return job


def run_federated(args: argparse.Namespace, base: str) -> int:
    if args.federated_action == "start":
        answer = call_json(
            base + PATH, args.token, args.timeout, "PUT", json.dumps(job_from_args(args)).encode()
        )
        text = "started" if answer["started"] else "already running"
        print(json.dumps(answer) if args.json else f"federated job {text} at version {answer['version']}")
    elif args.federated_action == "stop":
        answer = call_json(base + PATH, args.token, args.timeout, "DELETE")
        print(
            json.dumps(answer) if args.json else f"stopped {answer['model']} at version {answer['version']}"
        )
    else:
        status = get_json(base + "/v1/federated/status", args.token, args.timeout)
        if args.json or status.get("job") is None:
            print(json.dumps(status, indent=2) if args.json else "no federated job running")
        else:
            updates = status["updates"]
            print(
                f"{status['model']} ({status['aggregator']}): version {status['version']}, "
                f"{updates['applied']} updates applied, {updates['refused_total']} refused, "
                f"{len(status['participants'])} gateways, {status['onnx']['exported']} versions exported"
            )
    return 0
