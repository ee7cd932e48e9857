"""gatewayctl: operate a gateway over MQTT (docs/mqtt-api.md, "Control plane"), or check its box.

    gatewayctl --broker URL --gateway ID [--username U --password-file F --ca-file F] COMMAND [--json]
    gatewayctl check --config FILE [--json]

Commands: status, services, config get|set|patch, start, stop, restart, devices [add|remove],
camera-source, model pin|unpin, placement [pin|unpin], log-level, logs [--level L] [--follow], log
verify; and check, the preflight run on the gateway's box (gateway/preflight). Human tables by default
(gateway/control/render.py), ``--json`` for scripts.

Invariant: it answers or gives up within ``--timeout`` (connecting to the broker included; then at
most 1 s to disconnect; ``logs --follow``: each poll, until Ctrl-C, which exits 0); exit 0 on
success, 1 when the gateway is offline or does not answer in time (``check``: when a check fails;
``log verify``: or its pass has not ended), 2 for usage or connection problems (including the
broker's refusal), 3 when the gateway refused the request (its error, naming the field, is printed),
4 when ``log verify`` found damage. Every failure is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from gateway.control import log_verify
from gateway.control.client import ControlClient, CtlError
from gateway.control.render import human, log_lines, presence
from gateway.preflight.run import preflight, render_checks
from protocol.config import MqttVersion
from protocol.control import MAX_LOG_LINES, SERVICE_NAMES, ControlResponse
from protocol.topics import check_id
from runtime.tasks import wait_event

EXIT_OK, EXIT_NO_STATUS, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, other than the end of logs --follow


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
    parser.add_argument("--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT (every command but check)")
    parser.add_argument("--gateway", help="gateway id (every command but check)")
    parser.add_argument("--username")
    parser.add_argument("--password-file", type=Path, help="file holding the password alone")
    parser.add_argument("--ca-file", type=Path, help="CA to verify the broker (mqtts)")
    parser.add_argument("--cert-file", type=Path, help="client certificate (mqtts, optional)")
    parser.add_argument("--key-file", type=Path, help="client key (mqtts, optional)")
    parser.add_argument("--protocol", choices=get_args(MqttVersion), default="5")
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="seconds for the whole command (connecting included); check: for each network check",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check", parents=[common], help="preflight on the gateway's box: config, data dir, broker, cloud"
    )
    check.add_argument("--config", required=True, type=Path, help="the gateway's TOML file")
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
    restart = sub.add_parser("restart", parents=[common], help="stop and start a running service")
    restart.add_argument("service", choices=("sensor", "camera", "training"))
    devices = sub.add_parser(
        "devices", parents=[common], help="devices heard from and devices.allow; add, remove"
    )
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
    logs = sub.add_parser("logs", parents=[common], help="recent log lines (warnings and errors by default)")
    logs.add_argument("--limit", type=int, default=50, help="the last N lines (1-500)")
    logs.add_argument("--level", choices=("INFO", "WARNING", "ERROR"), default="WARNING", help="this and up")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until Ctrl-C")
    logs.add_argument("--interval", type=float, default=1.0, help="--follow: seconds between polls")
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
        return "devices.list", {}
    if not args.device:
        raise CtlError(f"devices {args.action}: name a device", EXIT_USAGE)
    return f"device.{args.action}", {"device": args.device}


def _plan_camera_source(args: argparse.Namespace) -> Planned:
    rate = {} if args.fps is None else {"sample_fps": args.fps}  # 0 too: the gateway refuses it by name
    return "camera.source", {"source": args.source, **rate}


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
    "restart": lambda args: ("service.restart", {"service": args.service}),
    "devices": _plan_devices,
    "camera-source": _plan_camera_source,
    "model": _plan_model,
    "placement": _plan_placement,
    "log-level": lambda args: ("log.level", {"level": args.level}),
    "logs": lambda args: ("log.errors", {"limit": args.limit, "level": args.level}),
    "log": lambda args: ("log.verify", {"wait_s": min(60.0, max(0.0, args.timeout - 1.0))}),
}


def plan_request(args: argparse.Namespace) -> Planned | None:
    """The (op, body) a command sends; None for ``status`` (which only reads the retained status)."""
    plan = _PLANS.get(args.command)
    if plan is None:
        raise CtlError(f"unknown command {args.command}", EXIT_USAGE)
    return plan(args)


def refused(response: ControlResponse) -> int:
    """The gateway's refusal as one line on stderr; the exit code."""
    assert response.error is not None
    where = f" {response.error.field}:" if response.error.field else ""
    print(f"gatewayctl: refused ({response.error.reason}):{where} {response.error.detail}", file=sys.stderr)
    return EXIT_REFUSED


async def follow_logs(client: ControlClient, args: argparse.Namespace, as_json: bool) -> int:
    """``logs --follow``: the last ``--limit`` lines, then each new one as it comes, once and in order
    (the cursor of each answer is where the next poll reads on), until Ctrl-C.

    Ctrl-C sets an event the loop checks between polls (a poll in flight ends within ``--timeout``)
    rather than cancelling the command through the MQTT client's waits (once, in a CI run, a
    follower so cancelled was still running 10 s after its Ctrl-C; the cause was not found)."""
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        body: dict[str, Any] = {"level": args.level, "limit": args.limit}
        while not interrupted.is_set():
            client.renew()  # each poll has the whole --timeout
            response = await client.request("log.errors", body)
            if response.status == "error":
                return refused(response)
            data = response.data or {}
            lines = [json.dumps(line) for line in data["lines"]] if as_json else log_lines(data)
            if lines:
                print("\n".join(lines), flush=True)
            body = {"level": args.level, "limit": MAX_LOG_LINES, "after": data["next"]}
            if len(data["lines"]) < MAX_LOG_LINES:  # a full answer: more may wait, read on at once
                # polling is the mechanism: the gateway pushes no lines
                await wait_event(interrupted, args.interval)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return EXIT_OK


async def run_check(args: argparse.Namespace, as_json: bool) -> int:
    checks = await preflight(args.config, timeout_s=args.timeout)
    failed = any(check.status == "FAIL" for check in checks)
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [check.as_dict() for check in checks]}))
    else:
        print(render_checks(checks))
    return EXIT_NO_STATUS if failed else EXIT_OK


async def run(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    if args.command == "check":
        return await run_check(args, as_json)
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
            print(json.dumps(status) if as_json else presence(args.gateway, status, time.time()))
            return EXIT_OK if status.get("state") == "online" else EXIT_NO_STATUS
        if args.command == "logs" and args.follow:
            return await follow_logs(client, args, as_json)
        response = await client.request(*planned)
    if as_json:
        print(response.model_dump_json(exclude_none=True))
    elif response.status == "ok":
        print(human(args, response, time.time()))
    if response.status == "error":
        return refused(response)
    return log_verify.exit_code(response.data or {}) if args.command == "log" else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "check" and not (args.broker and args.gateway):
        parser.error(f"{args.command} needs --broker and --gateway")
    if not logging.getLogger().handlers:  # the MQTT adapter's retry warnings are not the operator's
        logging.getLogger().addHandler(logging.NullHandler())  # business: the one-line error says it
    try:
        if args.gateway is not None:
            check_id("gateway", args.gateway)
        return asyncio.run(run(args))
    except CtlError as exc:
        print(f"gatewayctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except (ValueError, OSError) as exc:
        print(f"gatewayctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: how logs --follow ends, and only that is a success
        return EXIT_OK if getattr(args, "follow", False) else EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
