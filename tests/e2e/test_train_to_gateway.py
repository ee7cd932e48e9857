"""The whole loop, every part real: a running gatewayd infers camera frames and uploads the events and
their JPEGs to cloudd; ``cloudctl train`` trains the scene model on those uploads under torchrun
(2 processes, a few steps); the job registers a version; the gateway does not run it until cloudd
assigns it (issue 22: never the newest; the assignment is served in front of this branch's cloudd by
tests/harness/assignment.py), then its over-the-air path swaps it in and serves inference with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.assignment import AssignmentProxy
from tests.harness.camera import DevicesimCamera
from tests.harness.cloud_http import call
from tests.harness.cloudd import cloudd_token, start_cloudd
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until
from tests.harness.processes import free_port

BATCH, MICROBATCHES, STEPS = 8, 2, 4
FRAMES = 16  # committed frames wanted before training: a minibatch left after the held-out fifth


def camera_config(camera_url: str, blob_dir: Path) -> str:
    return (
        f'blob_dir = "{blob_dir}"\n'  # still inside write_config's [uplink]
        "[log]\nflush_interval_ms = 50\n"
        "[placement]\nenabled = false\n"
        f'[camera]\nenabled = true\ncamera_id = "cam1"\nsource = "{camera_url}"\n'
        "ota_poll_interval_s = 2.0\nopen_timeout_s = 3.0\nread_timeout_s = 3.0\n"
    )


def camera_events(cloud) -> list[dict[str, Any]]:
    return [r.record["body"] for r in cloud.records("gw1") if r.record["kind"] == "event"]


def uploaded_frames(cloud) -> list[dict[str, Any]]:
    """Camera events in cloudd's store whose JPEG blob is committed there."""
    blobs = cloud.data_dir / "blobs" / "gw1"
    return [e for e in camera_events(cloud) if "blob" in e and (blobs / e["blob"]["id"]).is_file()]


@pytest.mark.slow  # torchrun
@pytest.mark.timeout(600)  # three daemons, a camera and torchrun on 2 shared cores
def test_job_on_gateway_camera_uploads_reaches_the_gateway(tmp_path: Path, mosquitto) -> None:
    cloud = start_cloudd(tmp_path / "c", gateways=("gw1",), extra_args=("--broker", mosquitto.url))
    proxy = AssignmentProxy(cloud.url)
    camera = DevicesimCamera(free_port(), tmp_path / "truth.jsonl", seed=3, fps=4.0)
    config, http_port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=proxy.url,
        token=cloudd_token("gw1"),
        extra=camera_config(camera.url, tmp_path / "blobs"),
    )
    gateway = Gatewayd(config, http_port)

    def engine() -> dict[str, Any]:
        return gateway.status()["camera"]["engine"]

    try:
        gateway.wait_ready()
        wait_until(lambda: len(uploaded_frames(cloud)) >= FRAMES, 90, f"{FRAMES} frames uploaded to cloudd")
        assert engine()["active_version"] == "1"  # the artifact shipped with the code

        result = cloud.ctl(
            "train",
            "--model",
            "scene_cnn",
            "--gateway",
            "gw1",
            "--nproc",
            "2",
            "--batch-size",
            str(BATCH),
            "--microbatches",
            str(MICROBATCHES),
            "--epochs",
            "50",
            "--max-steps",
            str(STEPS),
            "--wait",
        )
        assert result.returncode == 0, result.stdout + result.stderr + cloud.log_text()[-3000:]
        assert result.stdout.splitlines()[-1] == "job-00001 succeeded: registered scene@job-00001"

        # the version knows what it learned from: frames of gw1's log, labelled by the gateway
        status, listing = call(f"{cloud.url}/v1/models?name=scene")
        assert status == 200 and [m["version"] for m in listing["models"]] == ["job-00001"]
        lineage = listing["models"][0]["lineage"]
        assert lineage["dataset"] == "camera_frames" and lineage["frames"] >= FRAMES
        assert list(lineage["sources"]) == ["gw1"] and lineage["job"] == "job-00001"
        status, metadata = call(f"{cloud.url}/v1/models/scene/job-00001")
        assert (metadata["postprocess"], metadata["input"]["preprocess"]) == ("softmax_labels", "image_rgb01")
        job_dir = cloud.data_dir / "jobs" / "job-00001"  # trained by cloud.training.run on a tensor file
        progress = [json.loads(line) for line in (job_dir / "progress.jsonl").read_text().splitlines()]
        start = next(p for p in progress if p["event"] == "start")
        assert (start["dataset"], start["loss"], start["world"], start["total_steps"]) == (
            "tensor_file",
            "cross_entropy",
            2,
            STEPS,
        )
        rows = start["train_rows"] + start["test_rows"]
        assert sum(lineage["labels"].values()) == lineage["frames"] == rows  # the frames it names, all

        # cloudctl status: the finished job with a full progress bar and the version it registered
        shown = cloud.ctl("status")
        assert shown.returncode == 0, shown.stderr
        done = f"job-00001  succeeded  scene_cnn  [{'#' * 30}]  {STEPS}/{STEPS}"
        assert any(
            line.startswith(done) and line.endswith("-> scene@job-00001")
            for line in shown.stdout.splitlines()
        ), shown.stdout

        # registered, announced, not assigned: the gateway keeps its model
        polls = gateway.status()["camera"]["updater"]["polls"]
        wait_until(lambda: gateway.status()["camera"]["updater"]["polls"] >= polls + 2, 30, "two more checks")
        assert engine()["active_version"] == "1" and gateway.status()["camera"]["updater"]["notices"] >= 1
        # assigned: it swaps it in, and infers with it
        entry = listing["models"][0]
        proxy.assignments.assign_version("scene", "job-00001", entry["sha256"], "canary", "trained on gw1")
        wait_until(lambda: engine()["active_version"] == "job-00001", 60, "gateway runs scene@job-00001")
        updater = gateway.status()["camera"]["updater"]
        assert updater["installed"] == 1 and updater["stage"] == "canary", updater
        wait_until(
            lambda: any(e.get("model_version") == "job-00001" for e in camera_events(cloud)),
            60,
            "events inferred by scene@job-00001 uploaded to cloudd",
        )
    finally:
        gateway.kill()
        camera.stop()
        proxy.stop()
        cloud.stop()
