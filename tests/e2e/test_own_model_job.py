"""Issue 21, must-show 1: a user's own model factory (a module in this test's temp dir) trained on a
dataset the user uploaded, with the trainer's features on, submitted through ``cloudctl train``.

Every part is real: cloudd on a free port, ``cloudctl datasets upload`` of an .npz written here,
``cloudctl train --file spec.toml`` plus flags, torchrun with 2 processes (1 stage x 2 replicas),
1F1B, adaptive + Gist activation compression, the sync scheduler on the replicated stage, toggle
selection; the job must finish, register a model version, and /v1/jobs/<id> must report every
feature's setting and its live figures.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.harness.cloud_http import call
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import start_cloudd

pytestmark = pytest.mark.slow  # torchrun

FACTORY = '''
from torch import nn


def tiny_cnn():
    """8x8 one-channel images -> 3 classes; ReLU->MaxPool and ReLU->Conv for the Gist encodings."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 3),
    )
'''

# What flags do not say: the spec file carries it (cloudctl train --file, flags on top).
SPEC = """
epochs = 3
batch_size = 32
microbatches = 4
seed = 1

[compression]
window = 2
min_numel = 0  # the tiny model's saved tensors are small: compress them all

[sync]
window = 2

[toggle]
warmup_epochs = 1
"""


def shapes_dataset(rows: int = 200, seed: int = 0) -> dict[str, np.ndarray]:
    """Noisy 8x8 images whose class is the bright quadrant band: top, bottom-left or bottom-right."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=rows)
    x = rng.normal(0.0, 0.3, size=(rows, 1, 8, 8)).astype(np.float32)
    for i, label in enumerate(y):
        rows_of, cols_of = (
            (slice(0, 4), slice(0, 8)) if label == 0 else (slice(4, 8), slice(4 * (label - 1), 4 * label))
        )
        x[i, 0, rows_of, cols_of] += 1.0
    return {"x": x, "y": y}


@pytest.fixture
def server(tmp_path):
    cloudd = start_cloudd(tmp_path / "c")
    yield cloudd
    cloudd.stop()


@pytest.mark.timeout(600)
def test_own_model_on_uploaded_npz_with_every_feature(server, tmp_path):
    models = tmp_path / "mymodels"
    models.mkdir()
    (models / "tinynet.py").write_text(FACTORY)
    np.savez(tmp_path / "shapes.npz", **shapes_dataset())
    (tmp_path / "spec.toml").write_text(SPEC)

    result = server.ctl("datasets", "upload", "shapes", str(tmp_path / "shapes.npz"))
    assert result.returncode == 0, result.stderr

    result = server.ctl(
        "train",
        "--file", str(tmp_path / "spec.toml"),
        "--model", "tinynet:tiny_cnn",
        "--pythonpath", str(models),
        "--dataset", "upload:shapes",
        "--schedule", "1f1b-flush",
        "--nproc", "2",
        "--stages", "1",
        "--replicas", "2",
        "--compression", "adaptive+gist",
        "--sync",
        "--toggle", "0.5",
        "--wait",
        timeout_s=540,
    )  # fmt: skip
    workdir = server.data_dir / "jobs" / "job-00001"
    logs = "".join(
        f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(workdir.glob("*.log")) if p.is_file()
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr + logs
    assert result.stdout.splitlines()[-1] == "job-00001 succeeded: registered tiny_cnn@job-00001"

    status, job = call(f"{server.url}/v1/jobs/job-00001", OP)
    assert status == 200 and job["state"] == "succeeded" and job["phase"] == "succeeded"
    assert job["spec"]["replicas"] == [2] and job["elapsed_s"] > 0
    features = job["features"]
    assert features["compression"] == "adaptive+gist", features
    assert (features["sync"], features["toggle"], features["balance"]) == ("on", "on", "off"), features
    for feature in ("compression", "sync", "toggle"):  # every feature that is on shows live figures
        assert isinstance(job["live"].get(feature), dict) and job["live"][feature], (feature, job["live"])
    assert "balance" not in job["live"] or features["balance"] == "on"

    status, models_doc = call(f"{server.url}/v1/models?name=tiny_cnn")
    entry = models_doc["models"][0]
    assert entry["version"] == "job-00001" and entry["lineage"]["dataset"] == "upload:shapes"
    status, metadata = call(f"{server.url}/v1/models/tiny_cnn/job-00001")
    assert metadata["postprocess"] == "softmax_labels" and metadata["labels"] == ["0", "1", "2"]
    assert metadata["input"]["shape"] == [None, 1, 8, 8]

    events = [json.loads(line) for line in (workdir / "progress.jsonl").read_text().splitlines()]
    phases = [e["phase"] for e in events if e["event"] == "phase"]
    assert "training" in phases, phases
