"""What a pipelined run must equal, computed in one process: gradient accumulation over the
microbatches, and PipeDream's weight-stashing update rule; and how to compare parameters."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from cloud.training import checkpoint
from cloud.training.data.stream import DigitsStream
from cloud.training.schedules import build_schedule
from models.digits import digits_cnn


def merged_checkpoint(ckpt: Path, n_stages: int, step: int) -> dict[str, torch.Tensor]:
    """The whole model's parameters from the stages' checkpoints of ``step``."""
    merged: dict[str, torch.Tensor] = {}
    for stage in range(n_stages):
        merged.update(checkpoint.load_stage(ckpt, stage, step)["model"])
    return merged


def reference_grad_accumulation(
    steps: int, batch_size: int, microbatches: int, lr: float = 0.05, seed: int = 0
) -> nn.Sequential:
    """Single process: same init, same data order, gradient accumulation over the microbatches."""
    torch.manual_seed(seed)
    model = digits_cnn()
    stream = DigitsStream(seed, batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        x, y = stream.minibatch(step)
        optimizer.zero_grad()
        for xb, yb in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
            (loss_fn(model(xb), yb) / microbatches).backward()
        optimizer.step()
    return model


def reference_pipedream(
    steps: int,
    batch_size: int,
    microbatches: int,
    stages: list[tuple[int, int]],
    *,
    vertical_sync: bool = False,
    lr: float = 0.05,
    seed: int = 0,
) -> nn.Sequential:
    """Single process: PipeDream's update rule as the 1F1B-stash schedule orders it. Microbatch b
    runs forward and backward on stage s's weights after the updates s applied before its F (with
    vertical sync: the updates stage 0 had applied); every backward updates its stage once."""
    torch.manual_seed(seed)
    model = digits_cnn()
    stream = DigitsStream(seed, batch_size)
    modules = [model[first : last + 1] for first, last in stages]
    optimizers = [
        torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) if list(m.parameters()) else None
        for m in modules
    ]
    schedule = build_schedule("1f1b-stash", [1] * len(stages), microbatches, vertical_sync=vertical_sync)
    uses = [
        schedule.stash_versions() if vertical_sync else schedule.updates_before_forward(s)
        for s in range(len(stages))
    ]
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        x, y = stream.minibatch(step)
        versions = [[_detached(m)] for m in modules]  # versions[s][k]: stage s after k updates
        for b, (xb, yb) in enumerate(zip(x.chunk(microbatches), y.chunk(microbatches), strict=True)):
            weights = [versions[s][uses[s][b]] for s in range(len(stages))]
            h = xb
            for module, params in zip(modules, weights, strict=True):
                h = functional_call(module, params, (h,))
            flat = [p for params in weights for p in params.values()]
            grads = iter(torch.autograd.grad(loss_fn(h, yb), flat))
            for module, optimizer, stage_versions in zip(modules, optimizers, versions, strict=True):
                for p in module.parameters():
                    p.grad = next(grads)
                if optimizer is not None:  # a stage without parameters (pool + flatten)
                    optimizer.step()
                stage_versions.append(_detached(module))
    return model


def _detached(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone().requires_grad_(True) for name, p in module.named_parameters()}


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in a)
