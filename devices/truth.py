"""Ground truth of a simulated camera for frames seen elsewhere: ``devicesim camera --truth FILE``
writes one JSON line per frame it produces (frame, ts, dominant label, objects), and a frame a
gateway captured at ``capture_ts`` is one the camera produced shortly before.

``SceneTruth`` reads the file as it grows and answers the dominant label of a capture time, or None
when the frames that were the camera's newest in the ``settle_s`` before it do not agree (a scene
change the capture may straddle: the gateway's reader can lag the camera by a frame or two).
``scores`` compares verdicts with truth: plain accuracy and balanced accuracy (the gate's: the mean
recall of the classes seen).

Invariant: a label is answered only when every frame that was the newest at some moment of
[capture_ts - settle_s, capture_ts] has it, so a frame is never labelled with a scene it may not show.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from pathlib import Path


class SceneTruth:
    def __init__(self, path: Path, settle_s: float = 0.3) -> None:
        self.path, self.settle_s = path, settle_s
        self.ts: list[float] = []
        self.labels: list[str] = []
        self._offset = 0

    def refresh(self) -> int:
        """Read the lines written since the last call (a partial last line waits); returns frames known."""
        if not self.path.exists():
            return 0
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.splitlines():
            if line.strip():
                frame = json.loads(line)
                self.ts.append(float(frame["ts"]))
                self.labels.append(str(frame["dominant"]))
        return len(self.ts)

    def label_at(self, capture_ts: float) -> str | None:
        """The dominant label of the frame captured at ``capture_ts``; None when unsure."""
        last = bisect.bisect_right(self.ts, capture_ts)
        if last == 0:  # captured before the camera's first frame: not this camera's
            return None
        # from the frame that was the newest at capture_ts - settle_s to the newest at capture_ts
        first = max(0, bisect.bisect_right(self.ts, capture_ts - self.settle_s) - 1)
        seen = set(self.labels[first:last])
        return seen.pop() if len(seen) == 1 else None


def scores(pairs: Iterable[tuple[str, str]]) -> tuple[float, float, int]:
    """(accuracy, balanced accuracy, rows) of (verdict, truth) pairs; NaNs for no rows."""
    rows = list(pairs)
    if not rows:
        return float("nan"), float("nan"), 0
    by_truth: dict[str, list[bool]] = {}
    for verdict, truth in rows:
        by_truth.setdefault(truth, []).append(verdict == truth)
    accuracy = sum(v == t for v, t in rows) / len(rows)
    balanced = sum(sum(hits) / len(hits) for hits in by_truth.values()) / len(by_truth)
    return accuracy, balanced, len(rows)
