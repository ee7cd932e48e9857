"""The global model's flat layout (cloud side); both ends build the architecture with
``models.architectures.build_architecture``.

Invariant: ``Layout.flatten`` and ``Layout.unflatten`` are inverse: a flat float32 vector has the
layout's tensors (the model's floating state-dict entries) in state-dict order, each row-major;
``state_mask`` marks the coordinates of ``state_names`` (buffers: updates carry their values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from models.architectures import build_architecture, state_names, variance_names
from protocol.federated import ModelArch


def build_model(arch: ModelArch) -> nn.Module:
    return build_architecture(arch)


@dataclass(frozen=True)
class Layout:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    state_names: frozenset[str] = frozenset()  # floating buffers: values in an update, not deltas
    variance_names: frozenset[str] = frozenset()  # running variances: never negative

    @classmethod
    def of(cls, model: nn.Module) -> Layout:
        state = model.state_dict()
        names = tuple(k for k, v in state.items() if v.is_floating_point())
        return cls(
            names, tuple(tuple(state[k].shape) for k in names), state_names(model), variance_names(model)
        )

    @property
    def state_mask(self) -> torch.Tensor:
        """bool, one per flat coordinate: True where the tensor is one of ``state_names``."""
        return torch.cat(
            [
                torch.full((math.prod(shape),), name in self.state_names, dtype=torch.bool)
                for name, shape in zip(self.names, self.shapes, strict=True)
            ]
        )

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def flatten(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([state[name].detach().reshape(-1).float() for name in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, cursor = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            n = math.prod(shape)
            out[name] = flat[cursor : cursor + n].view(shape).clone()
            cursor += n
        return out
