"""The dashboard in headless Chromium (tests/dashboard/browser.py: Debian's ``chromium`` driven by
Playwright's Python package; nothing downloads a browser): the fleet page with 100 heartbeating
gateways, and a job page whose charts grow while a real torchrun job runs. Saves the fleet picture
under the test's tmp dir, or into docs/ (dashboard-fleet.png, linked from the README) with
EDGEFED_UPDATE_SCREENSHOTS=1; the job and models pictures come from test_job_page.py."""

from __future__ import annotations

import time

import pytest

from tests.dashboard.browser import assert_fits, browser, fleet_figures, playwright, screenshot_dir
from tests.harness.cloud_http import call, heartbeat
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import cloudd_token, start_cloudd

pytestmark = pytest.mark.slow  # a browser, and a torchrun job it watches

GATEWAYS = tuple(f"gw{i:03d}" for i in range(1, 101))
SILENT = {i for i in range(len(GATEWAYS)) if i % 13 == 5}  # these never heartbeat: offline


def _heartbeat_fleet(url: str) -> None:
    for i, gateway in enumerate(GATEWAYS):
        if i in SILENT:
            continue
        beat = heartbeat(
            gateway,
            interval_s=60,
            backlog=(i * 37) % 500,
            rtt_ms=20 + (i * 7) % 180,
            cloud_tasks=("detect",) if i % 4 == 0 else (),
            sent_ts=time.time(),
        )
        status, doc = call(f"{url}/v1/gateways/{gateway}/heartbeat", cloudd_token(gateway), "POST", beat)
        assert status == 200, doc


def _points(page, selector: str) -> int:
    value = (
        page.eval_on_selector(selector, "node => node.dataset.points || '0'")
        if page.query_selector(selector)
        else "0"
    )
    return int(value)


@pytest.mark.timeout(600)
def test_dashboard_fleet_and_live_job(tmp_path):
    shots = screenshot_dir(tmp_path)
    server = start_cloudd(tmp_path / "c", gateways=GATEWAYS)
    try:
        _heartbeat_fleet(server.url)
        with browser() as chromium:
            page = chromium.new_page(viewport={"width": 1360, "height": 900})
            # The page is up before the job starts: on a loaded machine a job submitted first could
            # end before the page drew its chart, which then had nothing left to grow by.
            page.goto(f"{server.url}/?token={OP}#/fleet")
            assert "token=" not in page.url  # moved into localStorage, out of the address bar
            page.wait_for_selector("#fleet-table tbody tr", timeout=60_000)
            status, job = call(f"{server.url}/v1/jobs", OP, "POST", {"epochs": 4, "nproc": 2, "log_every": 1})
            assert status == 201
            page.goto(f"{server.url}/#/job/{job['id']}")
            page.wait_for_selector("#chart-loss svg", timeout=240_000)
            first = _points(page, "#chart-loss svg")
            grew = f"() => Number(document.querySelector('#chart-loss svg')?.dataset.points || 0) > {first}"
            try:  # the browser checks it on every animation frame
                page.wait_for_function(grew, timeout=240_000)
            except playwright.TimeoutError:
                raise AssertionError(f"the loss chart stayed at {first} points while the job ran") from None
            assert _points(page, "#chart-throughput svg") > 0 and _points(page, "#chart-timeline svg") > 0
            page.wait_for_selector("#job-state .state-succeeded", timeout=300_000)
            assert "not enabled in this job" in page.inner_text("#panel-compression")
            assert "no federated rounds" in page.inner_text("#panel-rounds")

            page.goto(f"{server.url}/#/fleet")
            page.wait_for_function(  # a page of 50, paged by cloudd
                "document.querySelectorAll('#fleet-table tbody tr').length === 50", timeout=20_000
            )
            figures = fleet_figures(page)
            assert (figures["gateways"], figures["online"], figures["offline"]) == (
                100,
                100 - len(SILENT),
                len(SILENT),
            )
            page.fill("#fleet-filter", "gw01")
            page.wait_for_function("document.querySelectorAll('#fleet-table tbody tr').length === 10")
            page.fill("#fleet-filter", "")
            page.wait_for_function("document.querySelectorAll('#fleet-table tbody tr').length === 50")
            page.click("#fleet-table th[data-key='backlog_records']")
            page.click("#fleet-table th[data-key='backlog_records']")  # descending: biggest backlog first
            page.wait_for_timeout(300)  # not a wait before an assert: the sorted table, for the picture
            page.screenshot(path=str(shots / "dashboard-fleet.png"))
            assert_fits(page, "the fleet page of 100 gateways")

            page.goto(f"{server.url}/#/federated")
            page.wait_for_function(
                "document.getElementById('fed-figures').innerText.includes('no federated job is running')",
                timeout=20_000,
            )
    finally:
        server.stop()
