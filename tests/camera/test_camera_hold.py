"""`devicesim camera --hold`: a still until SIGUSR1, then the scene from its first frame (so that
tests/harness/live_trace.py's runs see the same scene in the same phase of their trace)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.harness.camera import DevicesimCamera
from tests.harness.poll import wait_until
from tests.harness.processes import free_port


def jpegs(url: str, count: int) -> list[bytes]:
    """The first ``count`` JPEG parts of an MJPEG stream."""
    found: list[bytes] = []
    buffer = b""
    with urllib.request.urlopen(url, timeout=10) as stream:
        while len(found) < count:
            buffer += stream.read1(65536)
            while (start := buffer.find(b"\xff\xd8")) >= 0 and (end := buffer.find(b"\xff\xd9", start)) >= 0:
                found.append(buffer[start : end + 2])
                buffer = buffer[end + 2 :]
    return found[:count]


def test_hold_serves_a_still_until_played_then_the_scene_from_frame_zero(tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    camera = DevicesimCamera(free_port(), truth, seed=5, fps=10.0, hold=True)
    try:
        held = jpegs(camera.url, 5)
        assert len(set(held)) == 1, "held frames changed"
        assert truth.read_text() == "", "a held still has no ground truth"
        camera.play()
        wait_until(lambda: len(truth.read_text().splitlines()) >= 10, 10, "the scene playing")
        frames = [json.loads(line)["frame"] for line in truth.read_text().splitlines()]
        assert frames[:10] == list(range(10))
        assert len(set(jpegs(camera.url, 5))) == 5, "the played scene's frames are all alike"
    finally:
        camera.stop()
