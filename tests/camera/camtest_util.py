"""Helpers for camera tests: a real `devicesim camera` process, the committed scene artifact, and
ground-truth matching."""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from conftest import stop_process, wait_for_port

from models.artifact import ModelArtifact, build_metadata, load_artifact

REPO = Path(__file__).resolve().parents[2]
SCENE_ARTIFACT = REPO / "models" / "artifacts" / "scene"


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


class DevicesimCamera:
    """`devicesim camera` serving MJPEG on ``port``, ground truth to ``truth``."""

    def __init__(
        self, port: int, truth: Path, *, seed: int = 0, fps: float = 10.0, extra: list[str] | None = None
    ) -> None:
        self.port, self.truth = port, truth
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "devices.cli",
                "camera",
                "--port",
                str(port),
                "--truth",
                str(truth),
                "--seed",
                str(seed),
                "--fps",
                str(fps),
                *(extra or []),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        wait_for_port(port, timeout=20, proc=self.proc)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc)


def write_video(path: Path, truth: Path, frames: int, seed: int = 0) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "devices.cli",
            "camera",
            "--out",
            str(path),
            "--truth",
            str(truth),
            "--frames",
            str(frames),
            "--seed",
            str(seed),
        ],
        cwd=REPO,
        check=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


class GroundTruth:
    def __init__(self, path: Path) -> None:
        self.lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.ts = [line["ts"] for line in self.lines]

    def labels_between(self, start: float, stop: float) -> set[str]:
        """Dominant labels of the frames produced in [start, stop]."""
        low, high = bisect.bisect_left(self.ts, start), bisect.bisect_right(self.ts, stop)
        return {line["dominant"] for line in self.lines[low:high]}
