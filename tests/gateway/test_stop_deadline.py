"""gatewayd's stop deadline (docs/gateway.md, "Stopping"): a subsystem whose stop overruns its share
of the deadline is named in the log and the exit code is 1, still within STOP_DEADLINE_S of SIGTERM,
whether it honours cancellation (``slow``) or ignores it for ever (``stubborn``: the exit guard).
That fault is the heartbeat's (tests/harness/faulty_stop.py); the broker and the daemon are real.
A connect blocked on a broker that drops SYNs (a real fault) does not hold the exit. And systemd's
TimeoutStopSec lets the deadline run out before it kills."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Iterator

import pytest

from gateway.runner import STOP_DEADLINE_S
from tests.harness.gatewayd import Gatewayd, log_records, telemetry, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until
from tests.harness.processes import REPO


@pytest.mark.parametrize("fault", ["slow", "stubborn"])
def test_a_stop_step_over_its_deadline_exits_1_naming_the_subsystem(fault, mosquitto, tmp_path):
    config, port = write_config(tmp_path, mosquitto.url)
    gateway = Gatewayd(config, port, module="tests.harness.faulty_stop", args=[fault]).wait_ready()
    try:
        publish(mosquitto.port, [("edgefed/gw1/devices/s1/telemetry", telemetry("s1", i)) for i in range(5)])
        gateway.wait_status(lambda s: s["ingest"]["acked"] == 5, 20, "5 messages acked")
        code, seconds, output = gateway.timed_terminate()
    finally:
        gateway.kill()
    assert code == 1, output
    assert seconds <= STOP_DEADLINE_S, output
    assert "stop: heartbeat did not stop within" in output
    assert "stopped cleanly" not in output
    if fault == "stubborn":  # its task outlives the stop: named, then the exit guard ends the process
        assert "tasks still running after the stop, abandoned: heartbeat" in output
        assert "exiting with 1 now" in output
    assert len(asyncio.run(log_records(tmp_path / "data-gw1"))) == 5  # what was acked is durable


def test_systemd_lets_the_stop_deadline_run_out_before_it_kills():
    unit = (REPO / "deploy" / "systemd" / "gatewayd.service").read_text()
    timeouts = re.findall(r"^TimeoutStopSec=(\d+)$", unit, flags=re.MULTILINE)
    assert len(timeouts) == 1 and int(timeouts[0]) > STOP_DEADLINE_S


@contextlib.contextmanager
def port_that_drops_syns() -> Iterator[int]:
    """A port on 127.0.0.1 whose accept queue is full, so the kernel drops new SYNs: a connect there
    blocks until its own timeout, as to a broker behind a firewall that drops packets."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        with socket.socket() as probe:  # the fault is in place: a connect does not get through
            probe.settimeout(1.0)
            with pytest.raises(TimeoutError):
                probe.connect(("127.0.0.1", port))
        yield port
    finally:
        for sock in (*fillers, listener):
            sock.close()


def test_a_connect_blocked_on_a_broker_that_drops_syns_does_not_hold_the_exit(tmp_path):
    """paho's connect blocks its thread for up to 10 s; such a thread used to hold the exit."""
    with port_that_drops_syns() as port:
        config, http_port = write_config(tmp_path, f"mqtt://127.0.0.1:{port}")
        gateway = Gatewayd(config, http_port)
        try:
            wait_until(lambda: "gatewayd started" in gateway.output(), 20, "gatewayd started")
            status = gateway.status()["mqtt"]
            assert status["connects"] == status["connect_failures"] == 0  # the first connect hangs
            code, seconds, output = gateway.timed_terminate()
        finally:
            gateway.kill()
    assert code == 0, output
    assert seconds <= STOP_DEADLINE_S, output
    assert "stopped cleanly" in output and "exiting with" not in output
