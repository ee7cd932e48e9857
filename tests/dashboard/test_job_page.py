"""The job page and the models page in headless Chromium, against a real cloudd and real torchrun
jobs: every panel has content (a chart, a table, or "off" for a feature the job does not run),
the chart controls work (log loss, smoothing, wall-clock axis), nothing scrolls sideways at
420 px or 1400 px, a missing job says so, an error banner survives the 2 s refresh, and the submit
form shows cloudd's own nproc limit. The job with every trainer feature on (compression, sync,
balance, toggle) needs a cloudd whose job spec takes them (docs/training.md, "Job spec"); a cloudd
that refuses that spec skips that one test, naming the field it refused.
With EDGEFED_UPDATE_SCREENSHOTS=1 the pictures go to docs/ (dashboard-job.png, dashboard-models.png:
the test with the features, when it runs, overwrites the plain job's)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.dashboard.browser import assert_fits, browser, empty_panels, page_errors, screenshot_dir
from tests.harness.camera import scene_artifact
from tests.harness.cloud_http import call
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import Cloudd, start_cloudd
from tests.harness.poll import wait_until

pytestmark = pytest.mark.slow  # a browser, and a torchrun job it shows

FEATURES = ("compression", "sync", "balance", "toggle")
MAX_NPROC = 3  # not cloudd's default (4): the form must show this one
# A job with every trainer feature on, as a user submits it (docs/training.md, "Job spec"): one
# stage replicated on both processes, so the sync scheduler and the balancer have replicas to work on.
FEATURES_SPEC: dict[str, Any] = {
    "model": "digits_cnn",
    "nproc": 2,
    "epochs": 3,
    "log_every": 1,
    "schedule": "1f1b-flush",
    "stages": 1,
    "replicas": [2],
    "compression": {"activations": "adaptive", "gist": True, "window": 2, "min_numel": 0},
    "sync": {"enabled": True, "window": 2},
    "balance": {"enabled": True, "every": 2},
    "toggle": {"enabled": True, "fraction": 0.5, "warmup_epochs": 1},
}
PLAIN_SPEC: dict[str, Any] = {"model": "digits_cnn", "nproc": 2, "epochs": 2, "log_every": 1}


def _cloudd(tmp_path: Path) -> Cloudd:
    return start_cloudd(tmp_path / "c", extra_args=["--max-job-nproc", str(MAX_NPROC)])


def _finished(server: Cloudd, job_id: str) -> dict:
    return wait_until(
        lambda: call(f"{server.url}/v1/jobs/{job_id}", OP)[1],
        400,
        f"job {job_id} to finish",
        check=lambda doc: doc["state"] in ("succeeded", "failed", "cancelled"),
        interval_s=1.0,
    )


def _upload_model_with_long_lineage(server: Cloudd) -> None:
    """A model version whose lineage is as long as one trained on 100 gateways' fragmented logs
    (the models page was 18,629 px wide with such a lineage on one line)."""
    artifact = scene_artifact("lineage-100")
    sources = {
        f"gw{g:03d}": {"telemetry": [[i * 100 + g, i * 100 + g + 40] for i in range(30)]} for g in range(100)
    }
    notes = {
        **artifact.metadata.notes,
        "lineage": {"job": "job-00042", "dataset": "camera_frames", "sources": sources},
    }
    metadata = artifact.metadata.model_copy(update={"notes": notes})

    async def upload() -> int:
        form = aiohttp.FormData()
        form.add_field("metadata", metadata.model_dump_json(), content_type="application/json")
        form.add_field(
            "onnx", artifact.onnx_bytes, content_type="application/octet-stream", filename="m.onnx"
        )
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{server.url}/v1/models/{artifact.name}",
                data=form,
                headers={"Authorization": f"Bearer {OP}"},
            ) as response,
        ):
            return response.status

    assert asyncio.run(upload()) == 201


def _check_job_page(page, job_id: str, features_on: bool) -> None:
    page.wait_for_selector("#job-state .state-succeeded", timeout=400_000)
    page.wait_for_selector("#chart-accuracy svg", timeout=20_000)
    assert empty_panels(page) == []
    for name in FEATURES:
        panel = page.inner_text(f"#panel-{name}")
        if features_on:
            assert page.query_selector(f"#panel-{name} svg"), f"{name} panel has no chart: {panel!r}"
            assert page.inner_text(f"#mode-{name}") not in ("", "off"), panel
        else:
            assert page.inner_text(f"#mode-{name}") == "off" and "not enabled in this job" in panel, panel
    assert "off: no federated rounds" in page.inner_text("#panel-rounds")
    figures = page.inner_text("#job-figures")
    for label in ("elapsed", "ETA", "steps", "precision", "device", "compression"):
        assert label in figures, figures
    assert page.inner_text("#job-phase") == "phase: succeeded"

    # The chart controls: smoothing draws the raw series faint behind, log-scale puts the loss on
    # decades, and the wall-clock axis labels seconds since the start.
    page.fill("#ctl-smooth", "0.8")
    page.wait_for_selector("#chart-loss path.raw")
    page.fill("#ctl-smooth", "0")
    page.wait_for_function("!document.querySelector('#chart-loss path.raw')")
    page.check("#ctl-log")
    page.wait_for_function("document.querySelector('#chart-loss svg').dataset.yscale === 'log'")
    assert int(page.eval_on_selector("#chart-loss svg", "n => n.dataset.points")) > 1
    page.select_option("#ctl-x", "time")
    page.wait_for_function(
        "document.querySelector('#chart-loss svg .axis-label').textContent.startsWith('wall')"
    )
    ticks = page.eval_on_selector_all(
        "#chart-loss svg > text[text-anchor]", "ns => ns.map(n => n.textContent)"
    )
    assert any(t.endswith("s") for t in ticks), ticks
    page.uncheck("#ctl-log")
    page.select_option("#ctl-x", "step")
    page.fill("#ctl-smooth", "0.6")
    assert_fits(page, f"the job page of {job_id}")


def _check_models_page(page, url: str, shots: Path) -> None:
    page.goto(f"{url}/#/models")
    page.wait_for_selector("#models-table tr[data-key='scene@lineage-100']", timeout=20_000)
    assert "job-00042: camera_frames from 100 gateways" in page.inner_text("#models-table")
    assert_fits(page, "the models page, lineage collapsed")
    page.click("#models-table tr[data-key='scene@lineage-100'] summary")
    page.wait_for_selector("#models-table details[open]")
    assert "gw099 (telemetry" in page.inner_text("#models-table")
    assert_fits(page, "the models page, lineage expanded")
    page.set_viewport_size({"width": 1400, "height": 900})
    page.wait_for_timeout(300)  # not a wait before an assert: the page settles for the picture
    page.screenshot(path=str(shots / "dashboard-models.png"))


def _check_missing_job_and_banner(page, url: str) -> None:
    page.goto(f"{url}/#/job/job-99999")
    page.wait_for_selector("#job-missing", timeout=20_000)
    assert "No job job-99999" in page.inner_text("#job-missing")
    assert not page.query_selector("#chart-loss")

    page.goto(f"{url}/#/jobs")
    page.wait_for_selector("#jobs-table tbody tr", timeout=20_000)
    if "limits" in call(f"{url}/v1/jobs", OP)[1]:  # a cloudd that lists its limits: shown at once
        page.wait_for_function(
            f"document.getElementById('job-nproc-limit').textContent === '(max {MAX_NPROC})'"
        )
    # Past the form's own check (max, when known): cloudd refuses, and its limit is the one shown.
    page.eval_on_selector("#job-form", "f => { f.noValidate = true; }")
    page.fill("#job-nproc", str(MAX_NPROC + 1))
    page.click("#job-form button[type=submit]")
    page.wait_for_selector("#error:not([hidden])")
    assert "invalid_spec" in page.inner_text("#error-text") and "nproc" in page.inner_text("#error-text")
    page.wait_for_function(f"document.getElementById('job-nproc-limit').textContent === '(max {MAX_NPROC})'")
    assert page.get_attribute("#job-nproc", "max") == str(MAX_NPROC)
    for _ in range(2):  # two refreshes of the jobs table succeed: the banner stays
        with page.expect_response(
            lambda r: r.url.endswith("/v1/jobs") and r.request.method == "GET" and r.ok
        ):
            pass
    assert page.is_visible("#error") and "nproc" in page.inner_text("#error-text")
    page.click("#error-dismiss")
    assert not page.is_visible("#error")


def _run(tmp_path: Path, spec: dict[str, Any], features_on: bool) -> None:
    shots = screenshot_dir(tmp_path)
    server = _cloudd(tmp_path)
    try:
        status, job = call(f"{server.url}/v1/jobs", OP, "POST", spec)
        assert status == 201, job
        _upload_model_with_long_lineage(server)
        with browser() as chromium:
            page = chromium.new_page(viewport={"width": 1400, "height": 900})
            errors = page_errors(page)
            page.goto(f"{server.url}/?token={OP}#/job/{job['id']}")
            _check_job_page(page, job["id"], features_on)
            assert _finished(server, job["id"])["state"] == "succeeded"
            page.set_viewport_size({"width": 1400, "height": 900})
            page.wait_for_timeout(800)  # not a wait before an assert: the charts redraw for the picture
            # Both tests take the pictures; the one with the features runs last and keeps its own.
            page.screenshot(path=str(shots / "dashboard-job.png"), full_page=True)
            _check_models_page(page, server.url, shots)
            _check_missing_job_and_banner(page, server.url)
            assert errors == []
    finally:
        server.stop()


@pytest.mark.timeout(600)
def test_job_page_of_a_plain_job_says_off_per_feature(tmp_path):
    """A digits job with no trainer feature on: each feature panel says "off"."""
    _run(tmp_path, PLAIN_SPEC, features_on=False)


@pytest.mark.timeout(600)
def test_job_page_with_every_trainer_feature_on(tmp_path):
    """Compression (adaptive + Gist), sync scheduler, rank balancing and toggle selection on: each
    feature panel charts the job's own figures."""
    _run(tmp_path, FEATURES_SPEC, features_on=True)
