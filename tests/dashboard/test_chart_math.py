"""The dashboard's pure JavaScript, run in the page cloudd serves (headless Chromium): tick values
and labels, smoothing, the ETA, and the job spec the submit form sends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.dashboard.browser import browser, page_errors
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import start_cloudd

pytestmark = pytest.mark.slow  # a browser

FORM_DEFAULTS = {
    "model": "digits_cnn",
    "dataset": "",
    "nproc": "2",
    "epochs": "1",
    "schedule": "1f1b-flush",
    "vertical_sync": False,
    "stages": "",
    "replicas": "",
    "compression": "off",
    "wire_codec": "fp32",
    "sync": False,
    "balance": False,
    "toggle": "",
    "precision": "fp32",
    "device": "auto",
}


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Iterator[Any]:
    server = start_cloudd(tmp_path_factory.mktemp("chart-math") / "c")
    try:
        with browser() as chromium:
            page = chromium.new_page()
            errors = page_errors(page)
            page.goto(f"{server.url}/?token={OP}#/jobs")
            page.wait_for_selector("#job-form")
            yield page
            assert errors == []
    finally:
        server.stop()


def js(page, expression: str, arg: Any = None) -> Any:
    return page.evaluate(f"(arg) => {expression}", arg)


def test_nice_ticks_are_1_2_5_multiples_inside_the_range(page):
    assert js(page, "scales.niceTicks(0, 1234, 5)") == [0, 200, 400, 600, 800, 1000, 1200]
    assert js(page, "scales.niceTicks(0.013, 0.087, 4)") == [0.02, 0.04, 0.06, 0.08]
    assert js(page, "scales.niceTicks(-3, 3, 3)") == [-2, 0, 2]
    assert js(page, "scales.logTicks(0.004, 30)") == [0.01, 0.1, 1, 10]
    assert js(page, "scales.logTicks(1.3, 2.3)") == [1.5, 2]  # inside one decade: linear steps
    assert js(page, "scales.timeTicks(0, 3600, 4)") == [0, 900, 1800, 2700, 3600]


def test_labels_use_si_suffixes_and_durations(page):
    values = [0, 0.000123, 0.5, 2.25, 999, 12_500, 3_000_000, 1.5e9, -4200]
    assert js(page, "arg.map(scales.fmt)", values) == [
        "0",
        "1.2e-4",
        "0.5",
        "2.25",
        "999",
        "12.5k",
        "3M",
        "1.5G",
        "-4.2k",
    ]
    assert js(page, "[5, 200, 7260, 200000].map(scales.fmtDuration)") == ["5s", "3m 20s", "2h 01m", "2d 7h"]


def test_smoothing_is_a_debiased_ema_and_eta_follows_the_recent_rate(page):
    assert js(page, "scales.ema([[1, 2], [2, 2], [3, 2]], 0.9)") == [[1, 2], [2, 2], [3, 2]]  # no pull to 0
    smoothed = js(page, "scales.ema([[1, 0], [2, 10]], 0.5)")
    assert smoothed[1][1] == pytest.approx(10 * 0.5 / (1 - 0.25))
    assert js(page, "scales.ema([[1, 3]], 0)") == [[1, 3]]
    # 10 steps in 20 s, 90 to go: 180 s
    assert js(page, "scales.etaSeconds([[0, 100], [10, 120]], 100, 20)") == pytest.approx(180)
    assert js(page, "scales.etaSeconds([[5, 100]], 100, 20)") is None


def test_submit_form_sends_only_what_the_user_chose(page):
    assert js(page, "submitForm.specFrom(arg)", FORM_DEFAULTS) == {
        "model": "digits_cnn",
        "nproc": 2,
        "epochs": 1,
        "schedule": "1f1b-flush",
    }
    chosen = {
        **FORM_DEFAULTS,
        "model": "mymodels.nets:tiny",
        "dataset": "upload:shapes",
        "vertical_sync": True,
        "stages": "2",
        "replicas": "1, 2",
        "compression": "adaptive+gist",
        "wire_codec": "bfp8",
        "sync": True,
        "balance": True,
        "toggle": "0.5",
        "precision": "bf16",
        "device": "cpu",
    }
    assert js(page, "submitForm.specFrom(arg)", chosen) == {
        "model": "mymodels.nets:tiny",
        "dataset": "upload:shapes",
        "nproc": 2,
        "epochs": 1,
        "schedule": "1f1b-flush",
        "vertical_sync": True,
        "stages": 2,
        "replicas": [1, 2],
        "compression": {"activations": "adaptive", "gist": True},
        "wire_codec": "bfp8",
        "sync": {"enabled": True},
        "balance": {"enabled": True},
        "toggle": {"enabled": True, "fraction": 0.5},
        "precision": "bf16",
        "device": "cpu",
    }
    refusal = "(() => { try { submitForm.specFrom(arg); return null; } catch (e) { return e.message; } })()"
    assert js(page, refusal, {**FORM_DEFAULTS, "replicas": "1,x"}).startswith("replicas:")
    assert js(page, refusal, {**FORM_DEFAULTS, "stages": "two"}).startswith("stages:")
    assert js(page, refusal, {**FORM_DEFAULTS, "toggle": "1.5"}).startswith("toggle fraction:")
