"""The emulated weak edge box (tests/harness/weak_edge.py): the CPU quota really caps a running
process and what it starts later, and goes away after; the heavy scene model runs like the shipped one;
it goes into cloudd's registry only as the latest version (else the gateway's OTA would swap it away)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from models.artifact import load_artifact
from models.inference import InferenceInput, load_and_probe, run_batch
from models.synthetic_scene import LABELS, background
from tests.harness.camera import relabel
from tests.harness.cloudd import OPERATOR_TOKEN, Cloudd
from tests.harness.weak_edge import (
    WeakEdge,
    WeakEdgeUnavailable,
    calibrated,
    cpu_limit,
    heavy_scene_artifact,
    install_in_registry,
)

FRACTION = 0.2
MEASURE_S = 2.0
# Busy from the start; forks a second busy process once it is under the quota (0.5 s is ample for
# the test to put it there), so that unlimited the two would take up to two cores.
BUSY_THEN_FORK = (
    "import os, time\nt = time.time() + 0.5\nwhile time.time() < t: pass\nos.fork()\nwhile True: pass\n"
)


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from /proc (fields 14 and 15, after the parenthesised name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_cpu_limit_caps_a_busy_process_and_what_it_forks_later() -> None:
    busy = subprocess.Popen([sys.executable, "-c", BUSY_THEN_FORK], start_new_session=True)
    try:
        with ExitStack() as stack:
            try:
                group = stack.enter_context(cpu_limit(busy.pid, FRACTION))
            except WeakEdgeUnavailable as exc:
                pytest.skip(f"no CPU quota can be set here: {exc}")
            time.sleep(1.0)  # the fork has happened, and the child was born inside the cgroup
            pids = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
            assert busy.pid in pids and len(pids) == 2
            before, start = sum(cpu_seconds(pid) for pid in pids), time.monotonic()
            time.sleep(MEASURE_S)
            used = sum(cpu_seconds(pid) for pid in pids) - before
            share = used / (time.monotonic() - start)
        assert share <= FRACTION * 1.5, f"{share:.2f} of a core, quota {FRACTION}"
        assert share > 0, "the busy processes never ran"
        assert not group.exists()
        assert busy.poll() is None  # moved back out, not killed
        assert all(str(pid) in (group.parent / "cgroup.procs").read_text().split() for pid in pids)
    finally:
        os.killpg(busy.pid, signal.SIGKILL)
        busy.wait(10)


def test_the_heavy_scene_model_runs_on_camera_frames_like_the_shipped_one(tmp_path: Path) -> None:
    made = heavy_scene_artifact(tmp_path / "heavy", input_size=64, width=4, version="weak-64x4")
    artifact = load_artifact(tmp_path / "heavy")
    assert artifact.metadata == made.metadata
    assert artifact.metadata.input.sample_shape == (3, 64, 64) and artifact.metadata.labels == list(LABELS)
    model = load_and_probe(artifact, threads=1)
    [result] = run_batch(model, [InferenceInput("cam1", 7, 0.0, background(320, 240))])
    assert result.event.label in LABELS and result.event.model_version == "weak-64x4"


async def test_the_heavy_model_goes_into_the_registry_as_the_assigned_production(
    tmp_path: Path, cloudd: Cloudd
) -> None:
    heavy = heavy_scene_artifact(tmp_path / "heavy", input_size=64, width=4, version="weak-64x4")
    entry = await install_in_registry(cloudd.url, OPERATOR_TOKEN, heavy)
    # seq 2: the factory scene model, registered by cloudd at start, is seq 1
    assert (entry["version"], entry["seq"], entry["sha256"]) == ("weak-64x4", 2, heavy.metadata.sha256)
    assert (cloudd.data_dir / "models" / "scene" / "weak-64x4" / "registry.json").exists()
    await install_in_registry(cloudd.url, OPERATOR_TOKEN, relabel(heavy, "newer"))
    # stored already and no longer production: installing it again makes it production again
    assert (await install_in_registry(cloudd.url, OPERATOR_TOKEN, heavy))["version"] == "weak-64x4"


def test_calibrated_scales_the_width_towards_its_target(tmp_path: Path) -> None:
    """Asked for a frame far cheaper than the default width's on any machine, the calibration narrows
    the model, and the edge it returns runs the model it built."""
    edge, ms = calibrated(tmp_path, FRACTION, target_ms=0.01, tries=2)
    assert edge.width < WeakEdge.width and edge.cpu_fraction == FRACTION
    assert edge.prebuilt is not None
    _, artifact = edge.artifact(edge.prebuilt)
    assert artifact.version == f"weak-{edge.input_size}x{edge.width}" and ms > 0
