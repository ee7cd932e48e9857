"""``cloudctl models``: versions with their stage and evaluation, and the lifecycle's commands.

    cloudctl models [list] [--name N] [--track central|federated|all]
    cloudctl models promote NAME VERSION (--canary gw1,gw2 | --share 0.2 | --production) [--force]
    cloudctl models rollback NAME [--to VERSION] [--reason TEXT]
    cloudctl models stage NAME VERSION candidate|archived

``list --name N`` also prints the name's aliases and its history (every decision: who, what, why).
Invariant: a refused transition exits 1 with cloudd's reason (e.g. ``not_promotable`` naming the
evaluation); nothing is printed as done that cloudd did not answer 2xx.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from typing import Any

from cloud.ctl.http import call_json, get_json
from cloud.ctl.text import format_models


def add_models_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    models = commands.add_parser("models", parents=[common], help="model versions, stages and rollouts")
    models.add_argument("--name", help="one model name (its aliases and history too)")
    models.add_argument("--track", default="central", choices=["central", "federated", "all"])
    actions = models.add_subparsers(dest="models_action")
    listing = actions.add_parser("list", parents=[common], help="versions with stage and evaluation")
    listing.add_argument("--name", help="one model name (its aliases and history too)")
    listing.add_argument("--track", default="central", choices=["central", "federated", "all"])
    promote = actions.add_parser("promote", parents=[common], help="candidate -> canary, or -> production")
    promote.add_argument("name")
    promote.add_argument("version")
    where = promote.add_mutually_exclusive_group(required=True)
    where.add_argument("--canary", help="comma-separated gateway ids that run it first")
    where.add_argument("--share", type=float, help="a share of the fleet (0..1] that runs it first")
    where.add_argument("--production", action="store_true", help="make it production everywhere")
    promote.add_argument("--force", action="store_true", help="promote even when the gate refused it")
    promote.add_argument("--reason", default="")
    rollback = actions.add_parser("rollback", parents=[common], help="end the canary, or restore production")
    rollback.add_argument("name")
    rollback.add_argument("--to", help="the version to run (default: the production before, else factory)")
    rollback.add_argument("--reason", default="")
    stage = actions.add_parser("stage", parents=[common], help="set a version's stage by hand")
    stage.add_argument("name")
    stage.add_argument("version")
    stage.add_argument("stage", choices=["candidate", "canary", "production", "archived"])


def format_history(doc: dict[str, Any]) -> str:
    canary = doc.get("canary")
    lines = [
        f"{doc['name']}: production {doc['production'] or '-'}, factory {doc['factory'] or '-'}, canary "
        + (f"{canary['version']} on {','.join(canary['gateways'])}" if canary else "-")
    ]
    rollout = doc.get("rollout")
    if rollout:
        lines.append(f"rollout: {rollout['action']}: {rollout['reason']}")
    lines.append(f"history ({len(doc['history'])} of {doc['events_total']} events):")
    for event in doc["history"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event["ts"]))
        who = f" by {event['by']}" if event.get("by") else ""
        why = f": {event['reason']}" if event.get("reason") else ""
        forced = " [forced past the gate]" if event.get("forced") else ""
        lines.append(f"  {when} {event['action']} {event.get('version')}{who}{why}{forced}")
    return "\n".join(lines)


def _post(base: str, path: str, args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    return call_json(base + path, args.token, args.timeout, "POST", json.dumps(body).encode())


def run_models(args: argparse.Namespace, base: str, now: float) -> int:
    action = args.models_action or "list"
    quoted = urllib.parse.quote(getattr(args, "name", None) or "", safe="")
    if action == "list":
        query = urllib.parse.urlencode({k: v for k, v in (("name", args.name), ("track", args.track)) if v})
        doc = get_json(f"{base}/v1/models?{query}", args.token, args.timeout)
        detail = get_json(f"{base}/v1/models/{quoted}", args.token, args.timeout) if args.name else None
        if args.json:
            print(json.dumps(doc | ({"lifecycle": detail} if detail else {}), indent=2))
        else:
            print(format_models(doc, now) + ("\n\n" + format_history(detail) if detail else ""))
        return 0
    if action == "promote":
        body: dict[str, Any] = {"version": args.version, "force": args.force, "reason": args.reason}
        if args.canary:
            body["canary"] = [g.strip() for g in args.canary.split(",") if g.strip()]
        elif args.share is not None:
            body["share"] = args.share
        else:
            body["production"] = True
        answer = _post(base, f"/v1/models/{quoted}/promote", args, body)
    elif action == "rollback":
        answer = _post(base, f"/v1/models/{quoted}/rollback", args, {"to": args.to, "reason": args.reason})
    else:
        version = urllib.parse.quote(args.version, safe="")
        answer = _post(base, f"/v1/models/{quoted}/{version}/stage", args, {"stage": args.stage})
    event = answer["event"]
    extra = {k: v for k, v in event.items() if k not in ("ts", "action", "version", "reason", "by")}
    print(
        json.dumps(answer, indent=2)
        if args.json
        else f"{answer['name']}: {event['action']} {event['version']}: {event['reason']}"
        + (f" {json.dumps(extra)}" if extra else "")
    )
    return 0
