"""Measuring a task's edge cost on this box, and putting the measurement into a service.

Invariant: a profiled cost is the median wall time of ``repeats`` calls after ``warmup`` calls,
measured with the injected clock; a running cost (``RunningMedian``) is the median of the last
``size`` samples it was given; nothing here guesses a number.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gateway.taskgraphs.graph import TaskGraph, TaskGraphError


def profile_edge_cost(
    fn: Callable[[Any], Any],
    sample: Any,
    repeats: int = 20,
    warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median seconds per call of ``fn(sample)`` on this machine."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for _ in range(warmup):
        fn(sample)
    times = []
    for _ in range(repeats):
        start = clock()
        fn(sample)
        times.append(clock() - start)
    return statistics.median(times)


class RunningMedian:
    """The median of the last ``size`` samples: a stall (a GC pause, a busy neighbour core) in a few
    of them does not move it, a lasting change does within ``size / 2`` samples."""

    def __init__(self, size: int = 32) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self._samples: collections.deque[float] = collections.deque(maxlen=size)

    def add(self, value: float) -> None:
        self._samples.append(value)

    def clear(self) -> None:
        self._samples.clear()

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def value(self) -> float | None:
        """None until a sample was added."""
        return statistics.median(self._samples) if self._samples else None


def with_profiled_costs(service: TaskGraph, edge_costs_s: Mapping[str, float]) -> TaskGraph:
    """A copy of ``service`` whose named tasks carry the measured edge costs."""
    unknown = set(edge_costs_s) - {t.name for t in service.tasks}
    if unknown:
        raise TaskGraphError(f"service {service.name!r} has no task(s) {sorted(unknown)}")
    tasks = tuple(
        dataclasses.replace(t, edge_cost_s=float(edge_costs_s[t.name])) if t.name in edge_costs_s else t
        for t in service.tasks
    )
    return dataclasses.replace(service, tasks=tasks)


# -- small real kernels for the predefined services (what the tasks do, at their real size) -------


def _window_aggregate(window: np.ndarray) -> np.ndarray:
    return np.stack([window.mean(axis=0), window.min(axis=0), window.max(axis=0), window.std(axis=0)])


def _anomaly_score(stats: np.ndarray) -> float:
    mean, _, _, std = stats
    return float(np.max(np.abs(mean) / (std + 1e-6)))


def _change_fraction(frames: tuple[np.ndarray, np.ndarray]) -> float:
    previous, current = frames
    diff = np.abs(current.astype(np.int16) - previous.astype(np.int16))
    return float((diff > 25).mean())


def builtin_kernels(seed: int = 0) -> dict[tuple[str, str], tuple[Callable[[Any], Any], Any]]:
    """(service, task) -> (function, sample input) for the tasks that are cheap to run for real."""
    rng = np.random.default_rng(seed)
    window = rng.normal(20.0, 2.0, size=(10, 3))
    frame = rng.integers(0, 255, size=(480, 640), dtype=np.uint8)
    return {
        ("sensor", "aggregate"): (_window_aggregate, window),
        ("sensor", "detect"): (_anomaly_score, _window_aggregate(window)),
        ("camera", "change"): (_change_fraction, (frame, np.roll(frame, 3, axis=1))),
    }


def profile_builtin(services: tuple[TaskGraph, ...], repeats: int = 20) -> tuple[TaskGraph, ...]:
    """Replace the edge costs of the tasks ``builtin_kernels`` can run with costs measured here."""
    kernels = builtin_kernels()
    out = []
    for s in services:
        costs = {
            task: profile_edge_cost(fn, sample, repeats)
            for (svc, task), (fn, sample) in kernels.items()
            if svc == s.name
        }
        out.append(with_profiled_costs(s, costs) if costs else s)
    return tuple(out)
