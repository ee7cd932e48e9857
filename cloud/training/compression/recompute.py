"""Recurrent layers recomputed in backward: the rule for layers whose saved tensors are many and small.

A GRU/LSTM/RNN call over L time steps saves a few small tensors per step (~400 for a 64-step GRU):
through Python saved-tensor hooks each costs tens of microseconds to pack and unpack whatever its
format (a no-op hook pair already adds ~15% to such a step), so compressing them cannot reach the
step-time floor. ``recompute_recurrent`` wraps every ``nn.RNNBase`` of a model instead: its forward
runs without saving anything, and backward runs it again from its input (kept as it is: a
``RecomputedLayer``'s saved tensors are never encoded) to get exact fp32 gradients. Cost: one more
forward of the layer per step; bytes saved for backward: the layer's input only.

Invariant: gradients through a ``RecomputedLayer`` equal the wrapped layer's own (the same ops on
the same values, CPU kernels being deterministic), and it saves only its input for backward.
"""

from __future__ import annotations

import torch
from torch import nn


class _Recomputed(torch.autograd.Function):
    """(layer, x, *params) -> (output, *state): an LSTM's state is two tensors, a GRU's one."""

    @staticmethod
    def forward(ctx, layer: nn.Module, x: torch.Tensor, *params: torch.Tensor):
        ctx.layer = layer
        ctx.save_for_backward(x)
        with torch.no_grad():
            output, state = layer(x)
        return (output, *_states(state))

    @staticmethod
    def backward(ctx, *grads_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        params = [p for p in ctx.layer.parameters() if p.requires_grad]
        with torch.enable_grad():
            source = x.detach().requires_grad_(ctx.needs_input_grad[1])
            output, state = ctx.layer(source)
            inputs = ([source] if source.requires_grad else []) + params
            grads = torch.autograd.grad((output, *_states(state)), inputs, grads_out, allow_unused=True)
        grad_x = grads[0] if source.requires_grad else None
        return (None, grad_x, *grads[len(grads) - len(params) :])


def _states(state: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return state if isinstance(state, tuple) else (state,)


class RecomputedLayer(nn.Module):
    """Wraps one recurrent layer (called with its input alone, returning (output, state))."""

    def __init__(self, layer: nn.RNNBase) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None):
        if state is not None:
            raise ValueError("state: a recomputed recurrent layer starts from zeros (no initial state)")
        if not torch.is_grad_enabled():
            return self.layer(x)
        params = [p for p in self.layer.parameters() if p.requires_grad]
        output, *state = _Recomputed.apply(self.layer, x, *params)
        return output, (tuple(state) if isinstance(self.layer, nn.LSTM) else state[0])


def recompute_recurrent(model: nn.Module) -> nn.Module:
    """Replace every ``nn.RNNBase`` in ``model`` (in place) by a ``RecomputedLayer``; returns it."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.RNNBase):
            setattr(model, name, RecomputedLayer(child))
        else:
            recompute_recurrent(child)
    return model
