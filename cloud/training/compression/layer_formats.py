"""Per-layer activation-compression policy: which BFP format (or none) each layer's saved tensors use.

A policy is an immutable value with a text form; the adaptive controller replaces it rather than
mutating it, so a policy read once stays consistent for a whole forward pass.

Invariant: ``format_for(name)`` is the layer's own entry if it has one, else ``default``; ``None``
means "keep the saved tensors as they are (fp32)".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from models.numerics import BfpFormat


@dataclass(frozen=True)
class LayerPolicy:
    default: BfpFormat | None = None
    per_layer: tuple[tuple[str, BfpFormat | None], ...] = field(default=())

    @classmethod
    def uniform(cls, fmt: BfpFormat | None) -> LayerPolicy:
        return cls(default=fmt)

    @classmethod
    def from_mapping(
        cls, layers: Mapping[str, BfpFormat | None], default: BfpFormat | None = None
    ) -> LayerPolicy:
        return cls(default=default, per_layer=tuple(sorted(layers.items())))

    def format_for(self, layer: str) -> BfpFormat | None:
        for name, fmt in self.per_layer:
            if name == layer:
                return fmt
        return self.default

    def names(self, layer: str) -> bool:
        """Whether ``layer`` has its own entry (as opposed to falling back to ``default``)."""
        return any(name == layer for name, _ in self.per_layer)

    def with_layer(self, layer: str, fmt: BfpFormat | None) -> LayerPolicy:
        entries = dict(self.per_layer)
        entries[layer] = fmt
        return LayerPolicy(self.default, tuple(sorted(entries.items())))

    def __str__(self) -> str:
        parts = [f"default={self.default or 'fp32'}"]
        parts += [f"{name}={fmt or 'fp32'}" for name, fmt in self.per_layer]
        return "; ".join(parts)
