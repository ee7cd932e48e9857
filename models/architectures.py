"""The federated architectures: one builder the cloud and the gateways share, and how to load a
global model's floating tensors into it.

An architecture (``protocol.federated.ModelArch``) is a built-in name or a factory
``package.module:function`` that takes no arguments. Built-ins: the digits MLP and CNN (``width``
applies), ``digits_bn_cnn`` (the digits CNN with BatchNorm, whose running statistics are buffers
that travel as values, docs/federated.md) and the camera's ``scene_cnn``.

Invariant: ``build_architecture(arch)`` builds the same module structure on every machine that can
import the factory, and ``input_shape(arch)`` is one sample's input for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from models.digits import N_CLASSES, build_digits_model
from protocol.federated import ModelArch

DIGITS_INPUT = (1, 8, 8)


def digits_bn_cnn(width: int = 16) -> nn.Sequential:
    """The digits CNN with BatchNorm after each convolution."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, N_CLASSES),
    )


def _scene_cnn(width: int) -> nn.Module:
    from models.scene import scene_cnn

    return scene_cnn()


def _scene_input() -> tuple[int, ...]:
    from models.scene import INPUT_SIZE

    return (3, INPUT_SIZE, INPUT_SIZE)


# name -> (builder taking the arch's width, one sample's input shape)
BUILTIN_ARCHITECTURES: dict[str, tuple[Callable[[int], nn.Module], Callable[[], tuple[int, ...]]]] = {
    "digits_mlp": (lambda width: build_digits_model("digits_mlp", width), lambda: DIGITS_INPUT),
    "digits_cnn": (lambda width: build_digits_model("digits_cnn", width), lambda: DIGITS_INPUT),
    "digits_bn_cnn": (digits_bn_cnn, lambda: DIGITS_INPUT),
    "scene_cnn": (_scene_cnn, _scene_input),
}


def build_architecture(arch: ModelArch) -> nn.Module:
    """The module ``arch`` names; ValueError (naming ``arch.kind``) if its factory does not load."""
    builtin = BUILTIN_ARCHITECTURES.get(arch.kind)
    if builtin is not None:
        return builtin[0](arch.width)
    module_name, _, function = arch.kind.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"arch.kind: cannot import {arch.kind!r}: {exc}") from exc
    model = factory()
    if not isinstance(model, nn.Module):
        raise ValueError(f"arch.kind: {arch.kind!r}() returned {type(model).__name__}, not a torch module")
    return model


def input_shape(arch: ModelArch) -> tuple[int, ...]:
    if arch.input_shape is not None:
        return tuple(arch.input_shape)
    return BUILTIN_ARCHITECTURES[arch.kind][1]()


def state_names(model: nn.Module) -> frozenset[str]:
    """Names of the model's floating buffers (BatchNorm running statistics): tensors that are not
    trained by gradients, so an update carries their values, never a delta."""
    return frozenset(name for name, buffer in model.named_buffers() if buffer.is_floating_point())


def variance_names(model: nn.Module) -> frozenset[str]:
    """The running-variance buffers of the model's normalisation layers (never negative)."""
    return frozenset(
        f"{name}.running_var" if name else "running_var"
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.running_var is not None
    )


def load_floating_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a global model's tensors (its floating ones) into ``model``: the integer buffers
    (BatchNorm's ``num_batches_tracked``) are not part of a federated model and keep their values."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    floating = {name for name, value in model.state_dict().items() if value.is_floating_point()}
    wrong = sorted(set(missing) & floating) + sorted(unexpected)
    if wrong:
        raise ValueError(f"global model does not fit the architecture: missing or unexpected {wrong[:4]}")
