"""Job data and losses: ``[data] dataset = "tensor_file"`` with its loss, the job TOML cloudd writes for
uploaded datasets, camera frames and their lineage, and bad specs refused with the field named."""

from __future__ import annotations

import json

import pytest
import torch

from cloud.ctl import format_status
from cloud.jobs.datasets import frames_from_records
from cloud.jobs.spec import JobSpec, SpecError, job_toml, parse_spec
from cloud.store.dataset import StoredRecord
from cloud.training.data.stream import check_loss_fits, loss_function, tensor_file_stream
from cloud.training.jobfile import JobError, load_job
from models.anomaly import anomaly_autoencoder
from models.scene import scene_cnn
from tests.harness.processes import run_module


def write_job(folder, data: str, train: str = "batch_size = 8\nmicrobatches = 2\n"):
    path = folder / "job.toml"
    path.write_text(f"[data]\n{data}\n[train]\n{train}")
    return path


@pytest.mark.parametrize(
    "data, field",
    [
        ('dataset = "tensor_file"', "needs path"),
        ('dataset = "digits"\nloss = "mse"', "takes no path, loss"),
        ('dataset = "tensor_file"\npath = "d.pt"\nloss = "l1"', "data.loss"),
        ('dataset = "frames"', "data.dataset"),
    ],
)
def test_bad_data_sections_name_the_field(tmp_path, data, field):
    with pytest.raises(JobError, match=field):
        load_job(write_job(tmp_path, data))


def test_cloudd_job_files_train_uploaded_datasets_from_a_tensor_file(tmp_path):
    for model, loss, held_out in (
        ("anomaly_autoencoder", "reconstruction", 0.0),
        ("scene_cnn", "cross_entropy", 0.2),
    ):
        (tmp_path / "job.toml").write_text(job_toml(JobSpec(model=model)))
        job = load_job(tmp_path / "job.toml")
        assert (job.data.dataset, job.data.loss, job.data.test_fraction) == ("tensor_file", loss, held_out)
        assert job.data.path == str(tmp_path / "dataset.pt")  # resolved against the job file
    (tmp_path / "job.toml").write_text(job_toml(JobSpec(model="digits_cnn")))
    assert load_job(tmp_path / "job.toml").data.dataset == "digits"
    assert JobSpec(model="scene_cnn", batch_size=8, microbatches=2).min_rows == 10  # 8 after a fifth held out
    with pytest.raises(SpecError, match="gateways"):
        parse_spec({"model": "digits_cnn", "gateways": ["gw1"]}, max_nproc=4)
    with pytest.raises(SpecError, match="camera_frames"):
        parse_spec({"model": "scene_cnn", "dataset": "sensor_windows"}, max_nproc=4)


def test_tensor_file_streams_follow_their_loss(tmp_path):
    x = torch.randn(40, 48)
    torch.save({"x": x}, tmp_path / "windows.pt")
    data = 'dataset = "tensor_file"\npath = "windows.pt"\nloss = "reconstruction"'
    job = load_job(write_job(tmp_path, data))
    stream = tensor_file_stream(job.data, seed=0, batch_size=8)
    batch_x, batch_y = stream.minibatch(3)
    assert torch.equal(batch_x, batch_y) and stream.steps_per_epoch == 5 and len(stream.test_y) == 0
    check_loss_fits(anomaly_autoencoder(), loss_function(job.data), job.data, batch_x, batch_y)

    torch.save({"x": torch.rand(30, 3, 48, 48), "y": torch.arange(30) % 4}, tmp_path / "frames.pt")
    job = load_job(write_job(tmp_path, 'dataset = "tensor_file"\npath = "frames.pt"\ntest_fraction = 0.2'))
    stream = tensor_file_stream(job.data, seed=0, batch_size=8)
    assert (len(stream.train_y), len(stream.test_y)) == (24, 6) and stream.train_y.dtype == torch.int64
    assert torch.equal(stream.minibatch(0)[0], tensor_file_stream(job.data, 0, 8).minibatch(0)[0])  # seeded
    x, y = stream.minibatch(0)
    check_loss_fits(scene_cnn(), loss_function(job.data), job.data, x, y)
    with pytest.raises(JobError, match=r"data.loss: cross_entropy of the model's output \(8, 4\) against y"):
        check_loss_fits(scene_cnn(), loss_function(job.data), job.data, x, y + 4)  # classes 4..7 of 4
    with pytest.raises(JobError, match=r"model.name: the model does not take x of shape \(8, 48\)"):
        check_loss_fits(scene_cnn(), loss_function(job.data), job.data, torch.randn(8, 48), y)


@pytest.mark.parametrize(
    "tensors, loss, message",
    [
        ({"x": torch.randn(20, 4)}, "cross_entropy", "needs 'y' with one row per row of x"),
        ({"x": torch.randn(20, 4), "y": torch.randn(20)}, "cross_entropy", "integer class indices"),
        ({"x": torch.randn(20, 4), "y": torch.arange(20)}, "mse", "float targets"),
        ({"x": torch.arange(20).view(10, 2)}, "reconstruction", "must hold"),
        ({"x": torch.randn(4, 4)}, "reconstruction", "batch_size: 8 > the 4 training rows"),
    ],
)
def test_tensor_files_that_do_not_fit_the_job_are_refused(tmp_path, tensors, loss, message):
    torch.save(tensors, tmp_path / "d.pt")
    job = load_job(write_job(tmp_path, f'dataset = "tensor_file"\npath = "d.pt"\nloss = "{loss}"'))
    with pytest.raises(JobError, match=message):
        tensor_file_stream(job.data, seed=0, batch_size=8)


def test_a_bad_data_file_fails_the_job_with_exit_2_and_an_error_line(tmp_path):
    torch.save({"x": torch.randn(32, 48)}, tmp_path / "d.pt")
    path = write_job(tmp_path, 'dataset = "tensor_file"\npath = "d.pt"\nloss = "mse"')
    run = run_module("cloud.training.run", ["--job", str(path)], timeout_s=120)
    assert run.returncode == 2, run.stdout + run.stderr
    last = json.loads((tmp_path / "progress.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "error" and last["code"] == 2 and "needs 'y'" in last["message"]


def _event(
    gateway: str, lsn: int, label: str, blob: str | None, kind: str = "classification"
) -> StoredRecord:
    body = {"type": kind, "source": "cam1", "label": label, "score": 0.9}
    if blob is not None:
        body["blob"] = {"id": blob, "size": 10, "sha256": "0" * 64, "content_type": "image/jpeg"}
    return StoredRecord(gateway, "log1", lsn, {"kind": "event", "device": "cam1", "body": body})


def test_camera_frames_and_lineage_name_exactly_the_frames_used():
    records = [
        _event("gw1", 1, "circle", "b1"),
        _event("gw1", 2, "square", "b2"),
        _event("gw1", 3, "square", "b3"),  # its blob never arrived
        _event("gw1", 4, "circle", None),  # no frame uploaded
        _event("gw1", 5, "unicorn", "b5"),  # not a label of the model
        _event("gw1", 6, "anomaly", "b6", kind="anomaly"),
        _event("gw1", 7, "empty", "b7"),
        _event("gw2", 1, "circle", "c1"),
    ]
    frames, lineage = frames_from_records(
        records, ["circle", "square", "triangle", "empty"], lambda gw, blob: blob != "b3", gateways={"gw1"}
    )
    assert [(f.blob_id, f.label) for f in frames] == [("b1", 0), ("b2", 1), ("b7", 3)]
    assert lineage["sources"] == {"gw1": {"log1": [[1, 2], [7, 7]]}} and lineage["frames_not_uploaded"] == 1
    assert lineage["labels"] == {"circle": 1, "empty": 1, "square": 1}


def test_cloudctl_status_shows_a_progress_bar_per_live_job():
    status = {"gateways": [], "devices": [], "totals": {"records": 0, "batches": 0}}
    jobs = {
        "jobs": [
            {"id": "job-00001", "state": "failed", "spec": {"model": "digits_cnn"}, "progress": None},
            {
                "id": "job-00002",
                "state": "succeeded",
                "spec": {"model": "digits_cnn"},
                "model": None,
                "progress": {"step": 22, "total_steps": 22},
            },
            {
                "id": "job-00003",
                "state": "running",
                "spec": {"model": "scene_cnn"},
                "progress": {"step": 3, "total_steps": 6, "loss": 1.25},
            },
        ],
        "counts": {"running": 1, "queued": 0},
    }
    lines = format_status(status, 0.0, jobs).splitlines()
    assert f"job-00003  running    scene_cnn  [{'#' * 15}{'.' * 15}]  3/6  loss 1.25" in lines
    assert any(line.startswith("job-00002  succeeded") for line in lines)
    assert not any("job-00001" in line for line in lines)  # only the latest finished job
    assert lines[-1] == "jobs: 1 running, 0 queued"


@pytest.mark.slow  # trains a model for real (cloud.training.run in a subprocess)
def test_a_regression_job_reports_held_out_loss_without_accuracy(tmp_path):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 48, generator=generator)
    torch.save({"x": x, "y": x[:, :8].sum(dim=1, keepdim=True)}, tmp_path / "d.pt")
    path = write_job(
        tmp_path,
        'dataset = "tensor_file"\npath = "d.pt"\nloss = "mse"\ntest_fraction = 0.25',
        train="batch_size = 8\nmicrobatches = 2\nmax_steps = 3\n",
    )
    model = 'name = "tests.jobs.test_job_data:tiny_regressor"'
    path.write_text(path.read_text() + f"[model]\n{model}\n")
    run = run_module("cloud.training.run", ["--job", str(path)], timeout_s=120)
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert evals and all(e["accuracy"] is None and e["loss"] > 0 for e in evals)


def tiny_regressor() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(48, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
