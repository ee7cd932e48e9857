"""A camera whose source is dead is reported as such, everywhere: the real gatewayd, a real mosquitto,
a real cloudd for the heartbeat, and a real ``devicesim camera`` that comes up later.

While nothing listens at the camera's URL, its capture is in backoff, and the camera service is
``degraded`` with the capture's error in ``/status``, ``gatewayctl services``, the retained
``services/camera/state``, cloudd's fleet view and the log; once the camera serves, it is ``running``
again everywhere."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.camera import DevicesimCamera, camera_extra
from tests.harness.cloud_http import call
from tests.harness.gatewayctl import broker_args, ctl, ctl_json
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.mqtt import retained
from tests.harness.poll import wait_until
from tests.harness.processes import free_port


def fleet_camera(cloudd) -> dict:
    status, doc = call(f"{cloudd.url}/v1/fleet", cloudd.operator_token)
    assert status == 200, doc
    row = next(g for g in doc["gateways"] if g["id"] == "gw1")
    return next(s for s in row["services"] if s["service"] == "camera")


def retained_camera_state(broker_port: int) -> dict:
    topic = "edgefed/gw1/services/camera/state"
    return json.loads(retained(broker_port, [topic], timeout_s=2.0)[topic])


def test_a_dead_camera_source_is_degraded_everywhere_until_it_serves(mosquitto, cloudd, tmp_path: Path):
    camera_port = free_port()  # nothing listens there yet
    config, http_port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=cloudd.url,
        token=cloudd.token_for("gw1"),
        extra=camera_extra(camera_port),
    )
    gw = Gatewayd(config, http_port).wait_ready()
    camera = None
    try:
        status = gw.wait_status(
            lambda s: s["control"]["services"]["camera"] == "degraded", 30, "camera service degraded"
        )
        problem = status["control"]["problems"]["camera"]
        assert problem["applied"] is True and "cannot open" in problem["detail"], problem
        assert status["camera"]["state"] == "degraded" and "cannot open" in status["camera"]["detail"]
        assert status["camera"]["capture"]["open_failures"] >= 1

        views = ctl_json(*broker_args(mosquitto.url), "services")["data"]["services"]
        view = {v["service"]: v for v in views}
        assert view["camera"]["state"] == "degraded" and "cannot open" in view["camera"]["detail"], view
        code, out, _ = ctl(*broker_args(mosquitto.url), "services")
        assert code == 0 and any(line.split()[:2] == ["camera", "degraded"] for line in out.splitlines()), out
        state = retained_camera_state(mosquitto.port)
        assert state["state"] == "degraded" and "cannot open" in state["detail"], state
        wait_until(lambda: fleet_camera(cloudd)["state"] == "degraded", 30, "camera degraded in the fleet")
        assert "cannot open" in fleet_camera(cloudd)["detail"]
        logs = ctl_json(*broker_args(mosquitto.url), "logs", "--limit", "200")["data"]["lines"]  # all kept
        assert any("camera is degraded" in line["message"] for line in logs), (logs, gw.output()[-3000:])

        camera = DevicesimCamera(camera_port, tmp_path / "truth.jsonl", fps=5.0)
        status = gw.wait_status(
            lambda s: s["control"]["services"]["camera"] == "running", 30, "camera service running again"
        )
        assert status["camera"]["state"] == "running" and status["control"]["problems"] == {}, status
        wait_until(
            lambda: retained_camera_state(mosquitto.port)["state"] == "running", 10, "retained state running"
        )
        wait_until(lambda: fleet_camera(cloudd)["state"] == "running", 30, "camera running in the fleet")
    finally:
        gw.kill()
        if camera is not None:
            camera.kill()
