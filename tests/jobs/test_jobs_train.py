"""Real torchrun jobs through cloudd: submitted with ``cloudctl train --wait``, followed, exported to
ONNX and registered as a model version with lineage; one of them on data uploaded by gateways."""

from __future__ import annotations

import json

import pytest

from tests.harness.cloud_http import call, upload_telemetry
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import start_cloudd

pytestmark = pytest.mark.slow  # torchrun jobs


@pytest.fixture
def server(tmp_path):
    cloudd = start_cloudd(tmp_path / "c")
    yield cloudd
    cloudd.stop()


@pytest.mark.timeout(600)
def test_cloudctl_train_digits_registers_a_version_with_lineage(server):
    result = server.ctl("train", "--model", "digits_cnn", "--nproc", "2", "--epochs", "1", "--wait")
    assert result.returncode == 0, result.stdout + result.stderr + server.log_text()[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "job-00001"
    assert lines[-1] == "job-00001 succeeded: registered digits@job-00001"
    assert any(line.startswith("[") and "22/22" in line for line in lines)  # the plain progress lines

    status, models = call(f"{server.url}/v1/models?name=digits")
    assert status == 200 and [m["version"] for m in models["models"]] == ["job-00001"]
    lineage = models["models"][0]["lineage"]
    assert lineage["job"] == "job-00001" and lineage["dataset"] == "digits" and lineage["nproc"] == 2
    status, metadata = call(f"{server.url}/v1/models/digits/job-00001")
    assert metadata["notes"]["test_accuracy"] > 0.1 and metadata["postprocess"] == "softmax_labels"

    listing = json.loads(server.ctl("jobs", "--json").stdout)
    job = listing["jobs"][0]
    assert job["state"] == "succeeded" and job["progress"]["step"] == job["progress"]["total_steps"] == 22
    assert job["model"]["version"] == "job-00001"
    assert "digits  job-00001" in server.ctl("models").stdout

    server.restart()  # the history is in SQLite: a new cloudd shows the same job
    status, again = call(f"{server.url}/v1/jobs/job-00001", OP)
    assert status == 200 and again["state"] == "succeeded" and again["lineage"] == job["lineage"]
    assert again["progress"]["step"] == 22  # read back from the job's progress file
    watch = server.ctl("watch", "job-00001")
    assert watch.returncode == 0 and "state: succeeded" in watch.stdout


@pytest.mark.timeout(600)
def test_job_on_gateway_uploads_trains_the_anomaly_model(server):
    for device in ("soil-1", "soil-2"):
        first = 1 if device == "soil-1" else 1001
        for start in range(first, first + 120, 40):  # batches of 40, as the uplink sends them
            assert upload_telemetry(server, "gw1", "0123abcd", device, start, 40)[0] == 200
    assert upload_telemetry(server, "gw2", "0123abcd", "soil-7", 1, 40)[0] == 200

    result = server.ctl(
        "train",
        "--model",
        "anomaly_autoencoder",
        "--gateway",
        "gw1",
        "--nproc",
        "2",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--microbatches",
        "4",
        "--wait",
    )
    assert result.returncode == 0, result.stdout + result.stderr + server.log_text()[-3000:]
    assert result.stdout.splitlines()[-1] == "job-00001 succeeded: registered anomaly@job-00001"

    status, models = call(f"{server.url}/v1/models?name=anomaly")
    lineage = models["models"][0]["lineage"]
    # 120 readings per device, windows of 16 every 8: 14 windows each, every record inside one
    assert lineage["dataset"] == "sensor_windows" and lineage["windows"] == 28 and lineage["records"] == 240
    assert lineage["sources"] == {"gw1": {"0123abcd": [[1, 120], [1001, 1120]]}}
    assert lineage["job"] == "job-00001"
    status, metadata = call(f"{server.url}/v1/models/anomaly/job-00001")
    assert metadata["postprocess"] == "reconstruction_error" and metadata["threshold"] > 0
