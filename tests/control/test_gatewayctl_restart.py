"""``gatewayctl restart SERVICE`` against a real mosquitto and a real gatewayd: the service stops and
starts again with its desired config, which does not change (nor the revision); the answer is the
state after the restart, an ``events`` message says it happened, and a stopped service is not
restarted (started) by it."""

from __future__ import annotations

import json
import threading

from tests.harness.camera import camera_extra
from tests.harness.gatewayctl import broker_args, ctl, ctl_json
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.mqtt import client, publish, subscribe
from tests.harness.poll import wait_until
from tests.harness.processes import free_port


def test_restart_sensor_keeps_its_config_and_refuses_a_stopped_one(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    events: list[dict] = []
    heard = threading.Event()
    listener = client()
    listener.on_message = lambda c, u, message: (events.append(json.loads(message.payload)), heard.set())
    listener.connect("127.0.0.1", mosquitto.port)
    listener.loop_start()
    try:
        subscribe(listener, "edgefed/gw1/services/sensor/events")
        args = broker_args(mosquitto.url)
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
        code, out, err = ctl(*args, "restart", "sensor")
        assert code == 0 and out.startswith("sensor restarted: running, applied: True"), (out, err)
        answer = ctl_json(*args, "restart", "sensor")
        assert answer["revision"] == 0 and answer["data"]["state"] == "running", answer
        assert answer["data"]["config"] == {"enabled": True, "allow": ["*"]}
        wait_until(lambda: len(events) >= 2, 10, "the two restarts' events")
        assert [(e["op"], e["state"], e["revision"]) for e in events] == [
            ("service.restart", "running", 0)
        ] * 2
        publish(mosquitto.port, [("edgefed/gw1/devices/s1/telemetry", telemetry("s1", 1))])
        gw.wait_status(lambda s: s["ingest"]["accepted"] == 1, 20, "telemetry taken after the restart")

        assert ctl_json(*args, "stop", "sensor")["revision"] == 1
        code, out, err = ctl(*args, "restart", "sensor")
        assert code == 3 and "refused (conflict): service: sensor is stopped" in err, (out, err)
        view = ctl_json(*args, "config", "get", "sensor")
        assert view["revision"] == 1 and view["data"]["state"] == "stopped", view  # nothing started
        status = gw.status()["control"]
        assert status["changes"] == 1 and status["refused_by_reason"] == {"conflict": 1}, status
    finally:
        listener.disconnect()
        listener.loop_stop()
        gw.kill()


def test_restart_camera_starts_its_capture_and_model_again(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url, extra=camera_extra(free_port()))
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        gw.wait_status(lambda s: s["camera"]["events"]["starts"] == 1, 30, "the camera started once")
        answer = ctl_json(*broker_args(mosquitto.url, timeout_s=30), "restart", "camera")
        assert answer["revision"] == 0 and answer["data"]["config"]["enabled"] is True, answer
        assert answer["data"]["state"] in ("running", "degraded"), answer  # its source is dead: degraded
        status = gw.wait_status(
            lambda s: s["camera"]["events"]["starts"] == 2, 30, "the camera started a second time"
        )
        assert status["camera"]["events"]["start_failures"] == 0, status["camera"]
        assert status["control"]["revision"] == 0
    finally:
        gw.kill()
