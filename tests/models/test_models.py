"""The models package: ONNX export matches torch, artifacts round trip, tiny training runs learn."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.anomaly import INPUT_SPEC as ANOMALY_SPEC
from models.anomaly import anomaly_autoencoder, fit_threshold, reconstruction_error, sensor_windows
from models.anomaly import train_single_process as train_anomaly
from models.artifact import ArtifactError, load_artifact, save_artifact
from models.export import TOLERANCE, export_artifact, export_onnx, max_abs_diff
from models.scene import INPUT_SPEC as SCENE_SPEC
from models.scene import accuracy, scene_cnn, scene_dataset
from models.scene import train_single_process as train_scene


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: extra threads only add contention on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("make_model,shape", [(scene_cnn, (3, 48, 48)), (anomaly_autoencoder, (48,))])
def test_onnx_matches_torch_at_several_batch_sizes(make_model, shape) -> None:
    torch.manual_seed(0)
    model = make_model()
    onnx_bytes = export_onnx(model, torch.rand(1, *shape))
    for batch in (1, 5, 16):  # the batch axis is dynamic
        assert max_abs_diff(onnx_bytes, model, torch.rand(batch, *shape)) <= TOLERANCE


def test_artifact_round_trip_and_tamper(tmp_path: Path) -> None:
    torch.manual_seed(0)
    artifact = export_artifact(
        anomaly_autoencoder(),
        torch.rand(1, 48),
        name="anomaly",
        version="7",
        input_spec=ANOMALY_SPEC,
        postprocess="reconstruction_error",
        labels=["normal", "anomaly"],
        threshold=0.01,
    )
    folder = save_artifact(tmp_path / "a", artifact)
    loaded = load_artifact(folder)
    assert loaded == artifact and loaded.metadata.notes["export_max_abs_diff"] <= TOLERANCE
    (folder / "model.onnx").write_bytes(artifact.onnx_bytes + b"x")
    with pytest.raises(ArtifactError) as error:
        load_artifact(folder)
    assert error.value.reason == "size_mismatch"


def test_scene_dataset_is_deterministic_and_tiny_training_learns() -> None:
    first, again = scene_dataset(5, 64), scene_dataset(5, 64)
    assert torch.equal(first.x, again.x) and torch.equal(first.y, again.y)
    assert list(first.x.shape[1:]) == SCENE_SPEC["shape"][1:]
    torch.manual_seed(0)
    data = scene_dataset(1, 240)
    model = scene_cnn()
    losses = train_scene(model, data, epochs=6)
    assert losses[-1] < losses[0]
    assert accuracy(model, data) > 0.4  # 4 classes: above chance after a few seconds


def test_anomaly_model_flags_anomalous_windows() -> None:
    torch.manual_seed(0)
    model = anomaly_autoencoder()
    train_anomaly(model, sensor_windows(0, 500), epochs=10)
    threshold = fit_threshold(model, sensor_windows(0, 500))
    test = sensor_windows(1, 400, anomaly_fraction=0.3)
    flagged = reconstruction_error(model, test.x) > threshold
    assert float(flagged[test.anomalous].float().mean()) > 0.7
    assert float(flagged[~test.anomalous].float().mean()) < 0.1
