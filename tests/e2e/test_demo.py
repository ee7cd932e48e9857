"""`make demo` as a user runs it (deploy/demo.py, its own embedded broker): it exits 0, every step of
the model loop happened, no sensor record was lost or doubled, and the gateway's accuracy against
devicesim's ground truth rose after the rollout (the factory model was never trained for the dim
site the demo's camera shows)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.processes import REPO, repo_env


@pytest.mark.slow  # the whole loop: torchrun, the gate, a canary
@pytest.mark.timeout(900)
def test_make_demo_closes_the_loop(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "deploy/demo.py", "--duration", "15", "--data-dir", str(tmp_path / "demo")],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=840,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "steps done: collect -> dataset -> train -> gate -> canary -> after" in out, out[-3000:]
    assert "missing: 0   duplicates: 0" in out
    balanced = {
        when: float(value)
        for when, value in re.findall(r"^\s+(before|after) \(.*?balanced\s+([0-9.]+)", out, re.M)
    }
    assert balanced["after"] > balanced["before"], out[-3000:]
