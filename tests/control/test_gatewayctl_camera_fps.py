"""``gatewayctl camera-source SRC --fps 0`` is refused by the gateway (exit 3, naming the field),
not sent without its rate, which left the camera's rate as it was and said nothing."""

from __future__ import annotations

from tests.harness.gatewayctl import broker_args, ctl, ctl_json
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until


def test_fps_zero_is_refused_not_dropped(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
        args = broker_args(mosquitto.url)
        ctl_json(*args, "camera-source", "rtsp://10.0.0.5/stream1", "--fps", "2")
        for fps in ("0", "-1"):
            code, out, err = ctl(*args, "camera-source", "rtsp://10.0.0.5/other", "--fps", fps)
            assert code == 3 and "sample_fps" in err, (code, out, err)
        camera = ctl_json(*args, "config", "get", "camera")["data"]["config"]
        assert (camera["source"], camera["sample_fps"]) == ("rtsp://10.0.0.5/stream1", 2.0)
    finally:
        gw.kill()
