"""An emulated weak edge box (test harness only): a CPU quota on a running gatewayd, and a heavier
scene model for it to run, installed in cloudd's registry so that both sides infer with it.

A real edge box (Raspberry-Pi class) is about ten times slower than the cloud and runs bigger models
than the shipped 48x48 scene CNN, which takes ~1 ms a frame here. ``cpu_limit`` puts a process under a
CFS quota (cgroups v1 or v2) of a fraction of one core; ``heavy_scene_artifact`` builds an untrained
scene model at a larger input size and width (same labels, preprocessing and postprocessing, so the
gateway and cloudd read its outputs as they read the shipped one's); ``install_in_registry`` uploads it
through cloudd's real route and makes it production, so the registry's invariants hold and gatewayd's
OTA updater, which runs the version cloudd assigns it, finds the version it already runs and swaps
nothing.
``calibrated`` picks the model's width so that a frame takes ``FULL_SPEED_MS`` at full speed on the
machine it runs on (the same model took 55 ms on one of this project's machines and 189 ms on
another: an uncalibrated weak edge is a different box on each, one that cannot keep up with its camera
on the slower). ``python -m tests.harness.weak_edge --out DIR`` builds one and prints its cost per frame.

Owner: whoever enters ``cpu_limit`` owns the cgroup it makes and removes it on exit
(``tests.harness.live_trace.run_live`` does, for its gatewayd, when given a ``WeakEdge``).

Invariant: inside ``cpu_limit(pid, fraction)`` the process, every thread it has and every thread or
child it starts later get at most ``fraction`` of one core's time per ``CPU_PERIOD_US``; on exit the
cgroup is gone and whatever was left in it is back in the hierarchy's root. Where no cgroup can be
written, ``WeakEdgeUnavailable`` says so and nothing is left behind.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.artifact import ModelArtifact, load_artifact, save_artifact

CGROUP_ROOT = Path("/sys/fs/cgroup")
# A short period spreads the quota evenly, so a frame's inference takes 1/fraction as long instead
# of running at full speed and then stalling for most of a 100 ms default period.
CPU_PERIOD_US = 10_000
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller quota
FULL_SPEED_MS = 55.0  # the recommended weak edge's model, a frame at full speed (WeakEdge's docstring)
CALIBRATION_TOLERANCE = 1.1  # a calibrated model's time is within this factor of its target
REMOVE_TIMEOUT_S = 5.0


class WeakEdgeUnavailable(RuntimeError):
    """No CPU quota can be set on this machine (no writable cpu controller): not emulated."""


@dataclass(frozen=True)
class WeakEdge:
    """gatewayd as a weak box: ``cpu_fraction`` of one core, running the scene model at ``input_size``
    x ``width`` (built per run), or the artifact already saved in ``prebuilt``. The defaults are the
    measured recommendation (docs/measurements/2026-12-placement.md): ~55 ms a frame at full speed
    here, and on a steady fast link edge results ~7x slower than cloud ones, the sensors kept up."""

    cpu_fraction: float = 0.25
    input_size: int = 192
    width: int = 128
    prebuilt: Path | None = None

    def artifact(self, folder: Path) -> tuple[Path, ModelArtifact]:
        """(its folder, the artifact): ``prebuilt``, or built into ``folder``."""
        if self.prebuilt is not None:
            return self.prebuilt, load_artifact(self.prebuilt)
        return folder, heavy_scene_artifact(folder, **self.shape())

    def shape(self) -> dict[str, Any]:
        """``heavy_scene_artifact``'s arguments for this edge's model."""
        return {
            "input_size": self.input_size,
            "width": self.width,
            "version": f"weak-{self.input_size}x{self.width}",
        }


def calibrated(
    folder: Path, cpu_fraction: float, *, target_ms: float = FULL_SPEED_MS, tries: int = 6
) -> tuple[WeakEdge, float]:
    """(a ``WeakEdge`` with its model built under ``folder``, that model's ms a frame at full speed):
    the width is scaled until a frame takes ``target_ms`` within ``CALIBRATION_TOLERANCE`` here
    (a conv net's cost grows with its width squared), or the closest of ``tries`` builds."""
    width, best = WeakEdge.width, None
    for _ in range(tries):
        model_dir = folder / f"width-{width}"
        edge = WeakEdge(cpu_fraction, width=width, prebuilt=model_dir)
        ms = per_frame_ms(heavy_scene_artifact(model_dir, **edge.shape()))
        if best is None or abs(math.log(ms / target_ms)) < abs(math.log(best[1] / target_ms)):
            best = (edge, ms)
        if abs(math.log(ms / target_ms)) <= math.log(CALIBRATION_TOLERANCE):
            break
        width = max(4, round(width * math.sqrt(target_ms / ms)))
    assert best is not None
    return best


# --- the CPU quota -----------------------------------------------------------------------------------


@contextmanager
def cpu_limit(pid: int, fraction: float, *, root: Path = CGROUP_ROOT) -> Iterator[Path]:
    """Process ``pid`` under a quota of ``fraction`` of one core while inside; yields its cgroup."""
    if fraction <= 0:
        raise ValueError(f"cpu fraction {fraction} must be > 0")
    period_us = max(CPU_PERIOD_US, math.ceil(MIN_QUOTA_US / fraction))
    quota_us = round(fraction * period_us)
    group, parent = _make_group(root, f"edgefed-weak-edge-{pid}", quota_us, period_us)
    try:
        (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        _remove_group(group, parent)


def _make_group(root: Path, name: str, quota_us: int, period_us: int) -> tuple[Path, Path]:
    """(the new cgroup, its parent) with the quota set; WeakEdgeUnavailable if none can be made."""
    if (root / "cgroup.controllers").exists():  # v2, the unified hierarchy mounted at the root
        parent, limits = root, {"cpu.max": f"{quota_us} {period_us}"}
    elif (root / "cpu" / "cpu.cfs_quota_us").exists():  # v1 (a v2 mount beside it has no cpu controller)
        parent = root / "cpu"
        limits = {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}
    else:
        raise WeakEdgeUnavailable(f"no cpu controller under {root} (neither cgroup v2 nor v1 cpu)")
    group, made = parent / name, False
    try:
        if "cpu.max" in limits and "cpu" not in (parent / "cgroup.subtree_control").read_text().split():
            (parent / "cgroup.subtree_control").write_text("+cpu")
        group.mkdir()
        made = True
        for file_name, value in limits.items():
            (group / file_name).write_text(value)
    except OSError as exc:
        if made:
            group.rmdir()
        raise WeakEdgeUnavailable(f"cannot set a cpu quota in {parent}: {exc}") from exc
    return group, parent


def _remove_group(group: Path, parent: Path) -> None:
    """Move the survivors to ``parent``, then remove ``group`` (busy while an exiting task leaves it)."""
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while True:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (parent / "cgroup.procs").write_text(pid)
            except ProcessLookupError:  # it exited meanwhile
                pass
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# --- the heavy model -----------------------------------------------------------------------------------


def heavy_scene_artifact(folder: Path, *, input_size: int, width: int, version: str) -> ModelArtifact:
    """An untrained ``scene_cnn(width, input_size)`` exported as scene ``version`` and saved in
    ``folder``: for latency, not accuracy. Seeded, so the same arguments give the same bytes."""
    import torch

    from models.export import export_artifact
    from models.scene import LABELS, scene_cnn, scene_input_spec

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = scene_cnn(width, input_size)
        example = torch.rand(1, 3, input_size, input_size)
    artifact = export_artifact(
        model,
        example,
        name="scene",
        version=version,
        input_spec=scene_input_spec(input_size),
        postprocess="softmax_labels",
        labels=list(LABELS),
        notes={"untrained": True, "made_by": "tests.harness.weak_edge (latency emulation only)"},
    )
    save_artifact(folder, artifact)
    return artifact


def per_frame_ms(artifact: ModelArtifact, frames: int = 20) -> float:
    """Mean wall time of one camera frame (320x240) through ``run_batch``, on one thread, after warm-up."""
    from models.inference import InferenceInput, load_and_probe, run_batch
    from models.synthetic_scene import background

    model = load_and_probe(artifact, threads=1)
    item = InferenceInput("cam1", 0, 0.0, background(320, 240))
    run_batch(model, [item])
    start = time.perf_counter()
    for _ in range(frames):
        run_batch(model, [item])
    return (time.perf_counter() - start) / frames * 1000


# --- cloudd's registry -----------------------------------------------------------------------------------


async def install_in_registry(cloud_url: str, operator_token: str, artifact: ModelArtifact) -> dict[str, Any]:
    """Upload ``artifact`` (POST /v1/models/<name>) and make it production (forced: a test stand-in
    has no evaluation), then check it is what cloudd assigns a gateway, the version the gateway's
    OTA updater is told to run; returns its registry entry."""
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("metadata", artifact.metadata.model_dump_json(), content_type="application/json")
    form.add_field(
        "onnx", artifact.onnx_bytes, content_type="application/octet-stream", filename="model.onnx"
    )
    headers = {"Authorization": f"Bearer {operator_token}"}
    base = f"{cloud_url}/v1/models/{artifact.name}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with http.post(base, data=form, headers=headers) as response:
            if response.status not in (200, 201):
                raise RuntimeError(
                    f"upload of {artifact.name}@{artifact.version}: {response.status} {await response.text()}"
                )
            entry: dict[str, Any] = await response.json()
        body = {"version": artifact.version, "production": True, "force": True, "reason": "weak edge"}
        async with http.post(f"{base}/promote", json=body, headers=headers) as response:
            if response.status != 200 and (await response.json())["error"] != "already_production":
                raise RuntimeError(f"promote {artifact.name}@{artifact.version}: {await response.text()}")
        async with http.get(f"{base}/assignment", params={"gateway": "gw1"}, headers=headers) as response:
            response.raise_for_status()
            assigned = (await response.json())["version"]
    if assigned != artifact.version:
        raise RuntimeError(
            f"cloudd assigns {artifact.name}@{assigned}, not {artifact.version}: "
            "the gateway's OTA updater would swap the heavy model away"
        )
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build a heavy scene artifact and time it per frame")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--input-size", type=int, default=WeakEdge.input_size)
    parser.add_argument("--width", type=int, default=WeakEdge.width)
    args = parser.parse_args(argv)
    edge = WeakEdge(1.0, args.input_size, args.width)
    _, artifact = edge.artifact(args.out)
    cost_ms = per_frame_ms(artifact)
    print(f"{artifact.name}@{artifact.version}: {artifact.metadata.size} bytes, {cost_ms:.1f} ms/frame")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
