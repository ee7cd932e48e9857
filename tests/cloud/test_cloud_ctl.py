"""cloudctl status against a real cloudd: the table, --json, and clear failures."""

from __future__ import annotations

import json

from cloud.ctl import format_table
from cloud.ctl.text import format_job_detail
from tests.harness.cloud_http import upload
from tests.harness.cloudd import cloudctl
from tests.harness.processes import free_port


def test_format_table_aligns_columns():
    text = format_table(["NAME", "N"], [["a", 5], ["longer", 123]])
    assert text.splitlines() == ["NAME      N", "a         5", "longer  123"]


def test_status_table_and_json(cloudd):
    upload(cloudd.url, cloudd.token_for("gw1"), "gw1", "abcdef12", [1, 2, 3], device="temp-1")
    upload(cloudd.url, cloudd.token_for("gw2"), "gw2", "abcdef12", [1], device="cam-7")
    result = cloudd.ctl("status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["GATEWAY", "LAST", "SEEN", "RECORDS", "BATCHES", "DUPLICATES"]
    gw1 = next(line for line in lines if line.startswith("gw1 "))
    assert gw1.split()[-3:] == ["3", "1", "0"]
    assert any(line.split()[:3] == ["gw2", "cam-7", "1"] for line in lines)
    assert "total: 4 records in 2 batches" in result.stdout

    result = cloudd.ctl("status", "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc == cloudd.status()


def test_unreachable_and_unauthorized_exit_1(cloudd):
    result = cloudctl("--url", f"http://127.0.0.1:{free_port()}", "status")
    assert result.returncode == 1 and "cannot reach cloudd" in result.stderr
    result = cloudctl("--url", cloudd.url, "--token", "wrong", "status")
    assert result.returncode == 1 and "401" in result.stderr and "unauthorized" in result.stderr


def test_job_detail_shows_phase_times_and_each_features_figures():
    job = {
        "id": "job-00001",
        "state": "running",
        "spec": {"model": "mods:net", "nproc": 2},
        "progress": {"step": 3, "total_steps": 10, "loss": 1.2},
        "phase": "training",
        "elapsed_s": 12.3,
        "eta_s": 30.2,
        "features": {"compression": "adaptive+gist", "sync": "on", "balance": "off"},
        "live": {"compression": {"ratio": 2.1}, "sync": {"blocked_s": 0.1}},
    }
    lines = format_job_detail(job).splitlines()
    assert lines[1].split()[:5] == ["job-00001", "running", "mods:net", "2", "3/10"]
    assert lines[3] == "phase training  elapsed 12.3s  eta 30s"
    assert lines[4].split() == ["compression", "adaptive+gist", "ratio=2.1"]
    assert lines[5].split() == ["sync", "on", "blocked_s=0.1"] and lines[6].split() == ["balance", "off"]
