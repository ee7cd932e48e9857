"""cloudctl status against a real cloudd: the table, --json, and clear failures."""

from __future__ import annotations

import json

from cloud.ctl import format_table
from cloud.ctl.text import format_job_detail, format_jobs
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
    doc, now = json.loads(result.stdout), cloudd.status()
    # the task runner keeps working between the two calls: its counters are live, its keys are not
    assert doc.pop("tasks").keys() == now.pop("tasks").keys()
    assert doc == now


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


def test_jobs_table_and_detail_show_where_the_scheduler_has_a_job():
    schedule = {
        "queue_position": 1,
        "queue_state": "waiting",
        "reason": "las: 42 device-s attained; no room for 2",
        "decision": {"decision": "preempt", "reason": "las: job-00003 ranks higher", "applied": True},
        "preemptions": 2,
        "attained_service_s": 42.25,
    }
    job = {
        "id": "job-00001",
        "state": "preempted",
        "spec": {"model": "digits_cnn", "nproc": 2},
        "progress": {"step": 40, "total_steps": 1000},
        "phase": "preempted",
        "schedule": schedule,
    }
    table = format_jobs({"jobs": [job], "counts": {"preempted": 1}}).splitlines()
    assert table[0].split()[8:11] == ["QUEUE", "PREEMPTED", "SERVICE_S"]
    assert table[1].split()[8:11] == ["#1", "2", "42.25"]  # loss, accuracy, version are "-" before
    assert table[-1].endswith("1 preempted")
    detail = format_job_detail(job)
    assert "scheduler: waiting: las: 42 device-s attained; no room for 2" in detail
    assert "last decision: preempt: las: job-00003 ranks higher" in detail
