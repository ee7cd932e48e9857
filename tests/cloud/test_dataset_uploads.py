"""Datasets users upload for their jobs, through cloudctl and HTTP against a real cloudd: kept once,
checked (shapes, dtypes, rows, finite values, size), refused with the reason named; jobs naming an
upload are checked against it at submission; the job limits cloudd reports are the ones it enforces."""

from __future__ import annotations

import io
import json
import urllib.request

import numpy as np
import pytest
import torch

from tests.harness.cloud_http import call, http_json_body, raw_http
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import start_cloudd

MAX_BYTES = 200_000
# max-running-jobs 0: jobs stay queued, so no torchrun starts here
LIMITS = ("--max-running-jobs", "0", "--max-job-nproc", "3", "--max-dataset-bytes", str(MAX_BYTES))


@pytest.fixture
def server(tmp_path):
    cloudd = start_cloudd(tmp_path / "c", extra_args=LIMITS)
    yield cloudd
    cloudd.stop()


def npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def classification(rows: int = 40, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(rows, 6)).astype(np.float32), "y": rng.integers(0, 3, size=rows)}


def put(server, name: str, body: bytes, **headers: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{server.url}/v1/datasets/files/{name}",
        data=body,
        method="PUT",
        headers={"Authorization": f"Bearer {OP}", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_upload_list_and_idempotent_put(server, tmp_path):
    path = npz(tmp_path / "blobs.npz", **classification())
    result = server.ctl("datasets", "upload", "blobs", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("blobs: npz, 40 rows,")
    status, meta = call(f"{server.url}/v1/datasets/files/blobs", OP)
    assert status == 200 and meta["x_shape"] == [40, 6] and meta["classes"] == 3 and meta["y_shape"] == [40]
    assert server.ctl("datasets", "upload", "blobs", str(path)).returncode == 0  # the same bytes: a no-op

    other = npz(tmp_path / "other.npz", **classification(seed=1))
    result = server.ctl("datasets", "upload", "blobs", str(other))
    assert (
        result.returncode == 1
        and "409 (dataset_exists: name: dataset 'blobs' holds other bytes" in result.stderr
    )

    buffer = io.BytesIO()
    torch.save({"x": torch.zeros(5, 2)}, buffer)
    (tmp_path / "t.pt").write_bytes(buffer.getvalue())
    assert server.ctl("datasets", "upload", "tensors", str(tmp_path / "t.pt")).returncode == 0

    listing = server.ctl("datasets")
    assert listing.returncode == 0
    lines = listing.stdout.splitlines()
    assert any(line.split()[:4] == ["blobs", "npz", "40", "40x6"] for line in lines)
    assert any(line.split()[:2] == ["tensors", "torch"] for line in lines)  # rows: read when a job runs
    files = json.loads(server.ctl("datasets", "--json").stdout)["files"]["datasets"]
    assert [d["name"] for d in files] == ["blobs", "tensors"]


@pytest.mark.parametrize(
    "arrays, reason",
    [
        ({"x": np.array([[1.0, np.nan]], dtype=np.float32)}, "x: holds NaN or infinite values"),
        ({"x": np.ones((4, 2), dtype=np.int64)}, "x: dtype int64 is not floating point"),
        ({"x": np.ones(4, dtype=np.float32)}, "x: shape (4,) must be (N, features...)"),
        (
            {"x": np.ones((4, 2), dtype=np.float32), "y": np.zeros(3, dtype=np.int64)},
            "y: (3,) must have one row",
        ),
        ({"x": np.ones((2, 2), dtype=np.float32), "y": np.array([[0, 1], [1, 0]])}, "y: integer labels"),
        ({"x": np.ones((2, 2), dtype=np.float32), "y": np.array([0.0, np.inf])}, "y: holds NaN"),
        ({"x": np.ones((2, 2), dtype=np.float32), "z": np.zeros(2)}, "file: unexpected arrays ['z']"),
        ({"y": np.zeros(2)}, "x: the .npz has no array x"),
    ],
)
def test_bad_npz_files_are_refused_naming_the_array(server, tmp_path, arrays, reason):
    result = server.ctl("datasets", "upload", "bad", str(npz(tmp_path / "bad.npz", **arrays)))
    assert result.returncode == 1 and "HTTP 400 (invalid_dataset: " + reason in result.stderr, result.stderr
    assert call(f"{server.url}/v1/datasets/files/bad", OP)[0] == 404


def test_refusals_keep_nothing(server):
    status, doc = put(server, "notzip", b"hello")
    assert (status, doc["error"]) == (400, "invalid_dataset") and "not a zip archive" in doc["detail"]
    status, doc = put(server, "big", b"\0" * (MAX_BYTES + 1))
    assert (status, doc["error"]) == (413, "too_large")
    body = _npz_bytes()
    status, doc = put(server, "hashed", body, **{"X-Sha256": "0" * 64})
    assert (status, doc["error"]) == (422, "sha256_mismatch")
    status, doc = put(server, "bad%20name!", body)
    assert (status, doc["error"]) == (400, "invalid")
    assert call(f"{server.url}/v1/datasets/files", None)[0] == 401
    # a connection cut mid-body: nothing kept, no half file left behind
    head = (
        f"PUT /v1/datasets/files/cut HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    raw_http(server.port, head + body[: len(body) // 2], half_close=True)
    assert call(f"{server.url}/v1/datasets/files/cut", OP)[0] == 404
    assert not list((server.data_dir / "uploads" / ".incoming").iterdir())
    status, doc = http_json_body(raw_http(server.port, head.replace(b"Content-Length", b"X-No-Length")))
    assert (status, doc["error"]) == (411, "length_required")
    assert call(f"{server.url}/v1/datasets/files", OP)[1] == {"datasets": []}


def _npz_bytes() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **classification())
    return buffer.getvalue()


def test_jobs_are_checked_against_their_upload_and_the_limits_are_cloudds(server, tmp_path):
    assert put(server, "blobs", _npz_bytes())[0] == 201
    regression = io.BytesIO()
    np.savez(regression, x=np.ones((40, 2), dtype=np.float32), y=np.ones((40, 1), dtype=np.float32))
    assert put(server, "targets", regression.getvalue())[0] == 201
    jobs = f"{server.url}/v1/jobs"
    factory = {"model": "mods:net", "nproc": 2}
    for spec, reason in [
        ({**factory, "dataset": "upload:nope"}, "dataset: no uploaded dataset 'nope'"),
        ({**factory, "dataset": "upload:blobs", "batch_size": 64}, "dataset: upload 'blobs': 40 rows;"),
        (
            {**factory, "dataset": "upload:targets", "batch_size": 8},
            "dataset: upload 'targets': loss cross_entropy needs y",
        ),
        (
            {**factory, "dataset": "upload:blobs", "batch_size": 8, "loss": "mse"},
            "dataset: upload 'blobs': loss mse",
        ),
    ]:
        status, doc = call(jobs, OP, "POST", spec)
        assert (status, doc["error"]) == (400, "invalid_spec") and doc["detail"].startswith(reason), doc
    status, job = call(jobs, OP, "POST", {**factory, "dataset": "upload:blobs", "batch_size": 8})
    assert status == 201 and job["phase"] == "queued" and job["features"] is None and job["live"] == {}
    assert job["elapsed_s"] is None and job["eta_s"] is None

    status, doc = call(jobs, OP, "POST", {"nproc": 4})
    assert (status, doc["error"]) == (400, "invalid_spec") and "limit 3 (--max-job-nproc)" in doc["detail"]
    assert call(jobs, OP)[1]["limits"] == {"max_nproc": 3, "max_running": 0, "max_queued": 16}
    assert server.status()["jobs"]["max_nproc"] == 3
