"""gatewayctl as an operator meets it, against a real mosquitto and a real gatewayd: the revision that
``config get`` prints is the one ``--revision`` takes, ``status`` of an offline gateway exits 1,
``--timeout`` bounds the whole command, every subcommand has help, and a bad ``@file`` is one line."""

from __future__ import annotations

import argparse
import os
import re
import signal
import time
from collections.abc import Iterator

import pytest

from gateway.ctl import build_parser, main
from tests.harness.gatewayctl import broker_args, ctl

DISCONNECT_S = 1.0  # docs/gateway.md: gatewayctl ends within --timeout, plus at most 1 s to disconnect


def test_the_revision_config_get_prints_is_the_one_revision_takes(mosquitto, gatewayd):
    args = broker_args(mosquitto.url)
    code, _, err = ctl(*args, "log-level", "DEBUG")  # another service moves the config's revision on
    assert code == 0, err
    code, out, err = ctl(*args, "config", "get", "sensor")
    assert code == 0, err
    printed = re.search(r"config revision (\d+)", out)
    assert printed is not None, out
    code, out, err = ctl(
        *args, "config", "patch", "sensor", '{"allow": ["sensor-*"]}', "--revision", printed.group(1)
    )
    assert code == 0, (out, err)
    code, out, err = ctl(*args, "services")
    assert code == 0 and f"config revision {int(printed.group(1)) + 1}" in out, out


def test_status_of_an_offline_gateway_exits_1(mosquitto, gatewayd):
    code, out, err = ctl(*broker_args(mosquitto.url), "status")
    assert code == 0 and "gw1: online" in out, (out, err)
    rc, log = gatewayd.terminate()
    assert rc == 0, log[-2000:]
    code, out, err = ctl(*broker_args(mosquitto.url), "status")
    assert code == 1 and "gw1: offline" in out, (out, err)
    code, out, err = ctl(*broker_args(mosquitto.url), "--json", "status")
    assert code == 1 and '"state": "offline"' in out, (out, err)


def timed(*args: str) -> tuple[float, int, str]:
    start = time.monotonic()
    code, _, err = ctl(*args)
    return time.monotonic() - start, code, err


def test_timeout_bounds_the_whole_command(mosquitto, gatewayd):
    # a gateway that never existed: no status, no answer
    took, code, err = timed(*broker_args(mosquitto.url, gateway="gw9", timeout_s=2), "services")
    assert code == 1 and "no response from gateway gw9" in err, err
    assert took <= 2 + DISCONNECT_S, took
    # a gateway whose status says online but that cannot answer (its process is stopped)
    os.kill(gatewayd.proc.pid, signal.SIGSTOP)
    try:
        took, code, err = timed(*broker_args(mosquitto.url, timeout_s=2), "services")
    finally:
        os.kill(gatewayd.proc.pid, signal.SIGCONT)
    assert code == 1 and "its status: online" in err, err
    assert took <= 2 + DISCONNECT_S, took


def test_every_subcommand_says_what_it_does():
    def subcommands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, str | None]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for name, sub in action.choices.items():
                    yield f"{prefix}{name}", helps.get(name)
                    yield from subcommands(sub, f"{prefix}{name} ")

    found = dict(subcommands(build_parser(), ""))
    assert {"start", "stop", "log-level", "config get", "config set"} <= set(found)
    assert [name for name, text in found.items() if not text] == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("@/no/such/file.json", "cannot read file /no/such/file.json: No such file or directory"),
        ("@.", "cannot read file .: Is a directory"),
        ("{not json", "the value is not JSON"),
        ("[1, 2]", "the value must be a JSON object, not list"),
    ],
)
def test_a_bad_value_is_one_line_not_a_traceback(value, says):
    # refused before any connection: the broker named here does not exist
    code, out, err = ctl(*broker_args("mqtt://127.0.0.1:9"), "config", "set", "sensor", value)
    assert code == 2 and out == "", (out, err)
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_every_command_but_check_needs_the_broker_and_the_gateway(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, as for any other
        main(["--gateway", "gw1", "services"])
    assert exited.value.code == 2
    assert "gatewayctl: error: services needs --broker and --gateway" in capsys.readouterr().err
