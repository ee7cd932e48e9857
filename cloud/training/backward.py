"""Split backward for one stage: the input gradient first, the weight gradients after it is sent.

In a pipeline the previous stage waits for this stage's input gradient, not for its weight
gradients. ``LayerTape`` runs a stage's ``nn.Sequential`` layer by layer and keeps each layer's
output; ``input_gradient`` then differentiates the stage output with respect to the stage input and
to the outputs of the layers that own parameters (a pass that computes activation gradients only),
and ``weight_gradients`` afterwards differentiates each such layer's output with respect to its own
parameters. This is the B/W split of zero-bubble pipelining: the same arithmetic as one backward,
reordered so that the gradient the neighbour needs leaves a weight-gradient pass earlier.

Invariant: ``weight_gradients(input_gradient(...))`` returns, per parameter in ``named_parameters``
order, the gradient a single ``torch.autograd.grad`` over the stage would (``None`` where unused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

import torch
from torch import nn
from torch.func import functional_call


def splittable(module: nn.Module) -> TypeGuard[nn.Sequential]:
    """A plain ``nn.Sequential`` whose layers neither write their input in place (that would
    overwrite the output the tape keeps for the layer before) nor share parameters."""
    if type(module) is not nn.Sequential or any(getattr(layer, "inplace", False) for layer in module):
        return False
    # a parameter shared by two layers would appear once in the stage's list and twice on the tape
    return sum(1 for layer in module for _ in layer.parameters()) == sum(1 for _ in module.parameters())


class LayerTape:
    """One microbatch's forward through a stage, layer by layer, with the parameterised layers'
    outputs kept for the weight-gradient pass."""

    def __init__(
        self, module: nn.Sequential, x: torch.Tensor, params: Mapping[str, torch.Tensor] | None = None
    ):
        self.outputs: list[torch.Tensor] = []  # output of each layer that owns parameters
        self.weights: list[list[torch.Tensor]] = []  # that layer's parameters, named_parameters order
        h = x
        for prefix, layer in module.named_children():  # a slice of a model keeps its layer names
            weights: dict[str, torch.Tensor] = dict(layer.named_parameters())
            if params is None:
                h = layer(h)
            else:  # a stashed weight version, keyed like the stage's named_parameters
                weights = {name: params[f"{prefix}.{name}"] for name in weights}
                h = functional_call(layer, weights, (h,))
            if weights:
                self.outputs.append(h)
                self.weights.append(list(weights.values()))
        self.output = h


def input_gradient(
    tape: LayerTape, loss_or_output: torch.Tensor, stage_input: torch.Tensor, grad_output: torch.Tensor | None
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """d(stage output)/d(stage input), and the gradients at the parameterised layers' outputs that
    ``weight_gradients`` needs. Keeps the graph for that second pass."""
    grads = torch.autograd.grad(
        loss_or_output, [stage_input, *tape.outputs], grad_output, retain_graph=True, allow_unused=True
    )
    return grads[0], list(grads[1:])


def weight_gradients(tape: LayerTape, output_grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Per parameter of the stage (``named_parameters`` order), its gradient; frees the graph."""
    grads: list[torch.Tensor | None] = []
    for out, weights, grad in zip(tape.outputs, tape.weights, output_grads, strict=True):
        if grad is None:  # the layer does not reach the output
            grads += [None] * len(weights)
        else:
            grads += torch.autograd.grad(out, weights, grad, allow_unused=True)
    return grads
