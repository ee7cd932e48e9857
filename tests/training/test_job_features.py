"""Under real torchrun (gloo, CPU, 2 processes): each trainer feature turned on from the job file.

A 1-stage x 2-replica plan, whose gradient sum is the replicas' all-reduce: with ``[sync]`` it goes
through the SyncScheduler and the parameters equal the plain all-reduce's (and single-process
gradient accumulation's), also across a resume; ``[balance]`` splits each minibatch's samples
unevenly between the replicas and keeps that trajectory; ``[toggle]`` trains later epochs on the
selected half and records every presented row's answer; ``bf16`` trains close to fp32 but not equal
to it. Each job writes its feature's live figures on its ``step`` lines; a job with them all
finishes and learns.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from cloud.training import checkpoint
from tests.harness.pipeline_reference import (
    max_relative_difference,
    merged_checkpoint,
    reference_grad_accumulation,
)
from tests.harness.torchrun import run_job, write_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

STEPS, BATCH, MICRO = 8, 48, 4
REPLICATED: dict[str, Any] = {"stages": [(0, 8)], "replicas": [2]}


@functools.cache
def _accumulated() -> dict[str, torch.Tensor]:
    """Single-process gradient accumulation's parameters after STEPS steps."""
    return reference_grad_accumulation(STEPS, BATCH, MICRO).state_dict()


def _steps(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "step"]


def _run(tmp_path, schedule: str = "1f1b-flush", sections: str = "", **overrides) -> list[dict]:
    tmp_path.mkdir(exist_ok=True)
    settings: dict[str, Any] = {"microbatches": MICRO, "batch_size": BATCH, "steps": STEPS, **REPLICATED}
    settings |= overrides
    job = write_job(tmp_path, schedule=schedule, sections=sections, log_every=2, **settings)
    events = run_job(job, 2)
    assert events[-1]["event"] == "done"
    phases = [e["phase"] for e in events if e["event"] == "phase"]
    assert phases[:2] == ["starting", "training"] and "evaluating" in phases
    return events


SYNC = "[sync]\nenabled = true\nwindow = 2\n"


def _check_sync_figures(events: list[dict]) -> None:
    start = next(e for e in events if e["event"] == "start")
    assert start["features"]["sync"] == "on" and start["features"]["balance"] == "off"
    steps = _steps(events)
    assert all({"policy", "blocked_s", "decisions", "windows"} <= e["sync"].keys() for e in steps)
    assert steps[-1]["sync"]["windows"] >= 1


def test_sync_scheduler_sums_the_replicas_gradients_like_the_plain_all_reduce(tmp_path):
    events = _run(tmp_path / "sync", sections=SYNC)
    _check_sync_figures(events)
    assert _steps(events)[-1]["sync"]["iteration"] == STEPS
    synced = merged_checkpoint(tmp_path / "sync" / "ckpt", 1, STEPS)
    assert max_relative_difference(synced, _accumulated()) <= 1e-5
    plain_events = _run(tmp_path / "plain")  # the executor's own all-reduce, run for real
    assert all("sync" not in e for e in _steps(plain_events))
    plain = merged_checkpoint(tmp_path / "plain" / "ckpt", 1, STEPS)
    assert max_relative_difference(synced, plain) <= 1e-6


def test_sync_on_gpipe_resumes_with_its_per_layer_optimizer_state(tmp_path):
    _run(tmp_path, "gpipe", SYNC, steps=STEPS // 2)
    events = _run(tmp_path, "gpipe", SYNC)  # the same job, run on to STEPS from the checkpoint
    assert any(e["event"] == "resume" and e["from_step"] == STEPS // 2 for e in events)
    _check_sync_figures(events)
    got = merged_checkpoint(tmp_path / "ckpt", 1, STEPS)
    assert max_relative_difference(got, _accumulated()) <= 1e-5  # momentum buffers restored per layer


def test_balance_splits_samples_unevenly_and_keeps_the_trajectory(tmp_path):
    events = _run(tmp_path, sections="[balance]\nenabled = true\ndeclared_speeds = [3, 1]\n")
    steps = _steps(events)
    for e in steps:
        balance = e["balance"]
        assert sum(balance["sizes"]) == BATCH and sum(balance["microbatch_sizes"]) == BATCH
        assert len(balance["microbatch_sizes"]) == MICRO and min(balance["microbatch_sizes"]) >= 1
    assert steps[0]["balance"]["sizes"][0] > steps[0]["balance"]["sizes"][1]  # declared 3:1
    got = merged_checkpoint(tmp_path / "ckpt", 1, STEPS)
    # each microbatch's loss weighted by its samples: the minibatch's mean gradient, however split
    assert max_relative_difference(got, _accumulated()) <= 1e-5


def test_toggle_selects_later_epochs_and_records_every_answer(tmp_path):
    epochs, rows = 3, 1438  # digits' training rows
    warmup_steps, selected_steps = rows // BATCH, (rows // 2) // BATCH
    total = warmup_steps + (epochs - 1) * selected_steps
    events = _run(tmp_path, sections="[toggle]\nenabled = true\nfraction = 0.5\n", steps=0, epochs=epochs)
    start = next(e for e in events if e["event"] == "start")
    assert start["features"]["toggle"] == "on" and start["total_steps"] == total
    toggle = _steps(events)[-1]["toggle"]
    assert (toggle["epoch"], toggle["selected"], toggle["rows"]) == (epochs, rows // 2, rows)
    assert 0 < toggle["settled"] < rows
    saved = checkpoint.load_stage(tmp_path / "ckpt", 0, total)["toggle"]
    assert int(saved["presentations"].sum()) == total * BATCH  # the last stage answered every row shown
    assert int((saved["presentations"] > 0).sum()) >= warmup_steps * BATCH  # the warm-up showed them all


def test_bf16_autocast_trains_close_to_fp32(tmp_path):
    stages = [(0, 3), (4, 8)]  # two stages: bf16 forwards, fp32 activations and gradients between them
    events = _run(tmp_path, "gpipe", stages=stages, replicas=[1, 1], extra_train='precision = "bf16"')
    assert next(e for e in events if e["event"] == "start")["features"]["precision"] == "bf16"
    got = merged_checkpoint(tmp_path / "ckpt", 2, STEPS)
    difference = max_relative_difference(got, _accumulated())
    assert 1e-5 < difference < 0.05, difference  # autocast changed the arithmetic, not the training


def test_a_job_with_every_feature_finishes_and_learns(tmp_path):
    sections = """
[compression]
activations = "adaptive"
gist = true
window = 4
min_numel = 1024
[sync]
enabled = true
window = 4
[balance]
enabled = true
[toggle]
enabled = true
fraction = 0.5
"""
    events = _run(tmp_path, sections=sections, steps=0, epochs=3, extra_train='precision = "bf16"')
    start = next(e for e in events if e["event"] == "start")
    assert start["features"] == {
        "compression": "adaptive+gist",
        "wire_codec": "fp32",
        "sync": "on",
        "collective": "torch",
        "balance": "on",
        "toggle": "on",
        "precision": "bf16",
        "device": "cpu",
    }
    last = _steps(events)[-1]
    assert {"compression", "sync", "balance", "toggle"} <= last.keys()
    assert 0 < last["compression"]["saved_bytes_stored"] < last["compression"]["saved_bytes_fp32"]
    assert torch.isfinite(torch.tensor(last["loss"]))
    final = [e for e in events if e["event"] == "eval"][-1]
    assert final["accuracy"] >= 0.4, final  # chance is 0.1
