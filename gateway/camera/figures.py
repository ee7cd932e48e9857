"""Live figures of the model version a camera runs (docs/camera.md, "Live model figures"): frames,
mean confidence, error rate, median latency, and how often the previously running version agrees on
a shadow sample, over the window since that version started running here. The heartbeat carries
them to cloudd (``protocol.fleet.ModelFigures``), whose rollout controller compares versions by them.

Invariant: one window per running version: the engine starts a new ``ModelWindow`` at each swap, so
no figure mixes two versions; it adds only batches the window's version ran (a batch that ended on a
swapped-out model is not added). Pure arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field
from typing import Any

LATENCY_WINDOW = 512  # frames whose batch wall time the median is taken over (memory stays bounded)


@dataclass
class ModelWindow:
    version: str
    since_ts: float
    frames: int = 0  # inferred by this version
    failed: int = 0  # submitted to this version in batches that raised
    score_sum: float = 0.0
    shadow_frames: int = 0
    shadow_agreed: int = 0
    shadow_failures: int = 0  # shadow runs that raised (not in the agreement)
    _latencies_ms: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW)
    )

    def shadow_sample(self, batch_size: int, every: int) -> list[int]:
        """The positions in the next batch of frames to run the shadow on: every ``every``-th frame
        of the window, counted from its first."""
        return [i for i in range(batch_size) if (self.frames + i) % every == 0]

    def add_batch(self, scores: list[float], seconds: float) -> None:
        """A batch this version ran: each frame waited ``seconds`` (the batch's wall time) for it."""
        self.frames += len(scores)
        self.score_sum += sum(scores)
        self._latencies_ms.extend([seconds * 1000.0] * len(scores))

    def add_failed(self, frames: int) -> None:
        self.failed += frames

    def add_shadow(self, agreed: int, frames: int) -> None:
        self.shadow_agreed += agreed
        self.shadow_frames += frames

    def figures(self) -> dict[str, Any]:
        """The window as the heartbeat's ``ModelFigures`` fields (None: nothing to say yet)."""
        tried = self.frames + self.failed
        return {
            "version": self.version,
            "frames": self.frames,
            "confidence_mean": self.score_sum / self.frames if self.frames else None,
            "shadow_agreement": self.shadow_agreed / self.shadow_frames if self.shadow_frames else None,
            "shadow_frames": self.shadow_frames,
            "error_rate": self.failed / tried if tried else None,
            "latency_ms_p50": statistics.median(self._latencies_ms) if self._latencies_ms else None,
            "since_ts": self.since_ts,
        }
