"""gatewayctl: operate a gateway over MQTT (docs/mqtt-api.md, "Control plane").

    gatewayctl --broker URL --gateway ID [--username U --password-file F --ca-file F] COMMAND [--json]

Commands: status, services, config get|set|patch, start, stop, devices [add|remove], camera-source,
model pin|unpin, placement [pin|unpin], log-level, logs, log verify. Human tables by default,
``--json`` for scripts.

Invariant: it answers or gives up within ``--timeout`` (connecting to the broker included; then at
most 1 s to disconnect); exit 0 on success, 1 when the gateway is offline or does not answer in
time (``log verify``: or its pass has not ended), 2 for usage or connection problems (including the
broker's refusal), 3 when the gateway refused the request (its error, naming the field, is
printed), 4 when ``log verify`` found damage. Every failure is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from gateway.control import log_verify
from gateway.control.client import ControlClient, CtlError
from protocol.config import MqttVersion
from protocol.control import SERVICE_NAMES, ControlResponse
from protocol.topics import check_id

EXIT_OK, EXIT_NO_STATUS, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given inline or as ``@file``; CtlError (usage, one line) if it is not one."""
    where = f"file {text[1:]}" if text.startswith("@") else "the value"
    try:
        value = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except OSError as exc:
        raise CtlError(f"cannot read {where}: {exc.strerror or exc}", EXIT_USAGE) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CtlError(f"{where} is not JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(value, dict):
        raise CtlError(f"{where} must be a JSON object, not {type(value).__name__}", EXIT_USAGE)
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    parser = argparse.ArgumentParser(
        prog="gatewayctl", description="operate an edgefed gateway over MQTT", parents=[common]
    )
    parser.add_argument("--broker", required=True, help="mqtt://HOST:PORT or mqtts://HOST:PORT")
    parser.add_argument("--gateway", required=True, help="gateway id")
    parser.add_argument("--username")
    parser.add_argument("--password-file", type=Path, help="file holding the password alone")
    parser.add_argument("--ca-file", type=Path, help="CA to verify the broker (mqtts)")
    parser.add_argument("--cert-file", type=Path, help="client certificate (mqtts, optional)")
    parser.add_argument("--key-file", type=Path, help="client key (mqtts, optional)")
    parser.add_argument("--protocol", choices=get_args(MqttVersion), default="5")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds for the whole command (connecting included)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", parents=[common], help="the gateway's presence and control summary")
    sub.add_parser("services", parents=[common], help="every service: state, revision, applied?")
    config = sub.add_parser("config", parents=[common], help="a service's desired config")
    config_sub = config.add_subparsers(dest="action", required=True)
    get = config_sub.add_parser("get", parents=[common], help="the config, state and revision")
    get.add_argument("service", choices=SERVICE_NAMES)
    for action, what in (("set", "replace a service's config"), ("patch", "JSON merge patch (RFC 7386)")):
        p = config_sub.add_parser(action, parents=[common], help=what)
        p.add_argument("service", choices=SERVICE_NAMES)
        p.add_argument("value", help="JSON object, or @file")
        p.add_argument(
            "--revision", type=int, help="refuse unless the config is at this revision (config get shows it)"
        )
    for name, what in (("start", "start a service"), ("stop", "stop a service (sensor: hold the intake)")):
        startable = ("sensor", "camera", "training")
        sub.add_parser(name, parents=[common], help=what).add_argument("service", choices=startable)
    devices = sub.add_parser("devices", parents=[common], help="devices.allow: list, add, remove")
    devices.add_argument("action", nargs="?", choices=("add", "remove"))
    devices.add_argument("device", nargs="?", help="device id or glob")
    camera = sub.add_parser("camera-source", parents=[common], help="set the camera source")
    camera.add_argument("source")
    camera.add_argument("--fps", type=float)
    model = sub.add_parser("model", parents=[common], help="pin or unpin a model version")
    model.add_argument("action", choices=("pin", "unpin"))
    model.add_argument("name")
    model.add_argument("version", nargs="?")
    placement = sub.add_parser("placement", parents=[common], help="placement pins: list, pin, unpin")
    placement.add_argument("action", nargs="?", choices=("pin", "unpin"))
    placement.add_argument("service", nargs="?")
    placement.add_argument("task", nargs="?")
    placement.add_argument("where", nargs="?", choices=("edge", "cloud"))
    sub.add_parser("log-level", parents=[common], help="the gateway's log level").add_argument(
        "level", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    logs = sub.add_parser("logs", parents=[common], help="recent warnings and errors")
    logs.add_argument("--limit", type=int, default=50)
    sub.add_parser("log", parents=[common], help="verify every record of the gateway's log").add_argument(
        "action", choices=("verify",)
    )
    return parser


Planned = tuple[str, dict[str, Any]]  # (op, body): what a command sends (docs/mqtt-api.md)


def _plan_config(args: argparse.Namespace) -> Planned:
    if args.action == "get":
        return "config.get", {"service": args.service}
    key = "config" if args.action == "set" else "patch"
    revision = {"revision": args.revision} if args.revision is not None else {}
    return f"config.{args.action}", {"service": args.service, key: json_object(args.value), **revision}


def _plan_devices(args: argparse.Namespace) -> Planned:
    if args.action is None:
        return "config.get", {"service": "sensor"}  # the list is the sensor's allow list
    if not args.device:
        raise CtlError(f"devices {args.action}: name a device", EXIT_USAGE)
    return f"device.{args.action}", {"device": args.device}


def _plan_camera_source(args: argparse.Namespace) -> Planned:
    return "camera.source", {"source": args.source, **({"sample_fps": args.fps} if args.fps else {})}


def _plan_model(args: argparse.Namespace) -> Planned:
    if args.action == "pin" and not args.version:
        raise CtlError("model pin: name a version", EXIT_USAGE)
    return "model.pin", {"model": args.name, "version": args.version if args.action == "pin" else None}


def _plan_placement(args: argparse.Namespace) -> Planned:
    if args.action is None:
        return "config.get", {"service": "placement"}
    if not (args.service and args.task) or (args.action == "pin" and not args.where):
        usage = "SERVICE TASK edge|cloud" if args.action == "pin" else "SERVICE TASK"
        raise CtlError(f"placement {args.action}: {usage}", EXIT_USAGE)
    where = args.where if args.action == "pin" else None  # unpin is a pin to None
    return "placement.pin", {"service": args.service, "task": args.task, "where": where}


# command -> the request it sends (None: ``status`` only reads the retained status message)
_PLANS: dict[str, Callable[[argparse.Namespace], Planned | None]] = {
    "status": lambda args: None,
    "services": lambda args: ("services.list", {}),
    "config": _plan_config,
    "start": lambda args: ("service.start", {"service": args.service}),
    "stop": lambda args: ("service.stop", {"service": args.service}),
    "devices": _plan_devices,
    "camera-source": _plan_camera_source,
    "model": _plan_model,
    "placement": _plan_placement,
    "log-level": lambda args: ("log.level", {"level": args.level}),
    "logs": lambda args: ("log.errors", {"limit": args.limit}),
    "log": lambda args: ("log.verify", {"wait_s": min(60.0, max(0.0, args.timeout - 1.0))}),
}


def plan_request(args: argparse.Namespace) -> Planned | None:
    """The (op, body) a command sends; None for ``status`` (which only reads the retained status)."""
    plan = _PLANS.get(args.command)
    if plan is None:
        raise CtlError(f"unknown command {args.command}", EXIT_USAGE)
    return plan(args)


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def human(args: argparse.Namespace, response: ControlResponse) -> str:
    data = response.data or {}
    if args.command == "services":
        rows = [{**view, "changed_at": view["revision"]} for view in data["services"]]
        columns = ["service", "state", "applied", "changed_at", "handler", "detail"]
        return table(rows, columns) + f"\nconfig revision {response.revision} (what --revision takes)"
    if args.command == "logs":
        rows = [{**line, "ts": f"{line['ts']:.3f}"} for line in data["lines"]]
        return table(rows, ["ts", "level", "logger", "message"]) if rows else "no recent warnings or errors"
    if args.command == "log":
        return log_verify.describe(data)
    if args.command == "devices" and args.action is None:
        return "\n".join(data["config"]["allow"])
    if args.command == "placement" and args.action is None:
        pins = data["config"]["pins"]
        rows = [{"task": k, "pinned": v} for k, v in sorted(pins.items())]
        return (
            table(rows, ["task", "pinned"]) if rows else "no pins (the planner decides)"
        ) + f"\n(state {data['state']}: {data['detail']})"
    if args.command == "config" and args.action == "get":
        head = (
            f"{data['service']}: {data['state']}, applied: {data['applied']} (config revision "
            f"{response.revision}: what --revision takes; this service last changed at {data['revision']})"
        )
        return head + "\n" + json.dumps(data["config"], indent=2, sort_keys=True)
    if not data.get("changed"):
        return f"no change (revision {response.revision})"
    out = [f"revision {response.revision}"]
    for view in data["services"].values():
        out.append(
            f"  {view['service']}: {view['state']}, applied: {view['applied']}"
            + (f" ({view['detail']})" if view["detail"] else "")
        )
    return "\n".join(out)


async def run(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    for option in ("password_file", "ca_file", "cert_file", "key_file"):
        path = getattr(args, option)
        if path is not None and not (path.is_file() and os.access(path, os.R_OK)):
            raise CtlError(f"--{option.replace('_', '-')} {path}: not a readable file", EXIT_USAGE)
    password = args.password_file.read_text().strip() if args.password_file else None
    planned = plan_request(args)
    async with ControlClient(
        args.broker,
        args.gateway,
        username=args.username,
        password=password,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
        protocol_version=args.protocol,
        timeout_s=args.timeout,
    ) as client:
        if planned is None:
            status = await client.read_status(wait_s=args.timeout)
            if status is None:
                raise CtlError(
                    f"gateway {args.gateway} offline or no status (nothing on "
                    f"edgefed/{args.gateway}/status within {args.timeout:g}s)"
                )
            state = status.get("state", "?")
            print(
                json.dumps(status)
                if as_json
                else f"gateway {status.get('gateway', args.gateway)}: {state} (since {status.get('ts', '?')})"
            )
            return EXIT_OK if state == "online" else EXIT_NO_STATUS
        response = await client.request(*planned)
    if as_json:
        print(response.model_dump_json(exclude_none=True))
    elif response.status == "ok":
        print(human(args, response))
    if response.status == "error":
        assert response.error is not None
        where = f" {response.error.field}:" if response.error.field else ""
        print(
            f"gatewayctl: refused ({response.error.reason}):{where} {response.error.detail}", file=sys.stderr
        )
        return EXIT_REFUSED
    return log_verify.exit_code(response.data or {}) if args.command == "log" else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:  # the MQTT adapter's retry warnings are not the operator's
        logging.getLogger().addHandler(logging.NullHandler())  # business: the one-line error says it
    try:
        check_id("gateway", args.gateway)
        return asyncio.run(run(args))
    except CtlError as exc:
        print(f"gatewayctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except (ValueError, OSError) as exc:
        print(f"gatewayctl: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
