"""The sync scheduler and the balancer under real torchrun: 2 processes, gloo, CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def torchrun(worker: str, out: Path, timeout_s: float = 150.0) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}"}
    command = [
        str(Path(sys.executable).with_name("torchrun")),
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        str(HERE / worker),
        str(out),
    ]
    done = subprocess.run(command, env=env, cwd=ROOT, timeout=timeout_s, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_scheduler_matches_ddp_parameters(tmp_path: Path) -> None:
    for result in torchrun("worker_ddp_equal.py", tmp_path):
        for label, figures in result.items():
            assert figures["max_abs_diff"] <= 1e-6, (label, figures)
        # the switching run really changed policy mid-training (merges), and still matched
        assert len(set(result["adaptive_switching"]["policies"])) > 1


def test_policy_follows_injected_delay_and_reverts(tmp_path: Path) -> None:
    # Blockage is measured on a shared 2-core box: a run that another process disturbed gets one more try.
    for attempt in range(2):
        try:
            _check_policy_run(*torchrun("worker_policy.py", tmp_path / f"attempt{attempt}"))
            return
        except AssertionError:
            if attempt == 1:
                raise


def _check_policy_run(rank0: dict, rank1: dict) -> None:
    assert rank0["decisions"] == rank1["decisions"]  # every rank decided the same thing
    phases = rank0["phases"]
    policies = [table["policy"] for table in rank0["tables"]] + [rank0["final_policy"]]
    delayed = [i for i, phase in enumerate(phases) if phase == "delayed"]
    removed = [i for i, phase in enumerate(phases) if phase == "removed"]
    print(json.dumps(rank0["decisions"], indent=1))
    # while the delay is on, a changed policy is tried and kept, with measured before/after
    kept = [
        d for d in rank0["decisions"] if d["action"] == "keep" and delayed[0] <= d["window"] <= delayed[-1]
    ]
    assert kept and all("before_blocked_ms" in d and "after_blocked_ms" in d for d in kept)
    assert any(policies[i] != policies[0] for i in delayed[1:] + [removed[0]])
    # after the delay is gone the policy goes back to the default and stays there
    assert policies[-1] == policies[0]
    assert any(d["action"] == "try" and "release" in d["reason"] for d in rank0["decisions"])


def test_balanced_half_speed_rank_finishes_together(tmp_path: Path) -> None:
    # Iteration times are a measurement on a shared 2-core box: a run that another process disturbed
    # gets one more try; the split and the math are checked on the run that is judged.
    for attempt in range(2):
        rank0, rank1 = torchrun("worker_hetero.py", tmp_path / f"attempt{attempt}")
        fast, slow = rank0["median_compute_s_tail"], rank1["median_compute_s_tail"]
        if abs(fast - slow) / max(fast, slow) <= 0.10:
            break
    print(
        f"compute per iteration (median of last 24): rank0 {fast * 1e3:.1f} ms, rank1 {slow * 1e3:.1f} ms, "
        f"sizes {rank0['sizes'][-1]}/{rank1['sizes'][-1]}; wall {rank0['median_wall_s_tail'] * 1e3:.1f} / "
        f"{rank1['median_wall_s_tail'] * 1e3:.1f} ms"
    )
    assert rank0["sizes"] == [64 * 2 - s for s in rank1["sizes"]]  # same split on both ranks, sums to 128
    assert rank0["sizes"][-1] > rank1["sizes"][-1]  # the slow rank got the smaller share
    assert abs(fast - slow) / max(fast, slow) <= 0.10
    for result in (rank0, rank1):  # float64: only the order of additions differs from one process
        assert result["max_abs_diff_vs_single"] <= 1e-9


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
