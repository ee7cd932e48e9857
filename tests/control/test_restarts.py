"""The daemon's lifecycle around the control plane: a change survives SIGKILL and a dead broker,
SIGTERM under load loses no accepted record, SIGHUP refuses a broken file, sd_notify is spoken."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

from gateway.datadir import open_record_log
from protocol.config import load_gateway_config
from protocol.records import decode_record
from tests.harness.gatewayctl import broker_args, ctl
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until
from tests.harness.processes import wait_for_port


def plain_ctl(broker_url: str, *args: str) -> tuple[int, str, str]:
    return ctl(*broker_args(broker_url), *args)


async def logged_seqs(config_path) -> list[int]:
    record_log = open_record_log(load_gateway_config(config_path))
    await record_log.open()
    try:
        records = [decode_record(data) async for _, data in record_log.read(1)]
    finally:
        await record_log.close()
    return [r.body["seq"] for r in records if r.kind == "telemetry"]  # not the sensor windows' results


def test_a_change_survives_sigkill_and_a_restart_with_the_broker_down(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
        code, out, err = plain_ctl(mosquitto.url, "config", "patch", "sensor", '{"allow": ["field-*"]}')
        assert code == 0, err
        code, out, err = plain_ctl(mosquitto.url, "placement", "pin", "camera", "infer", "cloud")
        assert code == 0, err
    finally:
        gw.kill()  # SIGKILL: nothing flushed at exit; the change must already be on disk
    mosquitto.stop()
    gw = Gatewayd(config, http_port)
    try:
        wait_for_port(http_port, timeout_s=20, proc=gw.proc)
        control = gw.status()["control"]
        assert control["revision"] == 2 and gw.status()["mqtt"]["connected"] == 0
        assert control["services"]["sensor"] == "running"
        mosquitto.restart()  # the broker comes back: the stored config is served and published again
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 30, "control plane reconnected")
        code, out, err = plain_ctl(mosquitto.url, "--json", "config", "get", "sensor")
        assert code == 0, err
        assert '"allow":["field-*"]' in out and '"revision":2' in out
        code, out, err = plain_ctl(mosquitto.url, "--json", "config", "get", "placement")
        assert '"pins":{"camera/infer":"cloud"}' in out
        rc, err = gw.terminate()
        assert rc == 0, err
    finally:
        gw.kill()


def test_sigterm_during_heavy_ingest_loses_no_accepted_record(mosquitto, tmp_path):
    total = 3000
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    messages = [(f"edgefed/gw1/devices/s{i % 7}/telemetry", telemetry(f"s{i % 7}", i)) for i in range(total)]
    publisher = threading.Thread(target=publish, args=(mosquitto.port, messages))
    publisher.start()
    try:
        wait_until(lambda: gw.status()["ingest"]["accepted"] >= 300, 60, "ingest under way")
        rc, err = gw.terminate(timeout_s=20)
        assert rc == 0, err[-2000:]
    finally:
        gw.kill()
        publisher.join(120)
    first_run = asyncio.run(logged_seqs(config))
    assert len(first_run) > 0
    # The broker holds what the first run did not acknowledge; the next run takes it.
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        wait_until(lambda: gw.status()["ingest"]["acked"] + len(first_run) >= total, 120, "the rest ingested")
        rc, err = gw.terminate()
        assert rc == 0, err[-2000:]
    finally:
        gw.kill()
    seqs = asyncio.run(logged_seqs(config))
    assert seqs[: len(first_run)] == first_run  # nothing the first run accepted went missing
    assert sorted(set(seqs)) == list(range(total))


def test_sighup_reloads_and_a_broken_file_keeps_the_old_config(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    good = config.read_text()
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        config.write_text(good.replace("[uplink]", "[log]\nflush_interval_ms = -5\n[uplink]"))
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: gw.status()["reload"]["failed"] == 1, 20, "reload refused")
        last = gw.status()["reload"]["last"]
        assert last["ok"] is False and "log.flush_interval_ms" in last["error"]
        assert gw.status()["control"]["revision"] == 0
        config.write_text(good + '[devices]\nallow = ["barn-*"]\n')
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: gw.status()["reload"]["ok"] == 1, 20, "reload applied")
        assert gw.status()["control"]["revision"] == 1
        code, out, err = plain_ctl(mosquitto.url, "devices")
        assert code == 0 and "allow: barn-* (" in out, (out, err)
        rc, err = gw.terminate()
        assert rc == 0
        assert "reload:" in err and "refused, keeping the previous config" in err
        assert "log.flush_interval_ms" in err
    finally:
        gw.kill()


def test_sd_notify_ready_watchdog_reloading_stopping(mosquitto, tmp_path, monkeypatch):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port)
    seen: list[str] = []

    def until(field: str, timeout_s: float = 20.0) -> None:
        """Read notifications until ``field`` has come (the watchdog keeps them coming: a deadline)."""
        deadline = time.monotonic() + timeout_s
        while field not in seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {field} from gatewayd within {timeout_s}s; got {seen}")
            seen.extend(sock.recv(4096).decode().split("\n"))

    try:
        until("READY=1")
        gw.wait_ready()
        until("WATCHDOG=1")
        gw.proc.send_signal(signal.SIGHUP)
        until("RELOADING=1")
        gw.proc.send_signal(signal.SIGTERM)
        until("STOPPING=1")
        assert gw.proc.wait(20) == 0
        assert seen.index("READY=1") < seen.index("RELOADING=1") < seen.index("STOPPING=1")
    finally:
        gw.kill()
        sock.close()
