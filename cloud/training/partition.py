"""PipeDream's partitioner: split a chain of layers into stages (with replication) over workers.

Cost model (PipeDream, SOSP'19, ``optimizer_graph_hierarchical.py``, flat single-level version):
- a stage of layers i..j on r replicas takes ``(T + 4(r-1)W/(B r)) / r`` per minibatch, where T is
  the layers' forward+backward time, W their parameter bytes and B the bandwidth (compute plus
  a ring all-reduce of the weights, spread over the r replicas that share the minibatches);
- the boundary after layer k costs ``2 a_k / (B r c)``: activations forward and gradients back,
  a_k the output bytes of layer k, r the replicas of the receiving stage, c the activation
  compression ratio (1 = none; the hook compressed stage boundaries use);
- a plan's time per minibatch is the largest of its stage and boundary times (the pipeline runs
  at the pace of its slowest part).

Invariant: ``partition`` returns a plan whose ``plan_cost`` is minimal over every split of the
layers into contiguous stages with replica counts summing to ``workers``; ``brute_force`` checks
that by enumeration on small cases. Both are pure functions of their inputs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerCost:
    forward_s: float
    backward_s: float
    activation_bytes: int  # bytes of this layer's output for one minibatch
    param_bytes: int

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class StagePlan:
    first: int  # first layer, inclusive
    last: int  # last layer, inclusive
    replicas: int


@dataclass(frozen=True)
class Plan:
    stages: tuple[StagePlan, ...]
    time_per_minibatch_s: float

    @property
    def replicas(self) -> tuple[int, ...]:
        return tuple(s.replicas for s in self.stages)

    @property
    def workers(self) -> int:
        return sum(self.replicas)

    def text(self) -> str:
        stages = " | ".join(f"{s.first}-{s.last}x{s.replicas}" for s in self.stages)
        if math.isnan(self.time_per_minibatch_s):  # an even split, not profiled: no predicted time
            return stages
        return f"{stages} @ {self.time_per_minibatch_s:.6g}s"

    @staticmethod
    def parse(text: str) -> Plan:
        body, _, time_text = text.partition("@")
        stages = []
        for part in body.split("|"):
            span, _, replicas = part.strip().partition("x")
            first, _, last = span.partition("-")
            stages.append(StagePlan(int(first), int(last), int(replicas)))
        seconds = float(time_text.strip().rstrip("s")) if time_text.strip() else math.nan
        return Plan(tuple(stages), seconds)


class _Prefix:
    """Prefix sums so that a span's cost is computed the same way by the DP and the brute force."""

    def __init__(self, layers: Sequence[LayerCost]):
        self.compute = list(itertools.accumulate((layer.compute_s for layer in layers), initial=0.0))
        self.params = list(itertools.accumulate((layer.param_bytes for layer in layers), initial=0))
        self.activations = [layer.activation_bytes for layer in layers]

    def stage_time(self, first: int, last: int, replicas: int, bandwidth: float) -> float:
        compute = self.compute[last + 1] - self.compute[first]
        weights = self.params[last + 1] - self.params[first]
        allreduce = 4.0 * (replicas - 1) * weights / (bandwidth * replicas)
        return (compute + allreduce) / replicas

    def boundary_time(
        self, after_layer: int, receiving_replicas: int, bandwidth: float, compression_ratio: float
    ) -> float:
        return 2.0 * self.activations[after_layer] / (bandwidth * receiving_replicas * compression_ratio)


def plan_cost(
    layers: Sequence[LayerCost], stages: Sequence[StagePlan], bandwidth: float, compression_ratio: float = 1.0
) -> float:
    prefix = _Prefix(layers)
    worst = 0.0
    for index, stage in enumerate(stages):
        worst = max(worst, prefix.stage_time(stage.first, stage.last, stage.replicas, bandwidth))
        if index > 0:
            worst = max(
                worst, prefix.boundary_time(stage.first - 1, stage.replicas, bandwidth, compression_ratio)
            )
    return worst


def _check(layers: Sequence[LayerCost], workers: int, bandwidth: float, compression_ratio: float) -> None:
    if not layers or workers < 1:
        raise ValueError("need at least one layer and one worker")
    if bandwidth <= 0 or compression_ratio <= 0:
        raise ValueError("bandwidth and compression ratio must be positive")


def partition(
    layers: Sequence[LayerCost],
    workers: int,
    bandwidth: float,
    *,
    compression_ratio: float = 1.0,
    straight: bool = False,
) -> Plan:
    """The optimal plan on exactly ``workers`` workers; ``straight`` forbids replication."""
    _check(layers, workers, bandwidth, compression_ratio)
    n, prefix = len(layers), _Prefix(layers)
    if straight and workers > n:
        raise ValueError(f"a straight pipeline of {n} layers cannot use {workers} workers")
    inf = math.inf
    # best[j][m]: least time of layers 0..j on exactly m workers; choice[j][m] = (k, r): the last
    # stage is layers k+1..j on r replicas (k = -1: a single stage).
    best = [[inf] * (workers + 1) for _ in range(n)]
    choice: list[list[tuple[int, int] | None]] = [[None] * (workers + 1) for _ in range(n)]
    for j in range(n):
        for m in range(1, workers + 1):
            if not straight or m == 1:
                best[j][m] = prefix.stage_time(0, j, m, bandwidth)
                choice[j][m] = (-1, m)
            for k in range(j):
                for r in [1] if straight else range(1, m):
                    if best[k][m - r] == inf:
                        continue
                    candidate = max(
                        best[k][m - r],
                        prefix.stage_time(k + 1, j, r, bandwidth),
                        prefix.boundary_time(k, r, bandwidth, compression_ratio),
                    )
                    if candidate < best[j][m]:
                        best[j][m], choice[j][m] = candidate, (k, r)
    if best[n - 1][workers] == inf:
        raise ValueError(f"no plan of {n} layers on {workers} workers")
    stages, j, m = [], n - 1, workers
    while j >= 0:
        last_stage = choice[j][m]
        assert last_stage is not None, "a finite best[j][m] always has its choice recorded"
        k, r = last_stage
        stages.append(StagePlan(k + 1, j, r))
        j, m = k, m - r
    return Plan(tuple(reversed(stages)), best[n - 1][workers])


def _compositions(total: int, parts: int):
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in _compositions(total - first, parts - 1):
            yield (first,) + rest


def brute_force(
    layers: Sequence[LayerCost],
    workers: int,
    bandwidth: float,
    *,
    compression_ratio: float = 1.0,
    straight: bool = False,
) -> Plan:
    """Enumerate every split and replica assignment; for checking ``partition`` on small cases."""
    _check(layers, workers, bandwidth, compression_ratio)
    n, best = len(layers), None
    for n_stages in range(1, min(n, workers) + 1):
        if straight and n_stages != workers:
            continue
        for cuts in itertools.combinations(range(n - 1), n_stages - 1):
            bounds = list(zip((0,) + tuple(c + 1 for c in cuts), cuts + (n - 1,), strict=True))
            for replicas in _compositions(workers, n_stages):
                stages = tuple(StagePlan(f, last, r) for (f, last), r in zip(bounds, replicas, strict=True))
                cost = plan_cost(layers, stages, bandwidth, compression_ratio)
                if best is None or cost < best.time_per_minibatch_s:
                    best = Plan(stages, cost)
    if best is None:
        raise ValueError(f"no plan of {n} layers on {workers} workers")
    return best


def even_plan(n_layers: int, workers: int) -> Plan:
    """A straight plan with layers spread evenly (no profile needed); time unknown (nan)."""
    if workers > n_layers:
        raise ValueError(f"{n_layers} layers cannot fill {workers} stages")
    bounds = [round(i * n_layers / workers) for i in range(workers + 1)]
    return Plan(tuple(StagePlan(bounds[i], bounds[i + 1] - 1, 1) for i in range(workers)), math.nan)
