"""devices/truth.py: the true scene of a captured frame, from the camera's ground-truth file as it
grows, and accuracy against it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from devices.truth import SceneTruth, scores


def write(path: Path, frames: list[tuple[float, str]], partial: str = "") -> None:
    with path.open("a") as out:
        for ts, label in frames:
            out.write(json.dumps({"frame": 0, "ts": ts, "dominant": label, "objects": []}) + "\n")
        out.write(partial)


def test_a_capture_is_labelled_only_when_the_frames_before_it_agree(tmp_path):
    path = tmp_path / "truth.jsonl"
    truth = SceneTruth(path, settle_s=0.3)
    assert truth.refresh() == 0 and truth.label_at(5.0) is None  # no file yet
    frames = [(1.0, "empty"), (1.1, "empty"), (1.2, "circle"), (1.3, "circle")]
    write(path, frames, partial='{"frame": 4, "ts": 1.6, ')
    assert truth.refresh() == 4  # the partial last line waits
    assert truth.label_at(0.9) is None  # before the camera's first frame
    assert truth.label_at(1.15) == "empty"
    assert truth.label_at(1.25) is None  # empty and circle both produced in the 0.3 s before
    assert truth.label_at(1.55) == "circle"  # only circle since 1.25
    write(path, [], partial='"dominant": "square", "objects": []}\n')  # the camera finishes the line
    assert truth.refresh() == 5 and truth.label_at(1.65) is None and truth.label_at(1.95) == "square"


def test_scores_are_plain_and_balanced():
    pairs = [("circle", "circle")] * 8 + [("circle", "square"), ("square", "square")]
    accuracy, balanced, rows = scores(pairs)
    assert (accuracy, balanced, rows) == (pytest.approx(0.9), pytest.approx(0.75), 10)
    assert math.isnan(scores([])[0])
