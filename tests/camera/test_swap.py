"""Hot swap under load loses no frame; a corrupted, hash-mismatched or unrunnable model is refused
and the old one keeps running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from gateway.camera.change import ChangeConfig
from gateway.camera.inference import InferenceEngine, feed_from_camera
from gateway.camera.source import CameraSource, CameraSourceConfig
from models.anomaly import INPUT_SPEC as ANOMALY_INPUT
from models.anomaly import anomaly_autoencoder
from models.artifact import ArtifactError, ModelArtifact, artifact_from_bytes, load_artifact, save_artifact
from models.export import export_artifact
from models.inference import InferenceInput
from tests.harness.camera import relabel, scene_artifact, write_video
from tests.harness.poll import eventually

FRAMES = 120


async def test_swap_under_load_loses_no_frame(tmp_path: Path) -> None:
    video = tmp_path / "scene.avi"
    write_video(video, tmp_path / "truth.jsonl", FRAMES)
    v1, v2 = scene_artifact("1"), scene_artifact("2")
    # every frame of the file goes in: no change detection, the reader blocks instead of dropping
    source = CameraSource(
        CameraSourceConfig(
            "cam1",
            str(video),
            full_policy="block",
            queue_size=8,
            change=ChangeConfig(enabled=False),
            encode_jpeg=False,
        )
    )
    engine = InferenceEngine(max_batch=4, queue_size=FRAMES + 1)
    assert (await engine.start(v1)).ok
    await source.start()
    feeder = asyncio.create_task(feed_from_camera(source, engine))
    outcomes = []
    for version in (v2, v1, v2):  # swap while frames keep flowing
        inferred = len(outcomes) * 25 + 20
        await eventually(
            lambda n=inferred: engine.counters.inferred >= n or feeder.done(),
            60,
            f"{inferred} frames inferred before the next swap",
            interval_s=0.01,
        )
        outcomes.append(await engine.swap(version))
    fed = await asyncio.wait_for(feeder, 120)
    await engine.stop(drain_timeout=60)
    await source.stop()
    results = []
    while (result := await engine.next_result(0.01)) is not None:
        results.append(result)
    assert all(outcome.ok for outcome in outcomes)
    assert fed == FRAMES == source.counters.frames_read
    assert engine.counters.dropped == engine.counters.failed == 0
    assert sorted(r.item.seq for r in results) == list(range(FRAMES))
    assert {r.event.model_version for r in results} == {"1", "2"}
    assert engine.counters.swaps == 4  # the first load and three swaps


def test_corrupted_artifact_is_refused_on_load(tmp_path: Path) -> None:
    folder = save_artifact(tmp_path / "scene", scene_artifact())
    onnx = folder / "model.onnx"
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx.write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as error:
        load_artifact(folder)
    assert error.value.reason == "hash_mismatch"


async def test_bad_models_are_refused_and_the_old_one_keeps_running(tmp_path: Path) -> None:
    good = scene_artifact("1")
    engine = InferenceEngine()
    assert (await engine.start(good)).ok
    garbage = relabel(good, "2", onnx_bytes=b"this is not an onnx graph" * 10)  # hash right, bytes wrong
    # a real model whose input is a sensor window, labelled as taking camera frames: fails the probe
    wrong_input = export_artifact(
        anomaly_autoencoder(),
        torch.zeros(1, ANOMALY_INPUT["shape"][1]),
        name="scene",
        version="3",
        input_spec=ANOMALY_INPUT,
        postprocess="softmax_labels",
        labels=list(good.metadata.labels),
    )
    wrong_input = ModelArtifact(
        wrong_input.metadata.model_copy(update={"input": good.metadata.input}), wrong_input.onnx_bytes
    )
    try:
        with pytest.raises(ArtifactError):  # a hash mismatch cannot even become an artifact
            artifact_from_bytes(good.metadata.model_dump_json(), good.onnx_bytes[:-1] + b"\0")
        load_failed = await engine.swap(garbage)
        probe_failed = await engine.swap(wrong_input)
        assert (load_failed.ok, load_failed.reason) == (False, "load_failed")
        assert (probe_failed.ok, probe_failed.reason) == (False, "probe_failed")
        assert engine.counters.swap_failures == 2 and "scene@3" in engine.counters.last_error
        assert engine.active_version == "1"
        engine.submit(InferenceInput("cam1", 0, 0.0, np.zeros((240, 320, 3), np.uint8)))
        result = await engine.next_result(30)
        assert result is not None and result.event.model_version == "1"
    finally:
        await engine.stop()
