"""gatewayd runs federated training as its ``training`` service, configured over the control plane.

A real mosquitto, a real cloudd (whose /healthz and /v1/probe make the link good), a real gatewayd
with digits samples in its private data log. ``private=false`` on a good link -> upload raw: torch is
never loaded and the samples reach cloudd as records; ``private=true`` -> train locally: the service
is ``pending`` while torch loads, then its retained ``services/training/state`` says ``running``;
updates go up and cloudd applies them. The decision and its reason are in /status and on /metrics."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from gateway.federated.runner import open_sample_log
from gateway.federated.samples import sample_record
from models.digits import load_digits_split
from protocol.config import TrainingConfig
from protocol.federated import FederatedJob, ModelArch, RoundConfig
from protocol.topics import service_topic
from tests.harness.cloudd import cloudd_token, make_cloudd, start_cloudd
from tests.harness.gatewayctl import broker_args, ctl, ctl_json
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.mqtt import retained
from tests.harness.poll import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # gatewayd loads torch and trains rounds
N_SAMPLES = 120
EXTRA = """[placement]
probe_interval_s = 0.3
goodput_every = 2
replan_interval_s = 0.2
[training]
poll_interval_s = 0.3
retrain_after_s = 2.0
decide_interval_s = 0.5
"""


def gatewayctl(broker_url: str, *args: str) -> dict:
    return ctl_json(*broker_args(broker_url, timeout_s=10), *args)


def operator(cloudd, method: str, path: str, body: bytes | None = None) -> dict:
    request = urllib.request.Request(
        cloudd.url + path,
        data=body,
        method=method,
        headers={"Authorization": f"Bearer {cloudd.operator_token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.loads(response.read())


def retained_training_state(broker_port: int) -> dict:
    """What a subscriber that comes now sees on the retained ``services/training/state``."""
    topic = service_topic("gw1", "training", "state")
    return json.loads(retained(broker_port, [topic], timeout_s=2.0)[topic])


async def write_samples(data_dir: Path) -> None:
    split = load_digits_split(0)
    log = open_sample_log(data_dir, TrainingConfig())
    await log.open()
    for i in range(N_SAMPLES):
        await log.append(sample_record("camera", float(i), split.train_x[i], int(split.train_y[i])))
    await log.flush(wait=True)
    await log.close()


def put_tiny_digits_job(cloudd) -> None:
    """The federated job the gateways join: a 16-wide digits MLP, one local epoch a round."""
    job = FederatedJob(
        model="digits",
        arch=ModelArch(kind="digits_mlp", width=16),
        buffer_k=1,
        onnx_every=0,
        poll_interval_s=0.2,
        round=RoundConfig(local_epochs=1, batch_size=16),
    )
    operator(cloudd, "PUT", "/v1/federated/job", job.model_dump_json().encode())


def samples_stored(cloudd) -> int:
    """Training samples cloudd stored for gw1 (not the other events: sensor results, markers)."""
    return sum(r.record["body"].get("type") == "training_sample" for r in cloudd.records("gw1"))


def test_privacy_flag_over_the_control_plane_decides_raw_or_local(mosquitto, tmp_path: Path) -> None:
    cloudd = start_cloudd(tmp_path / "cloud", gateways=("gw1",))
    gw = None
    try:
        put_tiny_digits_job(cloudd)
        config, http_port = write_config(
            tmp_path, mosquitto.url, cloud_url=cloudd.url, token=cloudd_token("gw1"), extra=EXTRA
        )
        asyncio.run(write_samples(tmp_path / "data-gw1"))
        gw = Gatewayd(config, http_port).wait_ready()
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
        training = gw.status()["training"]
        assert training["enabled"] is False and training["state"] == "stopped"
        assert training["torch_loaded"] is False  # gatewayd without training never imports torch

        answer = gatewayctl(mosquitto.url, "config", "set", "training", '{"enabled": true, "private": false}')
        view = answer["data"]["services"]["training"]
        assert view["applied"] is True and view["detail"].startswith("upload_raw"), view
        wait_until(
            lambda: gw.status()["training"]["forwarder"]["forwarded"] == N_SAMPLES,
            30,
            "raw samples copied to the uplink log",
        )
        training = gw.status()["training"]
        assert training["mode"] == "upload_raw" and "fits the link" in training["reason"], training
        assert training["state"] == "forwarding_raw" and training["torch_loaded"] is False
        wait_until(
            lambda: samples_stored(cloudd) == N_SAMPLES,
            30,
            "raw samples stored by cloudd",
        )

        answer = gatewayctl(mosquitto.url, "config", "patch", "training", '{"private": true}')
        view = answer["data"]["services"]["training"]
        assert view["detail"].startswith("train_locally: private"), view
        assert view["state"] == "pending" and "loading torch" in view["detail"], view  # torch was not loaded
        # once torch has loaded, the retained state says so (no new request: the runtime reported it)
        wait_until(
            lambda: retained_training_state(mosquitto.port)["state"] == "running",
            60,
            "retained training state running after torch loaded",
        )
        state = retained_training_state(mosquitto.port)
        assert state["applied"] is True and state["detail"].startswith("train_locally: private"), state
        assert state["revision"] == view["revision"], (state, view)
        assert gw.status()["control"]["services"]["training"] == "running"
        wait_until(lambda: gw.status()["training"]["client"]["updates_sent"] >= 1, 60, "an update sent")
        training = gw.status()["training"]
        assert training["mode"] == "train_locally" and training["reason"].startswith("private"), training
        assert training["state"] == "training" and training["torch_loaded"] is True
        assert [d["mode"] for d in training["decisions"]] == ["upload_raw", "train_locally"]
        wait_until(
            lambda: operator(cloudd, "GET", "/v1/federated/status")["updates"]["applied"] >= 1,
            30,
            "cloudd applied an update from gatewayd",
        )
        metrics = gw.get("/metrics").decode()
        assert "edgefed_gateway_training_mode_local 1.0" in metrics
        assert "edgefed_gateway_training_updates_sent_total" in metrics
        code, err = gw.terminate()
        assert code == 0, err
    finally:
        if gw is not None:
            gw.kill()
        cloudd.stop()


def test_start_training_on_a_fresh_gatewayd_tells_the_truth(mosquitto, tmp_path: Path) -> None:
    """``start training`` on a gatewayd that never loaded torch: while torch loads in a thread, the
    service re-decides every 0.1 s, and none of those decisions may see the half-imported client module
    (it did: "partially initialized module ... circular import", then ``running`` with that stale
    error). With the cloud down the client backs off: ``degraded`` with its error, everywhere; with the
    cloud up, ``running`` again."""
    cloud = make_cloudd(tmp_path / "cloud", gateways=("gw1",))  # not started yet: the cloud is down
    extra = "[training]\ndecide_interval_s = 0.1\npoll_interval_s = 0.3\n"
    config, http_port = write_config(
        tmp_path, mosquitto.url, cloud_url=cloud.url, token=cloudd_token("gw1"), extra=extra
    )
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
        assert gw.status()["training"]["torch_loaded"] is False
        view = gatewayctl(mosquitto.url, "start", "training")["data"]["services"]["training"]
        assert view["state"] == "pending" and "loading torch" in view["detail"], view
        status = gw.wait_status(
            lambda s: s["control"]["services"]["training"] not in ("pending", "running"),
            60,
            "training past loading torch, backing off (no cloud)",
        )
        assert status["control"]["services"]["training"] == "degraded", status["control"]
        detail = status["control"]["problems"]["training"]["detail"]
        assert "retrying after: fetch_failed" in detail, detail
        assert status["training"]["state"] == "training", status["training"]
        assert status["training"]["last_error"].startswith("ClientConnectorError"), status["training"]
        assert "partially initialized" not in gw.output() and "Traceback" not in gw.output()
        state = retained_training_state(mosquitto.port)
        assert state["state"] == "degraded" and "fetch_failed" in state["detail"], state
        code, out, _ = ctl(*broker_args(mosquitto.url), "services")
        assert any(line.split()[:2] == ["training", "degraded"] for line in out.splitlines()), out

        cloud.start()  # no federated job: the cloud answers 404, which is no failure
        wait_until(
            lambda: retained_training_state(mosquitto.port)["state"] == "running", 30, "training running"
        )
        assert gw.status()["control"]["problems"] == {}
        assert gw.status()["training"]["last_outcome"]["kind"] == "no_job"
    finally:
        gw.kill()
        cloud.stop()
