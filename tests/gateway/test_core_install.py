"""``pip install edgefed`` without extras (the gateway core, as on a Raspberry-Pi-class box that
relays sensors): none of the heavy packages is there, gatewayd with a sensor-only config runs against
a real mosquitto, and a config (or a control-plane request) that enables the camera or local training
gets the one line naming the extra. Slow: it makes a venv and installs into it (pip's cache helps)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gateway.test_extras import core_contract
from tests.harness.gatewayctl import broker_args, ctl_json
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.install import Installation, install_core
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    yield install_core(tmp_path_factory.mktemp("core-install"))


def test_the_core_install_has_no_heavy_package(core, tmp_path):
    heavy = core_contract()["forbidden_modules"]
    code = f"import importlib.util as u, json; print(json.dumps([m for m in {heavy!r} if u.find_spec(m)]))"
    result = core.run("python", "-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_the_install_ships_the_factory_models(core, tmp_path):
    code = (
        "import models, pathlib\n"
        "root = pathlib.Path(models.__file__).parent\n"
        "print(root, *sorted(str(p.relative_to(root)) for p in root.glob('artifacts/*/*')))"
    )
    root, *artifacts = core.run("python", "-c", code, cwd=tmp_path).stdout.split()
    assert root.startswith(str(core.bin.parent))  # the installed package, not this checkout
    assert artifacts == ["artifacts/scene/metadata.json", "artifacts/scene/model.onnx"]


def test_a_sensor_only_gateway_from_the_core_install_ingests_and_stops(core, mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port, installed=core).wait_ready()
    try:
        messages = [("edgefed/gw1/devices/s1/telemetry", telemetry("s1", seq)) for seq in range(3)]
        publish(mosquitto.port, messages)
        status = gw.wait_status(lambda s: s["ingest"]["acked"] == 3, 20, "3 messages acked")
        assert status["ingest"]["accepted"] == 3 and status["log"]["durable_lsn"] >= 3
        assert status["camera"] is None and status["training"]["torch_loaded"] is False
        rc, out = gw.terminate()
        assert rc == 0, out
    finally:
        gw.kill()


def test_a_camera_enabled_without_the_camera_extra_is_refused_at_start(core, tmp_path):
    config, _ = write_config(tmp_path, "mqtt://127.0.0.1:9")
    config.write_text(config.read_text() + '[camera]\nenabled = true\nsource = "rtsp://127.0.0.1:9/cam"\n')
    result = core.run("gatewayd", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2, result
    assert result.stderr.splitlines() == [
        "gatewayd: [camera] needs the \"camera\" extra: pip install 'edgefed[camera]' "
        "(not installed: numpy, cv2, onnxruntime)"
    ]
    assert not (tmp_path / "data-gw1" / "log").exists()  # refused before anything was opened


def test_gatewayctl_check_from_the_core_install_names_the_missing_extra(core, tmp_path):
    config, _ = write_config(tmp_path, "mqtt://127.0.0.1:9")
    camera = '[camera]\nenabled = true\nsource = "rtsp://127.0.0.1:9/cam"\n'
    config.write_text(config.read_text() + camera)
    result = core.run(
        "gatewayctl", "--timeout", "1", "--json", "check", "--config", str(config), cwd=tmp_path
    )
    assert result.returncode == 1, result
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["extras"] == {
        "name": "extras",
        "status": "FAIL",
        "detail": "[camera] needs the \"camera\" extra: pip install 'edgefed[camera]' "
        "(not installed: numpy, cv2, onnxruntime)",
    }
    config.write_text(config.read_text().replace("enabled = true", "enabled = false"))
    result = core.run(
        "gatewayctl", "--timeout", "1", "--json", "check", "--config", str(config), cwd=tmp_path
    )
    extras = {c["name"]: c for c in json.loads(result.stdout)["checks"]}["extras"]
    assert extras["status"] == "WARN" and "[camera] is off; enabling it fails" in extras["detail"], extras


def test_enabling_camera_or_training_over_mqtt_without_their_extras_fails_and_the_gateway_runs_on(
    core, mosquitto, tmp_path
):
    camera_off = '[camera]\nenabled = false\nsource = "rtsp://127.0.0.1:9/cam"\n'
    config, http_port = write_config(tmp_path, mosquitto.url)
    config.write_text(config.read_text() + camera_off)
    gw = Gatewayd(config, http_port, installed=core).wait_ready()
    try:
        ctl = broker_args(mosquitto.url)
        for service, extra in (("camera", "camera"), ("training", "train")):
            answer = ctl_json(*ctl, "start", service)
            view = answer["data"]["services"][service]
            assert (view["state"], view["applied"]) == ("failed", False)
            fix = f"[{service}] needs the \"{extra}\" extra: pip install 'edgefed[{extra}]'"
            assert view["detail"].startswith(fix), view
        services = {s["service"]: s["state"] for s in ctl_json(*ctl, "services")["data"]["services"]}
        assert services["camera"] == services["training"] == "failed" and services["sensor"] == "running"
        publish(mosquitto.port, [("edgefed/gw1/devices/s1/telemetry", telemetry("s1", 0))])
        wait_until(lambda: gw.status()["ingest"]["acked"] == 1, 20, "the gateway still ingests")
        assert gw.status()["training"]["torch_loaded"] is False
        rc, out = gw.terminate()
        assert rc == 0, out
    finally:
        gw.kill()
