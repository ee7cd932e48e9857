"""Foundation end to end: simulated sensors -> real Mosquitto -> real gatewayd -> real cloudd.

3 sensors x 1000 QoS 1 messages must be stored in the cloud exactly once, also when cloudd or
gatewayd is SIGKILLed halfway and restarted.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from devices.sensors import SentRecord
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until
from tests.harness.sensors import assert_stored_exactly_once, start_sensors

SENSORS, MESSAGES = 3, 1000


def _start_sensors(broker_url: str, halfway: threading.Event) -> tuple[threading.Thread, list[SentRecord]]:
    def progress(record: SentRecord) -> None:
        if record.total >= SENSORS * MESSAGES // 2:
            halfway.set()

    return start_sensors(broker_url, count=SENSORS, messages=MESSAGES, rate_hz=250, on_progress=progress)


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
    assert_stored_exactly_once(result[0], cloudd.records("gw1"), SENSORS * MESSAGES)
