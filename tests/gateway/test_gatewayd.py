"""gatewayd as a real process against a real mosquitto: ingest, the ack rule, shutdown, lock, HTTP."""

from __future__ import annotations

import asyncio
import json

from protocol.records import decode_record
from protocol.telemetry import MAX_TELEMETRY_BYTES
from tests.harness.gatewayd import Gatewayd, log_records, telemetry, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until
from tests.harness.processes import run_module


def topic(device: str, leaf: str = "telemetry", gw: str = "gw1") -> str:
    return f"edgefed/{gw}/devices/{device}/{leaf}"


def test_ingest_accepts_valid_and_counts_each_rejection(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url, extra='[devices]\nallow = ["sensor-*"]\n')
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        publish(
            mosquitto.port,
            [
                (topic("sensor-1"), telemetry("sensor-1", 0)),
                (topic("sensor-1", leaf="weird"), telemetry("sensor-1", 1)),  # unknown_topic
                (topic("camera-9"), telemetry("camera-9", 0)),  # unknown_device
                (topic("sensor-1"), b"x" * (MAX_TELEMETRY_BYTES + 1)),  # too_large
                (topic("sensor-1"), b"{not json"),  # not_json
                (topic("sensor-1"), telemetry("sensor-1", 2, status="broken")),  # invalid
                (topic("sensor-1"), telemetry("sensor-2", 3)),  # device_mismatch
                (topic("sensor-1"), telemetry("sensor-1", 4)),
            ],
        )
        wait_until(lambda: gw.status()["ingest"]["acked"] == 8, 20, "all 8 messages acked")
        # the sensor window closed (its results logged): nothing more is appended, the backlog is still
        status = gw.wait_status(lambda s: s["ingest"]["windows_open"] == 0, 20, "the window closed")
        assert status["ingest"]["accepted"] == 2
        assert status["ingest"]["rejected_by_reason"] == {
            "unknown_topic": 1,
            "unknown_device": 1,
            "too_large": 1,
            "not_json": 1,
            "invalid": 1,
            "device_mismatch": 1,
            "log_full": 0,
        }
        assert status["ingest"]["accepted"] == 2 and status["log"]["durable_lsn"] >= 2
        assert status["mqtt"]["messages_in"] == 8
        metrics = gw.get("/metrics").decode()
        assert 'edgefed_gateway_ingest_rejected_total{reason="not_json"} 1.0' in metrics
        assert "edgefed_gateway_ingest_accepted_total 2.0" in metrics
        # 2 samples, the start marker (+ results if aggregated here); the gauge shows what /status does,
        # read together (a plan record, when the monitor calls the unreachable cloud down, adds one)
        wait_until(
            lambda: (
                (backlog := gw.status()["uplink"]["backlog"]) >= 3
                and f"edgefed_gateway_uplink_backlog {backlog}.0" in gw.get("/metrics").decode()
            ),
            10,
            "the backlog gauge showing the uplink's backlog",
        )
        rc, err = gw.terminate()
        assert rc == 0, err
        assert "gw=gw1" in err  # the log format names the gateway
    finally:
        gw.kill()
    records = asyncio.run(log_records(tmp_path / "data-gw1"))
    assert [decode_record(data).body["seq"] for _, data in records] == [0, 4]
    assert {decode_record(data).device for _, data in records} == {"sensor-1"}


def test_unacked_messages_are_redelivered_after_a_kill(mosquitto, tmp_path):
    # A 10 s flush interval: the messages reach the daemon but no epoch closes before the kill,
    # so none is durable and none may have been acked.
    config, http_port = write_config(tmp_path, mosquitto.url, extra="[log]\nflush_interval_ms = 10000\n")
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        publish(mosquitto.port, [(topic("s1"), telemetry("s1", i)) for i in range(20)])
        wait_until(lambda: gw.status()["mqtt"]["messages_in"] == 20, 20, "20 messages in")
        assert gw.status()["ingest"]["acked"] == 0
    finally:
        gw.kill()  # SIGKILL: no flush, no ack
    assert asyncio.run(log_records(tmp_path / "data-gw1")) == []

    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        wait_until(lambda: gw.status()["ingest"]["acked"] >= 20, 20, "redelivered messages acked")
        rc, err = gw.terminate()
        assert rc == 0, err
    finally:
        gw.kill()
    seqs = sorted(decode_record(d).body["seq"] for _, d in asyncio.run(log_records(tmp_path / "data-gw1")))
    assert seqs == list(range(20))


def test_sigterm_flushes_acks_and_publishes_offline(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url, extra="[log]\nflush_interval_ms = 10000\n")
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        publish(mosquitto.port, [(topic("s1"), telemetry("s1", i)) for i in range(5)])
        wait_until(lambda: gw.status()["mqtt"]["messages_in"] == 5, 20, "5 messages in")
        rc, err = gw.terminate()
        assert rc == 0, err
    finally:
        gw.kill()
    assert len(asyncio.run(log_records(tmp_path / "data-gw1"))) == 5
    # acked at shutdown: a fresh run of the same gateway gets nothing redelivered
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        status = run_module(
            "gateway.ctl", ["--broker", mosquitto.url, "--gateway", "gw1", "status", "--json"]
        )
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["state"] == "online"
        publish(mosquitto.port, [(topic("s1"), telemetry("s1", 99))])
        wait_until(lambda: gw.status()["ingest"]["acked"] == 1, 20, "one new message acked")
        assert gw.status()["mqtt"]["messages_in"] == 1
        rc, err = gw.terminate()
        assert rc == 0, err
    finally:
        gw.kill()
    offline = run_module("gateway.ctl", ["--broker", mosquitto.url, "--gateway", "gw1", "status", "--json"])
    assert json.loads(offline.stdout)["state"] == "offline"


def test_second_daemon_on_the_same_data_dir_is_refused(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        second_config = tmp_path / "second.toml"
        second_config.write_text(config.read_text().replace(f":{http_port}", ":1"))
        second = run_module("gateway.daemon", ["--config", str(second_config)], timeout_s=20)
        assert second.returncode == 2
        assert "in use by another gatewayd" in second.stderr
        assert gw.proc.poll() is None
    finally:
        gw.kill()


def test_invalid_config_names_the_field(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('gateway_id = "gw1"\ndata_dir = "d"\n[log]\nflush_interval_ms = -5\n')
    result = run_module("gateway.daemon", ["--config", str(config)], timeout_s=20)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "log.flush_interval_ms" in lines[0]
