"""Per-layer profile of an ``nn.Sequential``: forward and backward seconds, activation and parameter
bytes, measured with the intra-op thread count the job will run with; cached in a JSON file.

Invariant: a cached profile is reused only for the same model signature (the layers' text form
and parameter shapes), the same input shape (batch size included), the same thread count and the
same kind of device (a GPU's times are measured after waiting for its queued work); the
cache file is replaced atomically, so a reader sees the old or the new file, never a torn one.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from torch import nn

from cloud.training.partition import LayerCost
from runtime.files import atomic_write


def model_signature(
    model: nn.Sequential, input_shape: tuple[int, ...], threads: int, device: str = "cpu"
) -> str:
    text = repr(model) + repr([tuple(p.shape) for p in model.parameters()])
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    on = "" if device == "cpu" else f"|device={device}"  # CPU keys as before: existing caches stay valid
    return f"{digest}|input={list(input_shape)}|threads={threads}{on}"


def _now(x: torch.Tensor) -> float:
    """The time once ``x``'s device has done its queued work (a GPU runs kernels asynchronously)."""
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
    return time.perf_counter()


def _time_layer(layer: nn.Module, x: torch.Tensor, repeats: int) -> tuple[float, float, torch.Tensor]:
    forward, backward, out = [], [], x
    for _ in range(repeats + 1):  # the first round warms caches and allocator; not counted
        inp = x.detach().requires_grad_(x.is_floating_point())
        start = _now(inp)
        out = layer(inp)
        middle = _now(inp)
        params = [p for p in layer.parameters() if p.requires_grad]
        inputs = ([inp] if inp.requires_grad else []) + params
        if inputs and out.requires_grad:
            torch.autograd.grad(out, inputs, torch.ones_like(out))
        end = _now(inp)
        forward.append(middle - start)
        backward.append(end - middle)
    # The fastest round, not the median: on shared cores the slow rounds measure other processes.
    return min(forward[1:]), min(backward[1:]), out.detach()


def profile_layers(
    model: nn.Sequential, sample: torch.Tensor, *, threads: int = 1, repeats: int = 5
) -> list[LayerCost]:
    """Measure each layer on ``sample`` (one minibatch), running with ``threads`` intra-op threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        costs, x = [], sample
        for layer in model:
            forward_s, backward_s, x = _time_layer(layer, x, repeats)
            param_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
            costs.append(LayerCost(forward_s, backward_s, x.numel() * x.element_size(), param_bytes))
        return costs
    finally:
        torch.set_num_threads(previous)


def cached_profile(
    model: nn.Sequential, sample: torch.Tensor, cache_path: str | Path, *, threads: int = 1, repeats: int = 5
) -> list[LayerCost]:
    """``profile_layers`` through a JSON cache keyed by ``model_signature``."""
    path = Path(cache_path)
    key = model_signature(model, tuple(sample.shape), threads, sample.device.type)
    try:
        cache = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        cache = {}  # a missing or unreadable cache only costs a new measurement
    if key in cache:
        return [LayerCost(**entry) for entry in cache[key]]
    costs = profile_layers(model, sample, threads=threads, repeats=repeats)
    cache[key] = [vars(c) for c in costs]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(cache, indent=1).encode())
    return costs
