"""The operator and fleet API of a real cloudd: every endpoint, and each refusal with its clear body."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.harness.cloud_http import call, heartbeat, telemetry_batch, upload_telemetry
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import start_cloudd
from tests.harness.poll import wait_until

OPERATOR_ROUTES = [
    ("GET", "/v1/fleet"),
    ("GET", "/v1/datasets"),
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/job-00001"),
    ("POST", "/v1/jobs/job-00001/cancel"),
    ("GET", "/v1/jobs/job-00001/events"),
]


# max-running-jobs 0: jobs stay queued, so these tests start no torchrun
LIMITS = ("--max-running-jobs", "0", "--max-queued-jobs", "2", "--max-job-nproc", "3")


@pytest.fixture
def server(tmp_path):
    """A cloudd of this test's own (the tests that change its state)."""
    cloudd = start_cloudd(tmp_path / "c", extra_args=LIMITS)
    yield cloudd
    cloudd.stop()


@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """One cloudd for the tests that only read from it or are refused by it: nothing they do changes
    its state (a refusal that did would be the bug they look for)."""
    cloudd = start_cloudd(tmp_path_factory.mktemp("untouched"), extra_args=LIMITS)
    yield cloudd
    cloudd.stop()


@pytest.mark.parametrize("method,path", OPERATOR_ROUTES)
def test_operator_routes_refuse_missing_wrong_and_gateway_tokens(untouched, method, path):
    body = {} if method == "POST" else None
    status, doc = call(untouched.url + path, None, method, body)
    assert (status, doc["error"]) == (401, "unauthorized") and "operator token" in doc["detail"]
    status, doc = call(untouched.url + path, "not-a-token", method, body)
    assert (status, doc["error"]) == (401, "unauthorized") and "not the operator token" in doc["detail"]
    status, doc = call(untouched.url + path, untouched.token_for("gw1"), method, body)
    assert (status, doc["error"]) == (403, "forbidden") and "gw1" in doc["detail"]


def test_heartbeat_refusals_and_fleet(server):
    url = f"{server.url}/v1/gateways/gw1/heartbeat"
    assert call(url, None, "POST", heartbeat("gw1"))[0] == 401
    assert call(url, "wrong", "POST", heartbeat("gw1"))[0] == 401
    status, doc = call(url, server.token_for("gw2"), "POST", heartbeat("gw1"))
    assert (status, doc["error"]) == (403, "forbidden")
    assert "gateway 'gw2' may only be used on /v1/gateways/gw2/" in doc["detail"]
    token = server.token_for("gw1")
    status, doc = call(url, token, "POST", b"{not json")
    assert (status, doc["error"]) == (400, "not_json")
    status, doc = call(url, token, "POST", {**heartbeat("gw1"), "backlog_records": -1})
    assert (status, doc["error"]) == (400, "invalid") and "backlog_records" in doc["detail"]
    status, doc = call(url, token, "POST", {**heartbeat("gw1"), "colour": "red"})
    assert (status, doc["error"]) == (400, "invalid") and "colour" in doc["detail"]
    status, doc = call(url, token, "POST", heartbeat("gw2"))
    assert (status, doc["error"]) == (400, "gateway_mismatch")

    beat = heartbeat("gw1", interval_s=0.5, backlog=42, cloud_tasks=("detect",))
    beat_sent = time.monotonic()
    status, doc = call(url, token, "POST", beat)
    assert status == 200 and doc == {"ok": True, "offline_after_s": 1.5}
    assert (
        call(
            f"{server.url}/v1/gateways/gw2/heartbeat",
            server.token_for("gw2"),
            "POST",
            heartbeat("gw2", interval_s=60),
        )[0]
        == 200
    )
    status, fleet = call(f"{server.url}/v1/fleet", OP)
    assert status == 200 and fleet["totals"] == {
        "gateways": 3,
        "online": 2,
        "degraded": 0,
        "offline": 1,
        "backlog_records": 42,
        "open_alerts": 0,
    }
    rows = {g["id"]: g for g in fleet["gateways"]}
    assert rows["gw1"]["online"] and rows["gw1"]["backlog_records"] == 42
    assert rows["gw1"]["link"]["rtt_ms"] == 40.0
    assert [p["where"] for p in rows["gw1"]["placement"]] == ["gateway", "gateway", "cloud"]
    assert not rows["gw3"]["online"] and rows["gw3"]["last_seen"] is None
    rows = wait_until(
        lambda: {g["id"]: g for g in call(f"{server.url}/v1/fleet", OP)[1]["gateways"]},
        10,
        "gw1 offline after three of its 0.5 s intervals without a heartbeat",
        check=lambda rows: not rows["gw1"]["online"],
    )
    assert time.monotonic() - beat_sent >= 1.5  # not before the third interval has passed
    assert rows["gw2"]["online"]


def test_ingest_with_another_gateways_token_is_refused(server):
    body, key = telemetry_batch("gw1", "abcdef12", "soil-1", 1, 3)
    request = urllib.request.Request(
        f"{server.url}/v1/gateways/gw1/batches",
        data=body,
        method="POST",
        headers={"Idempotency-Key": key, "Authorization": f"Bearer {server.token_for('gw2')}"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert json.loads(refused.value.read())["error"] == "forbidden"
    assert call(f"{server.url}/v1/datasets", OP)[1]["totals"]["records"] == 0


def test_datasets_counts_uploads(server):
    assert upload_telemetry(server, "gw1", "abcdef12", "soil-1", 1, 20)[0] == 200
    assert upload_telemetry(server, "gw2", "abcdef12", "soil-9", 1, 5)[0] == 200
    status, doc = call(f"{server.url}/v1/datasets", OP)
    assert status == 200 and doc["totals"] == {"records": 25, "batches": 2, "devices": 2}
    devices = {(g["id"], d["device"]): d["records"] for g in doc["gateways"] for d in g["devices"]}
    assert devices == {("gw1", "soil-1"): 20, ("gw2", "soil-9"): 5}


def test_jobs_submit_list_get_cancel_and_refusals(server):
    jobs = f"{server.url}/v1/jobs"
    for body, field in [
        ({"epochs": 0}, "epochs"),
        ({"model": "resnet"}, "model"),
        ({"nproc": 4}, "nproc"),
        ({"batch_size": 10, "microbatches": 4}, "batch_size"),
        ({"color": 1}, "color"),
        ({"model": "digits_cnn", "dataset": "sensor_windows"}, "dataset"),
    ]:
        status, doc = call(jobs, OP, "POST", body)
        assert (status, doc["error"]) == (400, "invalid_spec") and field in doc["detail"], (body, doc)
    status, doc = call(jobs, OP, "POST", b"[1, 2")
    assert (status, doc["error"]) == (400, "invalid_spec") and "neither JSON nor TOML" in doc["detail"]

    status, first = call(jobs, OP, "POST", b"epochs = 2\nnproc = 3\n", content_type="application/toml")
    assert status == 201 and first["state"] == "queued" and first["spec"]["epochs"] == 2
    status, second = call(jobs, OP, "POST", {"model": "anomaly_autoencoder", "gateways": ["gw1"]})
    assert status == 201 and second["spec"]["gateways"] == ["gw1"]
    status, doc = call(jobs, OP, "POST", {})
    assert (status, doc["error"]) == (429, "queue_full")

    status, listing = call(jobs, OP)
    assert [j["id"] for j in listing["jobs"]] == [first["id"], second["id"]]
    assert listing["counts"]["queued"] == 2 and listing["counts"]["refused"] == 1
    assert call(f"{jobs}/{first['id']}", OP)[1]["id"] == first["id"]
    status, doc = call(f"{jobs}/job-99999", OP)
    assert (status, doc["error"]) == (404, "not_found")
    status, doc = call(f"{jobs}/{first['id']}/cancel", OP, "POST", b"")
    assert status == 200 and doc["state"] == "cancelled"
    status, doc = call(f"{jobs}/{first['id']}/cancel", OP, "POST", b"")
    assert (status, doc["error"]) == (409, "already_finished")
    status, doc = call(f"{jobs}/job-99999/events", OP)
    assert (status, doc["error"]) == (404, "not_found")
    status, doc = call(f"{jobs}/{first['id']}/events?since=x", OP)
    assert (status, doc["error"]) == (400, "invalid_since")


def test_events_of_a_finished_job_end(server):
    status, job = call(f"{server.url}/v1/jobs", OP, "POST", {})
    call(f"{server.url}/v1/jobs/{job['id']}/cancel", OP, "POST", b"")
    request = urllib.request.Request(
        f"{server.url}/v1/jobs/{job['id']}/events", headers={"Authorization": f"Bearer {OP}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        text = response.read().decode()
    assert "event: state" in text and '"state": "cancelled"' in text
    assert text.endswith("event: end\ndata: {}\n\n")


def test_openapi_documents_every_v1_route(untouched):
    status, doc = call(f"{untouched.url}/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    from cloud.config import CloudConfig
    from cloud.server import build_app

    app = build_app(CloudConfig(data_dir=untouched.data_dir.parent / "unused"))
    served = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.resource.canonical.startswith("/v1/")
    }
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    documented |= {("head", p) for p, ops in doc["paths"].items() if "get" in ops}
    assert served <= documented, served - documented
    assert doc["paths"]["/v1/jobs"]["post"]["requestBody"]
    assert "JobSpec" in doc["components"]["schemas"] and "GatewayHeartbeat" in doc["components"]["schemas"]


def test_models_listing_and_upload_refusals(untouched):
    status, doc = call(f"{untouched.url}/v1/models")  # the factory model, registered at start
    assert status == 200 and [(m["name"], m["stage"], m["factory"]) for m in doc["models"]] == [
        ("scene", "production", True)
    ]
    status, doc = call(f"{untouched.url}/v1/models?name=bad%20name")
    assert status == 400
    status, doc = call(f"{untouched.url}/v1/models/digits", None, "POST", b"x")
    assert status == 401 and doc["error"]
    status, doc = call(f"{untouched.url}/v1/models/digits", untouched.token_for("gw1"), "POST", b"x")
    assert status == 403 and doc["error"]


def test_dashboard_is_served_without_cdn(untouched):
    with urllib.request.urlopen(f"{untouched.url}/", timeout=10) as response:
        html = response.read().decode()
    assert '<script src="/web/app.js"></script>' in html and "http" not in html.replace("http-equiv", "")
    for asset in ("app.js", "api.js", "charts.js", "pages.js", "job.js", "style.css"):
        with urllib.request.urlopen(f"{untouched.url}/web/{asset}", timeout=10) as response:
            text = response.read().decode()
        assert "https://" not in text and "cdn" not in text.lower()
