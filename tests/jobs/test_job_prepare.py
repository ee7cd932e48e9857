"""A job's prepare step (``python -m cloud.jobs.prepare``, real processes): the uploaded file becomes
the trainer's tensor file, and a model the pipeline cannot cut fails the job saying what a model
must look like."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from cloud.jobs.spec import JobSpec
from cloud.training.jobfile import load_job
from tests.harness.processes import repo_env

MODELS = """
import torch
from torch import nn


def good():
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)

    def forward(self, x):
        return self.a(x.flatten(1))


def not_sequential():
    return Net()


class Split(nn.Module):
    def forward(self, x):
        return x, x


def tuple_layer():
    return nn.Sequential(nn.Flatten(), Split(), nn.Linear(4, 3))


def needs_argument(width):
    return nn.Sequential(nn.Linear(4, width))
"""


def run_prepare(workdir, spec: JobSpec, models_dir, upload=None) -> subprocess.CompletedProcess:
    workdir.mkdir(exist_ok=True)
    (workdir / "spec.json").write_text(spec.model_dump_json())
    env = repo_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(models_dir)])
    args = [sys.executable, "-m", "cloud.jobs.prepare", "--workdir", str(workdir)]
    args += ["--upload", str(upload)] if upload else []
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, cwd=workdir)


@pytest.fixture
def models_dir(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "usermodels.py").write_text(MODELS)
    return folder


def spec_for(model: str, **fields) -> JobSpec:
    return JobSpec(model=f"usermodels:{model}", dataset="upload:d", batch_size=8, microbatches=2, **fields)


def test_an_npz_becomes_the_tensor_file_and_the_job_file_loads(tmp_path, models_dir):
    upload = tmp_path / "d.npz"
    np.savez(upload, x=np.ones((20, 2, 2), dtype=np.float64), y=np.arange(20) % 3)
    result = run_prepare(tmp_path / "w", spec_for("good", stages=2), models_dir, upload)
    assert result.returncode == 0, result.stderr
    tensors = torch.load(tmp_path / "w" / "dataset.pt", weights_only=True)
    assert tensors["x"].dtype == torch.float32 and tensors["y"].dtype == torch.int64
    job = load_job(tmp_path / "w" / "job.toml")
    assert job.partition.stages == [(0, 1), (2, 3)] and job.model.name == "usermodels:good"


@pytest.mark.parametrize(
    "model, stages, message",
    [
        ("not_sequential", 1, "returned Net, not nn.Sequential; a model factory takes no arguments"),
        ("tuple_layer", 1, "model: layer 1 (Split) returns tuple, not one tensor; a model factory"),
        ("needs_argument", 1, "raised TypeError"),
        ("missing", 1, "cannot import 'usermodels:missing'"),
        ("good", 2, None),
    ],
)
def test_models_the_pipeline_cannot_cut_fail_saying_what_a_model_is(
    tmp_path, models_dir, model, stages, message
):
    upload = tmp_path / "d.npz"
    np.savez(upload, x=np.ones((20, 4), dtype=np.float32), y=np.arange(20) % 3)
    result = run_prepare(tmp_path / "w", spec_for(model, stages=stages, nproc=2), models_dir, upload)
    if message is None:
        assert result.returncode == 0, result.stderr
        return
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith("invalid job: ") and message in last, result.stderr


def test_a_bad_torch_file_fails_naming_the_dataset(tmp_path, models_dir):
    buffer = io.BytesIO()
    torch.save({"x": torch.ones(20, 4, dtype=torch.int32)}, buffer)
    (tmp_path / "d.pt").write_bytes(buffer.getvalue())
    result = run_prepare(tmp_path / "w", spec_for("good"), models_dir, tmp_path / "d.pt")
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "dataset: upload 'd': x: dtype int32 is not floating point" in last


def test_too_few_layers_for_the_stages(tmp_path, models_dir):
    upload = tmp_path / "d.npz"
    np.savez(upload, x=np.ones((20, 4), dtype=np.float32), y=np.arange(20) % 3)
    result = run_prepare(tmp_path / "w", spec_for("good", stages=5, nproc=5), models_dir, upload)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "stages: the model has 4 layers, fewer than 5 stages" in last
