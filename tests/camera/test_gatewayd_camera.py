"""The camera path through the REAL gatewayd process: `devicesim camera` serves MJPEG, gatewayd ingests,
change-detects and infers it, the events (with their frames as blobs) reach a real cloudd; a model
version assigned to the gateway reaches it (retained MQTT notice from `cloudd --broker`, polling as
fallback) and is swapped in under load without losing a frame; a corrupted and a broken version are
refused while the old one keeps running; a camera that goes away is reconnected. The assignment is
served in front of cloudd by tests/harness/assignment.py (this branch's cloudd has no such route)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from models.artifact import ModelArtifact, build_metadata, save_artifact
from tests.harness.assignment import AssignmentProxy
from tests.harness.camera import DevicesimCamera, GroundTruth, relabel, scene_artifact
from tests.harness.cloudd import OPERATOR_TOKEN, Cloudd, cloudd_token, make_cloudd
from tests.harness.gatewayctl import broker_args, ctl_json
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until
from tests.harness.processes import free_port

# The committed model scores ~1.0 on held-out synthetic frames; the floor leaves room for frames read
# while an object enters (the gateway sees it a little after devicesim drew it).
ACCURACY_FLOOR = 0.8
MATCH_WINDOW_S = 1.0  # as tests/camera/test_camera_stream.py: a label is right if a frame made this
# long before the gateway read it had it as the dominant label
FPS = 5.0

pytestmark = pytest.mark.slow  # four processes, a live camera, three model versions swapped in


def upload(url: str, artifact: ModelArtifact) -> int:
    async def go() -> int:
        form = aiohttp.FormData()
        form.add_field("metadata", artifact.metadata.model_dump_json(), content_type="application/json")
        form.add_field(
            "onnx", artifact.onnx_bytes, content_type="application/octet-stream", filename="model.onnx"
        )
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{url}/v1/models/{artifact.name}",
                data=form,
                headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            ) as response,
        ):
            return response.status

    return asyncio.run(go())


def corrupt_in_registry(cloud: Cloudd, artifact: ModelArtifact, seq: int) -> None:
    """Bit rot in the cloud's store: a listed version whose ONNX bytes no longer hash to its sha256."""
    folder = cloud.data_dir / "models" / artifact.name / artifact.version
    save_artifact(folder, artifact)
    data = bytearray(artifact.onnx_bytes)
    data[len(data) // 2] ^= 0xFF
    (folder / "model.onnx").write_bytes(bytes(data))
    entry = {
        "name": artifact.name,
        "version": artifact.version,
        "sha256": artifact.metadata.sha256,
        "size": artifact.metadata.size,
        "seq": seq,
        "uploaded_ts": time.time(),
    }
    (folder / "registry.json").write_text(json.dumps(entry))


def cloud_events(cloud: Cloudd, gateway: str = "gw1") -> list[dict[str, Any]]:
    """The camera events (the placement markers and sensor results left out)."""
    records = cloud.records(gateway)
    return [r.record["body"] for r in records if r.record["kind"] == "event" and "label" in r.record["body"]]


def blob_committed(cloud: Cloudd, blob_id: str) -> bool:
    request = urllib.request.Request(
        f"{cloud.url}/v1/gateways/gw1/blobs/{blob_id}/status",
        headers={"Authorization": f"Bearer {cloudd_token('gw1')}"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return bool(json.loads(response.read()).get("committed"))


def camera_config(camera_url: str, blob_dir: Path) -> str:
    return (
        f'blob_dir = "{blob_dir}"\n'  # still inside write_config's [uplink]
        "[log]\nflush_interval_ms = 50\n"
        "[placement]\nenabled = false\n"
        f'[camera]\nenabled = true\ncamera_id = "cam1"\nsource = "{camera_url}"\n'
        "ota_poll_interval_s = 2.0\nopen_timeout_s = 3.0\nread_timeout_s = 3.0\n"
        "backoff_initial_s = 0.2\nbackoff_max_s = 1.0\n"
    )


def test_gatewayd_camera_inference_ota_and_reconnect(tmp_path: Path, mosquitto) -> None:
    # --broker: new model versions are announced on MQTT (retained notices)
    cloud = make_cloudd(tmp_path, gateways=("gw1",), extra_args=("--broker", mosquitto.url))
    camera_port = free_port()
    truth = tmp_path / "truth1.jsonl"
    camera = DevicesimCamera(camera_port, truth, seed=3, fps=FPS)
    cloud.start()
    proxy = AssignmentProxy(cloud.url)
    config, http_port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=proxy.url,
        token=cloudd_token("gw1"),
        extra=camera_config(camera.url, tmp_path / "blobs"),
    )
    gw = Gatewayd(config, http_port)

    def cam() -> dict[str, Any]:
        return gw.status()["camera"]

    try:
        gw.wait_ready()
        # (a) detections reach the cloud and agree with the ground truth
        wait_until(lambda: len(cloud_events(cloud)) >= 20, 45, "20 camera events stored by cloudd")
        status = cam()
        assert status["state"] == "running" and status["engine"]["active_version"] == "1", status
        ground_truth = GroundTruth(truth)
        events = cloud_events(cloud)
        correct = sum(
            e["label"] in ground_truth.labels_between(e["capture_ts"] - MATCH_WINDOW_S, e["capture_ts"])
            for e in events
        )
        assert correct / len(events) >= ACCURACY_FLOOR, f"accuracy {correct}/{len(events)}"
        assert all(e["source"] == "cam1" and e["model"] == "scene" for e in events)
        assert status["capture"]["unchanged"] > 0  # change detection kept some frames from inference
        assert blob_committed(cloud, events[0]["blob"]["id"])  # the changed frame's JPEG went up too
        metrics = gw.get("/metrics").decode()
        assert "edgefed_gateway_camera_inference_inferred_total" in metrics
        assert "edgefed_gateway_camera_capture_reconnects_total" in metrics

        # (b) a new version assigned to the gateway is swapped in under load; the notice came over MQTT
        base = scene_artifact()
        # version 1 is the factory model, registered by cloudd at start: the same bytes are there
        assert upload(cloud.url, relabel(base, "1")) == 200  # the version the gateway runs: no swap
        proxy.assignments.assign(relabel(base, "2"))
        assert upload(cloud.url, relabel(base, "2")) == 201
        wait_until(lambda: cam()["engine"]["active_version"] == "2", 20, "version 2 swapped in")
        status = cam()
        assert status["updater"]["notices"] >= 1 and status["updater"]["installed"] == 1, status["updater"]
        wait_until(
            lambda: any(e["model_version"] == "2" for e in cloud_events(cloud)),
            20,
            "events of version 2 in the cloud",
        )

        # (c) a corrupted version (bytes no longer match the listed sha256) and a version that does not
        # load are refused; version 2 keeps running and frames keep flowing
        corrupt_in_registry(cloud, relabel(base, "3"), seq=3)
        proxy.assignments.assign(relabel(base, "3"))
        wait_until(lambda: cam()["updater"]["refused"] >= 1, 20, "corrupted version 3 refused")
        assert "hash_mismatch" in cam()["updater"]["last_error"]
        broken = build_metadata(
            b"not an onnx model" * 64,
            **base.metadata.model_dump(exclude={"sha256", "size", "version"}),
            version="4",
        )
        assert upload(cloud.url, ModelArtifact(broken, b"not an onnx model" * 64)) == 201
        proxy.assignments.assign(ModelArtifact(broken, b"not an onnx model" * 64))
        wait_until(lambda: cam()["engine"]["swap_failures"] >= 1, 20, "version 4 failed to load")
        inferred = cam()["engine"]["inferred"]
        wait_until(lambda: cam()["engine"]["inferred"] > inferred + 3, 20, "frames flow after refusals")
        status = cam()
        assert status["engine"]["active_version"] == "2" and status["updater"]["refused"] == 2, status
        assert "load_failed" in status["updater"]["last_error"]  # the latest refusal: version 4

        # the control plane: pin version 1 (applied: it runs when the answer comes), then unpin
        ctl = broker_args(mosquitto.url, timeout_s=20)
        view = ctl_json(*ctl, "model", "pin", "scene", "1")["data"]["services"]["models"]
        assert view["applied"] is True and cam()["engine"]["active_version"] == "1", view
        view = ctl_json(*ctl, "model", "unpin", "scene")["data"]["services"]["models"]
        assert view["applied"] is True and cam()["updater"]["pinned"] is None, view
        # the assigned version (4) was refused before: the updater does not fetch it again
        assert cam()["engine"]["active_version"] == "1"
        maps = Path(f"/proc/{gw.proc.pid}/maps").read_text()
        assert "onnxruntime" in maps and "libtorch" not in maps  # inference without torch

        # (d) the camera goes away and comes back: the source reconnects and frames flow again
        camera.kill()
        wait_until(lambda: cam()["capture"]["reconnects"] >= 1, 20, "capture noticed the lost camera")
        read_before = cam()["capture"]["frames_read"]
        camera = DevicesimCamera(camera_port, tmp_path / "truth2.jsonl", seed=1, fps=FPS)
        wait_until(lambda: cam()["capture"]["frames_read"] > read_before + 5, 30, "frames after reconnect")
        assert cam()["capture"]["state"] == "streaming"

        # no frame lost: every delivered frame was inferred, logged and uploaded
        camera.stop()
        wait_until(lambda: cam()["engine"]["pending"] == 0 and cam()["capture"]["queued"] == 0, 20, "idle")
        status = cam()
        wait_until(
            lambda: len(cloud_events(cloud)) == cam()["events"]["events_logged"],
            30,
            "every event record uploaded",
        )
        engine, capture = status["engine"], status["capture"]
        assert engine["submitted"] == engine["inferred"] + engine["dropped"] + engine["failed"]
        assert engine["dropped"] == engine["failed"] == engine["results_dropped"] == 0, engine
        assert capture["dropped"] == 0 and capture["delivered"] == engine["submitted"], capture
        assert status["events"]["events_logged"] == engine["inferred"]
        # a new source over the control plane: the runtime switches sources, applied; the camera
        # behind it was stopped above, so the truth, once its first open fails, is "degraded"
        view = ctl_json(*ctl, "camera-source", camera.url, "--fps", "2")["data"]["services"]["camera"]
        assert view["applied"] is True and view["state"] in ("running", "degraded"), view
        status = gw.wait_status(lambda s: s["camera"]["state"] == "degraded", 20, "the dead source seen")[
            "camera"
        ]
        assert status["sample_fps"] == 2.0 and status["events"]["source_switches"] == 1, status
        rc, err = gw.terminate()
        assert rc == 0 and "Traceback" not in err, err[-3000:]
    finally:
        gw.kill()
        camera.stop()
        proxy.stop()
        cloud.stop()
