"""What the camera really produces, for the placement planner: frames per second past sampling, the
fraction the change detector passes, and the mean JPEG bytes of a passed frame, over the last
``WINDOW_S`` seconds of one source's counters; and the camera service's measured figures in the terms
of its task graph (gateway/taskgraphs/measured.py).

Owner: the camera runner holds one ``CameraTraffic`` per source (a new source starts a new window)
and calls ``observe`` from the event loop whenever placement asks for measurements; the counters it
reads are the capture thread's, read without its lock (a count one frame stale is fine here).

Invariant: ``figures()`` is None until the window spans ``MIN_SPAN_S`` and saw a frame past sampling;
it never reports a rate of 0 (a stalled or finished source tells nothing new about the scene), and
reports JPEG bytes only when a changed frame was encoded in the window.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.camera.source import CameraCounters
from gateway.taskgraphs.measured import Quantity

WINDOW_S = 30.0  # long enough to hold a few of a scene's quiet and busy stretches
MIN_SPAN_S = 5.0  # a shorter window says more about the last second than about the camera
MAX_SAMPLES = 1024  # bound on the window's samples (one per placement poll, ~1 s apart)


@dataclass(frozen=True)
class TrafficFigures:
    frames_per_s: float  # past sampling: what change detection looks at
    changed_fraction: float  # of those, passed by change detection (queued or dropped after)
    jpeg_bytes: float | None  # mean per changed frame; None: no changed frame in the window


@dataclass(frozen=True)
class _Sample:
    at: float
    frames: int  # read, minus sampled out
    changed: int  # delivered + dropped: every frame change detection passed
    jpeg_bytes: int


class CameraTraffic:
    def __init__(self, *, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._samples: collections.deque[_Sample] = collections.deque(maxlen=MAX_SAMPLES)

    def observe(self, counters: CameraCounters) -> None:
        now = self._clock()
        self._samples.append(
            _Sample(
                now,
                counters.frames_read - counters.sampled_out,
                counters.delivered + counters.dropped,
                counters.jpeg_bytes,
            )
        )
        while now - self._samples[0].at > self._window_s:
            self._samples.popleft()

    def figures(self) -> TrafficFigures | None:
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        span, frames, changed = last.at - first.at, last.frames - first.frames, last.changed - first.changed
        if span < MIN_SPAN_S or frames <= 0:
            return None
        jpeg = (last.jpeg_bytes - first.jpeg_bytes) / changed if changed > 0 else None
        return TrafficFigures(frames / span, changed / frames, jpeg)


def camera_quantities(infer_cost_s: float | None, traffic: TrafficFigures | None) -> dict[Quantity, float]:
    """The camera graph's figures measured here: ``infer``'s edge cost, the source rate, ``change``'s
    selectivity, and the size of a frame (``capture``'s and ``change``'s output: what crosses the link
    if the next task runs in the cloud)."""
    measured: dict[Quantity, float] = {}
    if infer_cost_s is not None:
        measured[Quantity("camera", "edge_cost_s", "infer")] = infer_cost_s
    if traffic is not None:
        measured[Quantity("camera", "rate_hz")] = traffic.frames_per_s
        measured[Quantity("camera", "selectivity", "change")] = traffic.changed_fraction
        if traffic.jpeg_bytes is not None:
            measured[Quantity("camera", "output_bytes", "capture")] = traffic.jpeg_bytes
            measured[Quantity("camera", "output_bytes", "change")] = traffic.jpeg_bytes
    return measured
