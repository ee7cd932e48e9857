"""Predict an iteration's time under a barrier policy from one measured window, and pick the best
of a small candidate set. Pure: no clock, no torch.

Why a model: on a link slower than backward, the policies that matter trade the per-message cost
on a serial wire (fewer, bigger messages) against how early each message can start (a bucket
leaves when its last gradient is ready) and against what the next forward waits for (the layers it
needs first should arrive first). Blocked time measured over a window of a few iterations swings
by 10-20% on a shared box, too much to find that optimum by trial and error one merge at a time;
a model of the iteration built from the same window ranks the candidates in microseconds, and the
engine then tries only the best one and measures it.

The model of one iteration (steady state: every sync of the last iteration is done before the next
forward finishes, so each backward starts with an idle link):
- backward starts at 0; layer ``l``'s gradient is ready at ``ready_s[l]`` (measured from the first
  gradient); a bucket is handed over when its last layer is ready, a held bucket when backward ends;
- a message first occupies the shared wire for ``wire(bytes)`` (one at a time across both lanes; a
  waiting priority message goes before a waiting ordinary one, not pre-empting), then its lane's
  collective for ``reduce(bytes)`` (one at a time per lane; each lane is its own process group);
- the next forward runs the layers in order, each starting when the previous one finished and its
  own bucket's sync is done, taking ``forward_s[l]``; the last layer's time runs until the next
  backward's first gradient. The iteration ends there.
Costs are ``fixed + per_byte * bytes`` fitted (least squares) to the window's messages.

Invariant: candidates are policies over the same layers (``SyncPolicy.validate`` holds), so the
planner only ever reorders and regroups the same all-reduces: the math stays synchronous SGD.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cloud.training.sync.barrier import LayerWindow, SyncPolicy


@dataclass(frozen=True)
class Cost:
    """``fixed_s + per_byte_s * bytes``: one stage of a message on the link."""

    fixed_s: float
    per_byte_s: float

    def __call__(self, nbytes: int) -> float:
        return self.fixed_s + self.per_byte_s * nbytes

    def __str__(self) -> str:
        return f"{self.fixed_s * 1e3:.2f} ms + {self.per_byte_s * 1e9:.2f} ns/B"

    @classmethod
    def fit(cls, points: Iterable[tuple[int, float]], min_spread: float = 1.0) -> Cost | None:
        """Least squares over (bytes, seconds); None when the sizes cannot separate the two terms
        (one size, or the largest under ``min_spread`` times the smallest). A negative term (noise)
        is clamped to 0 and the other refitted through the mean."""
        points = list(points)
        sizes = [size for size, _ in points]
        if len(set(sizes)) < 2 or max(sizes) < min_spread * min(sizes):
            return None
        mean_size, mean_time = statistics.mean(sizes), statistics.mean(t for _, t in points)
        spread = sum((size - mean_size) ** 2 for size in sizes)
        per_byte = sum((size - mean_size) * (t - mean_time) for size, t in points) / spread
        if per_byte <= 0:
            return cls(max(0.0, mean_time), 0.0)
        fixed = mean_time - per_byte * mean_size
        if fixed < 0:
            return cls(0.0, mean_time / mean_size)
        return cls(fixed, per_byte)


@dataclass(frozen=True)
class LinkModel:
    wire: Cost  # time a message holds the shared wire (0 on a link with no emulated delay)
    reduce: Cost  # time of the lane's collective after the wire

    def __str__(self) -> str:
        return f"wire {self.wire}, collective {self.reduce}"

    @classmethod
    def median(cls, fits: Sequence[LinkModel]) -> LinkModel:
        """Each of the four terms' median over ``fits`` (one window's collective times include
        waits for a late peer and swing from window to window; the wire's hardly do)."""

        def term(stage: str, part: str) -> float:
            return statistics.median(getattr(getattr(fit, stage), part) for fit in fits)

        return cls(*(Cost(term(stage, "fixed_s"), term(stage, "per_byte_s")) for stage in ("wire", "reduce")))

    @classmethod
    def fit(cls, layers: Sequence[LayerWindow], policy: SyncPolicy) -> LinkModel | None:
        """Fit both stages over the policy's buckets (each bucket one message); None unless the
        largest message is at least twice the smallest (two nearly equal sizes give any line)."""
        by_name = {layer.name: layer for layer in layers}
        buckets = [[by_name[name] for name in bucket] for bucket in policy.buckets]
        sizes = [sum(layer.nbytes for layer in bucket) for bucket in buckets]
        firsts = [bucket[0] for bucket in buckets]  # every layer of a bucket carries its message's times
        wire = Cost.fit(zip(sizes, (layer.wire_s for layer in firsts), strict=True), min_spread=2.0)
        reduce = Cost.fit(zip(sizes, (layer.reduce_s for layer in firsts), strict=True), min_spread=2.0)
        if wire is None or reduce is None:
            return None
        return cls(wire, reduce)


def predict_iteration_s(policy: SyncPolicy, layers: Sequence[LayerWindow], link: LinkModel) -> float:
    """Backward start to the next backward start under ``policy`` (the model in the module doc)."""
    by_name = {layer.name: layer for layer in layers}
    backward_end = max(layer.ready_s for layer in layers)

    def first_needed(bucket: tuple[str, ...]) -> int:
        return min(by_name[name].forward_index for name in bucket)

    handed = {
        bucket: backward_end if policy.bucket_held(bucket) else max(by_name[n].ready_s for n in bucket)
        for bucket in policy.buckets
    }
    lanes = {
        lane: sorted(
            (b for b in policy.buckets if policy.bucket_first(b) == lane),
            key=lambda b: (handed[b], first_needed(b)),
        )
        for lane in (True, False)
    }
    wire_free = 0.0
    lane_free = {True: 0.0, False: 0.0}
    done: dict[str, float] = {}
    while lanes[True] or lanes[False]:
        # the head that gets the wire earliest; at a tie the priority lane's
        start, _, lane = min(
            (max(handed[lanes[lane][0]], wire_free), not lane, lane) for lane in (True, False) if lanes[lane]
        )
        bucket = lanes[lane].pop(0)
        nbytes = sum(by_name[name].nbytes for name in bucket)
        wire_free = start + link.wire(nbytes)
        lane_free[lane] = max(wire_free, lane_free[lane]) + link.reduce(nbytes)
        done.update(dict.fromkeys(bucket, lane_free[lane]))

    clock = backward_end
    for layer in sorted(layers, key=lambda layer: layer.forward_index):
        clock = max(clock, done[layer.name]) + layer.forward_s
    return clock


def candidates(layers: Sequence[LayerWindow]) -> list[SyncPolicy]:
    """Contiguous groupings of the layers, each closed greedily at a size cap (every cap that gives
    a distinct grouping, filled from the output end and from the input end), each with the
    priority-lane choices: none, or the first-needed 1, 2, 4... buckets (up to half of them) held
    to the end of backward and sent first in forward order (the bucket holding the first layer is
    ready last anyway). O(layers log layers) policies."""
    ordered = sorted(layers, key=lambda layer: layer.forward_index)
    groupings: dict[tuple[tuple[str, ...], ...], None] = {}
    for from_output in (True, False):
        sequence = list(reversed(ordered)) if from_output else ordered
        total = 0
        for layer in sequence:
            total += layer.nbytes
            groupings[_group(sequence, total, from_output)] = None
    index = {layer.name: layer.forward_index for layer in layers}
    policies = []
    for buckets in groupings:
        policies.append(SyncPolicy(buckets))
        by_need = sorted(buckets, key=lambda bucket: min(index[name] for name in bucket))
        count = 1
        while count <= max(1, len(buckets) // 2) and len(buckets) > 1:
            chosen = frozenset(name for bucket in by_need[:count] for name in bucket)
            policies.append(SyncPolicy(buckets, held=chosen, first=chosen))
            count *= 2
    return policies


def _group(sequence: list[LayerWindow], cap: int, from_output: bool) -> tuple[tuple[str, ...], ...]:
    """Greedy grouping of ``sequence`` into buckets of at most ``cap`` bytes (a layer over the cap
    alone), returned in gradient-ready order (output layer first) as ``SyncPolicy`` wants."""
    buckets: list[list[str]] = []
    size = cap + 1
    for layer in sequence:
        if size + layer.nbytes > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(layer.name)
        size += layer.nbytes
    if not from_output:  # filled from the input end: flip to ready order
        buckets = [list(reversed(bucket)) for bucket in reversed(buckets)]
    return tuple(tuple(bucket) for bucket in buckets)


@dataclass(frozen=True)
class Plan:
    policy: SyncPolicy
    predicted_s: float
    current_s: float


def best_plan(
    layers: Sequence[LayerWindow], current: SyncPolicy, link: LinkModel, tabu: frozenset[str] = frozenset()
) -> Plan:
    """The candidate with the shortest predicted iteration (ties: fewest changes, i.e. the current
    policy if it is among the best), not in ``tabu``."""
    current_s = predict_iteration_s(current, layers, link)
    best = Plan(current, current_s, current_s)
    for policy in candidates(layers):
        if policy.text() in tabu:
            continue
        predicted = predict_iteration_s(policy, layers, link)
        if predicted < best.predicted_s:
            best = Plan(policy, predicted, current_s)
    return best
