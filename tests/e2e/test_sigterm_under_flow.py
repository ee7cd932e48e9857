"""SIGTERM under a full message flow: a real gatewayd on one data dir is started and SIGTERMed 20
times while simulated sensors publish 2,000 QoS 1 messages/s through a real Mosquitto.

Every stop must exit 0 within the documented deadline (docs/gateway.md, "Stopping"), and nothing
the broker acknowledged to the sensors may be lost: a message the gateway acked (PUBACK) without
having it durable is in neither its log nor the broker's queue for its session. What arrives during
a stop waits at the broker for the next run; a last run takes what is left. Then the log must hold
every message the broker acknowledged to the sensors.

Each run first takes a marker (a message from a device not in ``devices.allow``, so it is counted
as rejected) published after it is up: the broker delivers a session's messages in order, so once
the marker is taken the run is subscribed and has taken everything queued while it was down. The
flow runs while gatewayd is up and through its stop (a shared 2-core machine could not also drain
a backlog of every restart), with device ids of its own per run.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest

from devices.sensors import SensorRun, SentRecord, run_sensors
from gateway.runner import STOP_DEADLINE_S
from protocol.records import decode_record
from protocol.topics import telemetry_topic
from tests.harness.gatewayd import Gatewayd, log_records, telemetry, write_config
from tests.harness.mqtt import publish

STOPS = 20
SENSORS, RATE_HZ = 20, 100.0  # 2,000 messages/s in all
TAKEN_BEFORE_STOP = 500  # messages of the live flow a run takes before its SIGTERM
MARKER = "marker"  # not in devices.allow


class Flow:
    """One run's sensors (device ids ``<prefix>-000``...), publishing until ``stop``."""

    def __init__(self, broker_url: str, prefix: str) -> None:
        run = SensorRun(
            broker=broker_url,
            count=SENSORS,
            rate_hz=RATE_HZ,
            duration_s=None,
            prefix=prefix,
            dropout_probability=0.0,
        )
        self._stop = threading.Event()
        self._sent: list[SentRecord] = []
        self._thread = threading.Thread(target=lambda: self._sent.append(run_sensors(run, self._stop)))
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> SentRecord:
        """Stop publishing; what the broker acknowledged."""
        self._stop.set()
        self._thread.join(60)
        assert self._sent, "the sensors failed (see the log above)"
        return self._sent[0]


def take_marker(gateway: Gatewayd, broker_port: int) -> int:
    """Publish a marker and wait until this run has taken it; the messages it accepted by then."""
    publish(broker_port, [(telemetry_topic("gw1", MARKER), telemetry(MARKER, 0))])
    status = gateway.wait_status(
        lambda s: s["ingest"]["rejected_by_reason"]["unknown_device"] == 1, 60, "the marker taken"
    )
    return status["ingest"]["accepted"]


def wait_accepted(gateway: Gatewayd, count: int) -> None:
    gateway.wait_status(lambda s: s["ingest"]["accepted"] >= count, 30, f"{count} messages accepted")


def stop_and_check(gateway: Gatewayd) -> None:
    """SIGTERM; the stop must be clean and within the deadline."""
    code, seconds, output = gateway.timed_terminate()
    assert code == 0, output[-3000:]
    assert seconds <= STOP_DEADLINE_S, f"exit {seconds:.1f}s after SIGTERM: {output[-3000:]}"
    assert "ingest: intake stopped" in output and "stopped cleanly" in output, output[-3000:]


@pytest.mark.slow  # about 90 s: 21 runs of gatewayd
def test_sigterm_under_flow_stops_in_time_and_loses_nothing(mosquitto, tmp_path: Path) -> None:
    config, port = write_config(tmp_path, mosquitto.url, extra='\n[devices]\nallow = ["sensor-*"]\n')
    sent: list[SentRecord] = []
    when = random.Random(19)
    for run in range(STOPS):
        gateway = Gatewayd(config, port)
        flow: Flow | None = None
        try:
            gateway.wait_ready(timeout_s=30)
            before = take_marker(gateway, mosquitto.port)
            flow = Flow(mosquitto.url, f"sensor-r{run:02d}")
            wait_accepted(gateway, before + TAKEN_BEFORE_STOP)
            time.sleep(when.uniform(0, 0.2))  # the scenario: SIGTERM at any point of an epoch
            assert flow.running, "the flow ended before the stop"
            stop_and_check(gateway)
        finally:
            gateway.kill()
            if flow is not None:
                sent.append(flow.stop())

    gateway = Gatewayd(config, port)  # the last run takes what waited at the broker
    try:
        gateway.wait_ready(timeout_s=30)
        take_marker(gateway, mosquitto.port)
        stop_and_check(gateway)
    finally:
        gateway.kill()

    records = asyncio.run(log_records(tmp_path / "data-gw1"))
    logged = {(record.device, record.body["seq"]) for record in (decode_record(data) for _, data in records)}
    acknowledged = {(device, seq) for record in sent for device, seqs in record.sent.items() for seq in seqs}
    assert len(acknowledged) >= STOPS * TAKEN_BEFORE_STOP
    lost = sorted(acknowledged - logged)
    assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged messages lost, e.g. {lost[:10]}"
    assert logged - acknowledged == set(), "records in the log that the broker never acknowledged"
