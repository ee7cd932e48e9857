"""``gatewayctl devices`` against a real mosquitto and a real gatewayd: the devices the ingest heard
from, allowed or not, with their last message, counts and rejections by reason, beside the
allow-list; an allow-list change re-marks them at once."""

from __future__ import annotations

import re

from tests.harness.gatewayctl import broker_args, ctl, ctl_json
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until


def topic(device: str) -> str:
    return f"edgefed/gw1/devices/{device}/telemetry"


def test_devices_heard_from_beside_the_allow_list(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url, extra='[devices]\nallow = ["sensor-*"]\n')
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        args = broker_args(mosquitto.url)
        assert ctl_json(*args, "devices")["data"]["devices"] == []
        publish(
            mosquitto.port,
            [(topic("sensor-1"), telemetry("sensor-1", seq)) for seq in range(3)]
            + [(topic("rogue-9"), telemetry("rogue-9", seq)) for seq in range(2)]
            + [(topic("sensor-2"), b"{not json"), ("edgefed/gw1/devices/sensor-1/status", b"{}")],
        )
        gw.wait_status(lambda s: s["ingest"]["acked"] >= 7, 20, "the 7 messages taken and acked")
        data = ctl_json(*args, "devices")["data"]
        assert data["allow"] == ["sensor-*"] and data["forgotten"] == 0 and data["unattributed"] == 0
        seen = {d["device"]: d for d in data["devices"]}
        assert set(seen) == {"sensor-1", "rogue-9", "sensor-2"}
        assert seen["sensor-1"]["allowed"] is True and seen["sensor-1"]["messages"] == 4
        assert seen["sensor-1"]["accepted"] == 3 and seen["sensor-1"]["rejected"] == {"unknown_topic": 1}
        assert seen["rogue-9"]["allowed"] is False and seen["rogue-9"]["rejected"] == {"unknown_device": 2}
        assert seen["sensor-2"]["rejected"] == {"not_json": 1} and seen["sensor-2"]["accepted"] == 0
        assert all(isinstance(d["last_ts"], float) for d in data["devices"])  # JSON keeps the numbers

        code, out, err = ctl(*args, "devices")
        assert code == 0, err
        rows = {line.split()[0]: line for line in out.splitlines()[1:4]}
        assert re.search(r"^rogue-9\s+no\s+\d+s ago\s+2\s+0\s+0\s+unknown_device 2$", rows["rogue-9"]), out
        assert "allow: sensor-*" in out, out

        ctl_json(*args, "devices", "add", "rogue-*")
        seen = {d["device"]: d for d in ctl_json(*args, "devices")["data"]["devices"]}
        assert seen["rogue-9"]["allowed"] is True
        publish(mosquitto.port, [(topic("rogue-9"), telemetry("rogue-9", 5))])
        wait_until(
            lambda: (
                {d["device"]: d for d in ctl_json(*args, "devices")["data"]["devices"]}["rogue-9"]["accepted"]
                == 1
            ),
            20,
            "rogue-9's message accepted once allowed",
        )
    finally:
        gw.kill()
