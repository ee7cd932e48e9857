"""The global model's flat layout (cloud side); both ends build the architecture with
``models.digits.build_digits_model``.

Invariant: ``Layout.flatten`` and ``Layout.unflatten`` are inverse: a flat float32 vector has the
layout's tensors in state-dict order, each row-major.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from models.digits import build_digits_model
from protocol.federated import ModelArch


def build_model(arch: ModelArch) -> nn.Module:
    return build_digits_model(arch.kind, arch.width)


@dataclass(frozen=True)
class Layout:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, model: nn.Module) -> Layout:
        state = model.state_dict()
        names = tuple(k for k, v in state.items() if v.is_floating_point())
        return cls(names, tuple(tuple(state[k].shape) for k in names))

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
