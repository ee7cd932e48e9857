"""Foundation end to end: simulated sensors -> real Mosquitto -> real gatewayd -> real cloudd.

3 sensors x 1000 QoS 1 messages must be stored in the cloud exactly once, also when cloudd or
gatewayd is SIGKILLed halfway and restarted.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from devices.sensors import SensorRun, SentRecord, run_sensors
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until

SENSORS, MESSAGES = 3, 1000


def _start_sensors(broker_url: str, halfway: threading.Event) -> tuple[threading.Thread, list[SentRecord]]:
    result: list[SentRecord] = []

    def progress(record: SentRecord) -> None:
        if record.total >= SENSORS * MESSAGES // 2:
            halfway.set()

    def publish() -> None:
        run = SensorRun(
            broker=broker_url,
            count=SENSORS,
            rate_hz=250,
            duration_s=None,
            messages=MESSAGES,
            dropout_probability=0.0,
        )
        result.append(run_sensors(run, on_progress=progress))

    thread = threading.Thread(target=publish, name="sensors")
    thread.start()
    return thread, result


def _assert_exactly_once(sent: SentRecord, stored: list) -> None:
    telemetry = [r for r in stored if r.record["kind"] == "telemetry"]  # not the sensor windows' results
    counts = Counter((r.record["device"], r.record["body"]["seq"]) for r in telemetry)
    expected = {(device, seq) for device, seqs in sent.sent.items() for seq in seqs}
    assert sent.total == SENSORS * MESSAGES
    assert expected - counts.keys() == set(), "records lost"
    assert counts.keys() - expected == set(), "records stored that were never sent"
    duplicated = {key: n for key, n in counts.items() if n > 1}
    assert duplicated == {}, f"{len(duplicated)} records stored more than once"


# the crash variants SIGKILL a daemon halfway (slow); the plain run stays in `make test-fast`
@pytest.mark.parametrize(
    "crash",
    [
        "none",
        pytest.param("cloudd", marks=pytest.mark.slow),
        pytest.param("gatewayd", marks=pytest.mark.slow),
    ],
)
def test_three_sensors_exactly_once(crash: str, mosquitto, cloudd, tmp_path: Path) -> None:
    config, port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=cloudd.url,
        token=cloudd.token_for("gw1"),
        extra='\n[devices]\nallow = ["sensor-*"]\n',
    )
    gateway = Gatewayd(config, port).wait_ready()
    halfway = threading.Event()
    sensors, result = _start_sensors(mosquitto.url, halfway)
    try:
        assert halfway.wait(60), "sensors did not get halfway"
        if crash == "cloudd":
            cloudd.kill()
            cloudd.start()
        elif crash == "gatewayd":
            gateway.kill()
            gateway = Gatewayd(config, port).wait_ready()
        sensors.join(120)
        assert not sensors.is_alive()
        wait_until(
            lambda: len(cloudd.telemetry("gw1")) >= SENSORS * MESSAGES, 120, "all telemetry in the cloud"
        )
        wait_until(lambda: gateway.status()["uplink"]["backlog"] == 0, 30, "gateway log drained")
    finally:
        gateway.kill()
    _assert_exactly_once(result[0], cloudd.records("gw1"))
