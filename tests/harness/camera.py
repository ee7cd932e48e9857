"""Camera tests' tools: a gateway config's [camera] section, a real ``devicesim camera`` process (MJPEG
over HTTP, ground truth to a file), a recorded video, the committed scene model and relabelled copies
of it, ground-truth matching."""

from __future__ import annotations

import bisect
import itertools
import json
import signal
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from models.artifact import ModelArtifact, build_metadata, load_artifact
from tests.harness.processes import REPO, kill_process, run_module, start_module, stop_process, wait_for_port

SCENE_ARTIFACT = REPO / "models" / "artifacts" / "scene"


def ticking(step_s: float) -> Callable[[], float]:
    """A timer for ``InferenceEngine(timer=...)`` that advances ``step_s`` per call: every timed run
    lasts exactly ``step_s``, so the engine measures that cost per input whatever the machine."""
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


def scene_artifact(version: str | None = None) -> ModelArtifact:
    """The committed scene model (regenerate: python -m models.scene --out models/artifacts/scene)."""
    artifact = load_artifact(SCENE_ARTIFACT)
    if version is None:
        return artifact
    return relabel(artifact, version)


def relabel(artifact: ModelArtifact, version: str, onnx_bytes: bytes | None = None) -> ModelArtifact:
    """The same model under another version (optionally other bytes, hash recomputed)."""
    data = onnx_bytes if onnx_bytes is not None else artifact.onnx_bytes
    fields = artifact.metadata.model_dump(exclude={"sha256", "size"})
    fields["version"] = version
    return replace(artifact, metadata=build_metadata(data, **fields), onnx_bytes=data)


def camera_extra(camera_port: int) -> str:
    """For write_config's ``extra``: a [camera] reading MJPEG from ``camera_port`` (placement off), with
    short timeouts and backoff, and heartbeats every 0.5 s."""
    return (
        "heartbeat_interval_s = 0.5\n"  # still inside write_config's [uplink]
        "[placement]\nenabled = false\n"
        f'[camera]\nenabled = true\ncamera_id = "cam1"\nsource = "http://127.0.0.1:{camera_port}/stream.mjpg"\n'
        "open_timeout_s = 2.0\nread_timeout_s = 2.0\nbackoff_initial_s = 0.2\nbackoff_max_s = 1.0\n"
    )


class DevicesimCamera:
    """`devicesim camera` serving MJPEG on ``port``, ground truth to ``truth``; listening on return.
    ``hold``: a still until ``play()``, then the scene from its start."""

    def __init__(
        self,
        port: int,
        truth: Path,
        *,
        seed: int = 0,
        fps: float = 10.0,
        hold: bool = False,
        extra: list[str] | None = None,
    ) -> None:
        self.port, self.truth = port, truth
        args = ["camera", "--port", str(port), "--truth", str(truth), "--seed", str(seed), "--fps", str(fps)]
        args += ["--hold"] if hold else []
        self.proc: subprocess.Popen = start_module(
            "devices.cli", [*args, *(extra or [])], truth.with_suffix(".camera.log")
        )
        wait_for_port(port, timeout_s=20, proc=self.proc)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def play(self) -> None:
        """Start the scene of a camera made with ``hold``."""
        self.proc.send_signal(signal.SIGUSR1)

    def kill(self) -> None:
        kill_process(self.proc)

    def stop(self) -> None:
        stop_process(self.proc)


def write_video(path: Path, truth: Path, frames: int, seed: int = 0) -> None:
    """A video file of ``frames`` synthetic frames, its ground truth in ``truth``."""
    args = ["camera", "--out", str(path), "--truth", str(truth), "--frames", str(frames), "--seed", str(seed)]
    done = run_module("devices.cli", args, timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr


class GroundTruth:
    def __init__(self, path: Path) -> None:
        self.lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.ts = [line["ts"] for line in self.lines]

    def labels_between(self, start: float, stop: float) -> set[str]:
        """Dominant labels of the frames produced in [start, stop]."""
        low, high = bisect.bisect_left(self.ts, start), bisect.bisect_right(self.ts, stop)
        return {line["dominant"] for line in self.lines[low:high]}
