"""Barrier policies as data, and the measured window the engine (``engine.py``) decides from.

A ``SyncPolicy`` says how gradient synchronisations are launched: which layers share a bucket
(one all-reduce message, ``merge``); which buckets are *held* behind the barrier (the end of
backward) instead of being sent as soon as their gradients are ready, then sent in forward order;
and which are sent *first*, on a priority lane (a second process group with its own FIFO) so a
layer the next forward pass needs early never queues behind a slow message (P3, ByteScheduler).

Invariant: every policy names each layer exactly once (``validate``), so whatever the engine
chooses, every gradient is still all-reduced once per iteration: the math stays synchronous SGD.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------- policy values


@dataclass(frozen=True)
class SyncPolicy:
    buckets: tuple[tuple[str, ...], ...]  # launch units, in gradient-ready order (output layer first)
    held: frozenset[str] = frozenset()  # layers whose bucket waits for the barrier
    first: frozenset[str] = frozenset()  # layers whose bucket goes on the priority lane

    @classmethod
    def per_layer(cls, forward_order: tuple[str, ...]) -> SyncPolicy:
        """The default: one bucket per layer, each sent as soon as its gradient is ready."""
        return cls(tuple((name,) for name in reversed(forward_order)))

    def validate(self, layers: tuple[str, ...]) -> None:
        named = [name for bucket in self.buckets for name in bucket]
        if sorted(named) != sorted(layers) or len(set(named)) != len(named):
            raise ValueError(f"policy {self.text()!r} must name each of {layers} exactly once")
        for label, names in (("held", self.held), ("first", self.first)):
            if not names <= set(named):
                raise ValueError(f"{label} layers {sorted(names - set(named))} are not in the policy")

    def bucket_held(self, bucket: tuple[str, ...]) -> bool:
        return any(name in self.held for name in bucket)

    def bucket_first(self, bucket: tuple[str, ...]) -> bool:
        return any(name in self.first for name in bucket)

    def main_lane_order(self, forward_index: dict[str, int]) -> list[tuple[str, ...]]:
        """Buckets of the ordinary lane in launch order: ready-order ones, then held in forward order."""
        lane = [b for b in self.buckets if not self.bucket_first(b)]
        now = [b for b in lane if not self.bucket_held(b)]
        later = sorted(
            (b for b in lane if self.bucket_held(b)), key=lambda b: min(forward_index[n] for n in b)
        )
        return now + later

    def bucket_of(self, layer: str) -> tuple[str, ...]:
        for bucket in self.buckets:
            if layer in bucket:
                return bucket
        raise KeyError(layer)

    def text(self) -> str:
        """``fc3|fc2+fc1|fc0 first=fc0 held=fc3``: buckets in ready order (``+`` merges), then sets."""
        parts = ["|".join("+".join(bucket) for bucket in self.buckets)]
        sets = (("first", self.first), ("held", self.held))
        parts += [f"{label}={','.join(sorted(names))}" for label, names in sets if names]
        return " ".join(parts)

    @classmethod
    def parse(cls, text: str) -> SyncPolicy:
        body, *options = text.split()
        sets: dict[str, frozenset[str]] = {"first": frozenset(), "held": frozenset()}
        for option in options:
            label, _, names = option.partition("=")
            if label not in sets:
                raise ValueError(f"unknown policy option {label!r} in {text!r}")
            sets[label] = frozenset(name for name in names.split(",") if name)
        buckets = tuple(tuple(part.split("+")) for part in body.split("|") if part)
        return cls(buckets, sets["held"], sets["first"])

    def __str__(self) -> str:
        return self.text()


# ---------------------------------------------------------------- the measured window


@dataclass(frozen=True)
class LayerWindow:
    name: str
    forward_index: int  # position in the forward pass (0 = needed first)
    nbytes: int  # gradient bytes of the layer
    blocked_s: float  # mean per iteration: compute held up waiting for this layer's sync
    sync_s: float  # mean time of the message carrying this layer, from hand-off to done
    queue_s: float = 0.0  # mean time that message waited in its lane behind earlier messages
    # what the planner (predict.py) models an iteration from; 0 where not measured
    wire_s: float = 0.0  # mean time the message held the (emulated) wire; 0 without emulation
    reduce_s: float = 0.0  # shortest time of its collective, launch to done (means count peer waits)
    forward_s: float = 0.0  # mean forward compute (the last layer's: until backward's first gradient)
    ready_s: float = 0.0  # mean time its gradients were all ready, from backward's first gradient


@dataclass(frozen=True)
class WindowTable:
    window: int
    iterations: int
    iteration_s: float  # mean wall time per iteration
    policy: str
    layers: tuple[LayerWindow, ...]

    @property
    def blocked_s(self) -> float:
        return sum(layer.blocked_s for layer in self.layers)

    def as_dict(self) -> dict:
        times = ("blocked", "sync", "queue", "wire", "reduce", "forward", "ready")
        return {
            "window": self.window,
            "iterations": self.iterations,
            "policy": self.policy,
            "iteration_ms": round(self.iteration_s * 1e3, 3),
            "blocked_ms": round(self.blocked_s * 1e3, 3),
            "layers": [
                {
                    "layer": layer.name,
                    "forward_index": layer.forward_index,
                    "bytes": layer.nbytes,
                    **{f"{time}_ms": round(getattr(layer, f"{time}_s") * 1e3, 3) for time in times},
                }
                for layer in self.layers
            ],
        }
