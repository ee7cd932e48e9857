"""The gateway's side of the model lifecycle (issue 22) through real processes: mosquitto, cloudd, a
`devicesim camera`, gatewayd. The cloudd on this branch does not serve the assignment route yet, so
a small real aiohttp server in front of it serves ``GET /v1/models/{name}/assignment`` as the contract
states it and passes every other request to cloudd (tests/harness/assignment.py); with nothing
assigned it answers 404, as today's cloudd does.

What it shows: the gateway never follows the newest version, only the assignment; each swap is an
INFO line and a ``model_swap`` record that reaches cloudd through the uplink; `gatewayctl services`
names ``scene@<version> (<stage>)``; the heartbeat carries the running version's live figures (the
shadow's agreement among them) and cloudd accepts it; a pin survives a restart and the engine starts
on it; the factory version is pinnable with the cloud gone; a pin that cannot be had runs the
factory model and says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.fleet import GatewayHeartbeat
from tests.camera.test_gatewayd_camera import upload
from tests.harness.assignment import AssignmentProxy
from tests.harness.camera import DevicesimCamera, camera_extra, scene_artifact
from tests.harness.cloud_http import call
from tests.harness.cloudd import cloudd_token, make_cloudd
from tests.harness.gatewayctl import broker_args, ctl, ctl_json
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until
from tests.harness.processes import free_port

pytestmark = pytest.mark.slow  # four processes and a live camera, gatewayd started three times


def swap_records(cloud) -> list[dict[str, Any]]:
    """The model_swap records cloudd has committed from gw1, in log order."""
    bodies = [r.record["body"] for r in cloud.records("gw1") if r.record["kind"] == "event"]
    return [b for b in bodies if b.get("type") == "model_swap"]


def services_text(ctl_args: list[str]) -> str:
    code, out, err = ctl(*ctl_args, "services")
    assert code == 0, (out, err)
    return out


def test_gateway_follows_the_assignment_pins_survive_restarts_and_figures_reach_cloudd(
    tmp_path: Path, mosquitto
) -> None:
    cloud = make_cloudd(tmp_path, gateways=("gw1",), extra_args=("--broker", mosquitto.url))
    cloud.start()
    proxy = AssignmentProxy(cloud.url)
    camera = DevicesimCamera(free_port(), tmp_path / "truth.jsonl", seed=3, fps=5.0)
    extra = (
        f"{camera_extra(camera.port)}ota_poll_interval_s = 1.0\nshadow_every = 2\n"  # inside [camera]
        "[log]\nflush_interval_ms = 50\n"
    )
    config, http_port = write_config(
        tmp_path, mosquitto.url, cloud_url=proxy.url, token=cloudd_token("gw1"), extra=extra
    )
    ctl_args = broker_args(mosquitto.url, timeout_s=20)
    gw = Gatewayd(config, http_port)

    def cam() -> dict[str, Any]:
        return gw.status()["camera"]

    try:
        gw.wait_ready()
        # nothing assigned (404): the factory model keeps running, newer uploads are not followed
        v2 = scene_artifact("2")
        assert upload(cloud.url, v2) == 201
        polls = cam()["updater"]["polls"]
        gw.wait_status(lambda s: s["camera"]["updater"]["polls"] >= polls + 3, 30, "three more checks")
        status = cam()
        assert status["engine"]["active_version"] == "1" and status["updater"]["stage"] == "factory", status
        assert "no assignment from cloudd" in status["updater"]["note"] and "404" in status["updater"]["note"]
        assert "gw1" in proxy.assignments.asked

        # assigned: the gateway swaps, logs it (INFO + a record cloudd receives), and says so
        proxy.assignments.assign(v2, "canary", "canary set gw1")
        gw.wait_status(
            lambda s: s["camera"]["engine"]["active_version"] == "2", 30, "version 2 assigned, running"
        )
        line = "models: scene swapped 1 -> 2 (stage canary): assignment: canary set gw1"
        wait_until(lambda: line in gw.output(), 20, "the swap's INFO line")
        wait_until(lambda: swap_records(cloud), 30, "the swap record uploaded to cloudd")
        swap = swap_records(cloud)[0]
        assert (swap["name"], swap["from"], swap["to"], swap["stage"]) == ("scene", "1", "2", "canary"), swap
        assert swap["reason"] == "assignment: canary set gw1"
        wait_until(lambda: "scene@2 (canary)" in services_text(ctl_args), 20, "gatewayctl services: scene@2")

        # the live figures of version 2, the shadow (version 1) run on every 2nd frame
        status = gw.wait_status(
            lambda s: (s["camera"]["models"].get("scene") or {}).get("shadow_frames", 0) >= 3,
            60,
            "shadow frames compared",
        )
        figures = status["camera"]["models"]["scene"]
        assert (figures["version"], figures["stage"], figures["pinned"]) == ("2", "canary", None)
        assert figures["shadow_agreement"] == 1.0  # the same network under another version
        assert figures["frames"] > 0 and figures["error_rate"] == 0.0 and figures["latency_ms_p50"] > 0
        beat = {"gateway": "gw1", "sent_ts": 1.0, "interval_s": 0.5, "models": status["camera"]["models"]}
        GatewayHeartbeat.model_validate(beat)  # what the heartbeat carries is valid as the protocol says
        metrics = gw.get("/metrics").decode()
        assert "edgefed_gateway_camera_model_shadow_agreement" in metrics
        # cloudd accepts heartbeats that carry them (it refuses a field it does not know: 400)
        sent = gw.status()["heartbeat"]["sent"]
        gw.wait_status(lambda s: s["heartbeat"]["sent"] >= sent + 2, 20, "two more heartbeats accepted")
        assert gw.status()["heartbeat"]["failed"] == 0
        status_code, fleet = call(f"{cloud.url}/v1/fleet", cloud.operator_token)
        assert status_code == 200 and fleet["gateways"][0]["online"], fleet

        # a pin overrides the assignment: the factory version
        view = ctl_json(*ctl_args, "model", "pin", "scene", "1")["data"]["services"]["models"]
        assert view["applied"] is True and "scene@1 (pinned)" in view["detail"], view
        rc, err = gw.terminate()
        assert rc == 0 and "Traceback" not in err, err[-3000:]

        # restart, the cloud still assigning 2: the engine starts on the pin and never runs 2
        gw = Gatewayd(config, http_port).wait_ready()
        status = gw.wait_status(lambda s: s["camera"].get("engine") is not None, 30, "the camera started")
        assert (status["camera"]["engine"]["active_version"], status["camera"]["updater"]["pinned"]) == (
            "1",
            "1",
        )
        assert "models: scene starts with scene@1 (pinned): pin" in gw.output()
        gw.wait_status(
            lambda s: s["camera"]["engine"]["inferred"] >= 5, 30, "frames inferred after the restart"
        )
        status = cam()
        assert status["engine"]["active_version"] == "1" and status["events"]["swaps_logged"] == 0, status
        assert "scene@1 (pinned)" in services_text(ctl_args)

        # unpinned: the assignment again (2 is held locally), then the cloud goes away
        view = ctl_json(*ctl_args, "model", "unpin", "scene")["data"]["services"]["models"]
        assert view["applied"] is True and cam()["engine"]["active_version"] == "2", view
        proxy.stop()
        # the factory version is pinnable offline; a version neither held nor reachable runs the factory
        view = ctl_json(*ctl_args, "model", "pin", "scene", "1")["data"]["services"]["models"]
        assert view["applied"] is True and cam()["engine"]["active_version"] == "1", view
        view = ctl_json(*ctl_args, "model", "pin", "scene", "7")["data"]["services"]["models"]
        assert view["applied"] is False and view["state"] == "pending", view
        assert "pinned 7 is not available" in view["detail"] and "scene@1 (factory)" in view["detail"], view
        assert "pinned 7 is not available" in gw.output()
        rc, err = gw.terminate()
        assert rc == 0 and "Traceback" not in err, err[-3000:]

        # restart offline with that pin: the factory model, and it says why
        gw = Gatewayd(config, http_port).wait_ready()
        status = gw.wait_status(lambda s: s["camera"].get("engine") is not None, 30, "the camera started")[
            "camera"
        ]
        assert (status["engine"]["active_version"], status["updater"]["stage"]) == ("1", "factory"), status
        assert "pinned 7 is not available" in status["updater"]["note"]
    finally:
        gw.kill()
        camera.stop()
        proxy.stop()
        cloud.stop()
