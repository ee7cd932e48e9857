"""Gist's fused binarize kernels against the torch path: the same pooled values, packed codes and
gradients, bit for bit (signed zeros, ties, infinities, ragged sizes, 1-D and 2-D windows)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cloud.training.compression import gist
from cloud.training.compression.gist import ReluMaxPoolBinarized

torch.set_num_threads(1)


def _run(module: nn.Module, x: torch.Tensor, upstream: torch.Tensor, monkeypatch, kernels: bool):
    with monkeypatch.context() as patch:
        if not kernels:
            patch.setattr(gist, "_kernels_cover", lambda tensor, kernel: False)
        leaf = x.clone().requires_grad_()
        out = module(leaf)
        out.backward(upstream)
    return out.detach(), leaf.grad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("kernel", [2, (1, 2), 3, (2, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_2d_kernels_match_the_torch_path_bit_for_bit(kernel, seed, monkeypatch) -> None:
    torch.manual_seed(seed)
    x = torch.randint(-2, 3, (3, 4, 9, 11)).float()  # ties everywhere, ragged edges
    x[0, 0, :2, :2] = -0.0
    x[1, 2, 4, 4] = float("inf")
    x[2, 3, 5, 5] = float("-inf")
    module = ReluMaxPoolBinarized(nn.MaxPool2d(kernel))
    upstream = torch.randn_like(nn.functional.max_pool2d(x, kernel))
    upstream.view(-1)[::5] = -0.0
    upstream.view(-1)[::11] = float("inf")
    reference = _run(module, x, upstream, monkeypatch, kernels=False)
    fused = _run(module, x, upstream, monkeypatch, kernels=True)
    assert torch.equal(_bits(reference[0]), _bits(fused[0]))
    assert torch.equal(_bits(reference[1]), _bits(fused[1]))
    # And against the unfused pair: PyTorch's own ReLU and max-pool.
    leaf = x.clone().requires_grad_()
    out = nn.functional.max_pool2d(torch.relu(leaf), kernel)
    out.backward(upstream)
    assert torch.equal(_bits(out.detach()), _bits(fused[0]))
    assert torch.equal(_bits(leaf.grad), _bits(fused[1]))


def test_1d_kernel_matches_and_keeps_the_same_packed_codes(monkeypatch) -> None:
    torch.manual_seed(3)
    x = torch.randn(4, 8, 37)
    module = ReluMaxPoolBinarized(nn.MaxPool1d(2))
    upstream = torch.randn(4, 8, 18)
    packed = {}
    for kernels in (False, True):
        with monkeypatch.context() as patch:
            if not kernels:
                patch.setattr(gist, "_kernels_cover", lambda tensor, kernel: False)
            with torch.autograd.graph.saved_tensors_hooks(
                lambda t, key=kernels: packed.setdefault(key, t), lambda t: t
            ):
                leaf = x.clone().requires_grad_()
                out = module(leaf)
            out.backward(upstream)
            packed[kernels, "grad"] = leaf.grad
            packed[kernels, "out"] = out.detach()
    assert torch.equal(packed[False], packed[True])  # 2 bits per window, the same bytes
    assert packed[True].numel() == 4 * 8 * 18 // 4
    assert torch.equal(packed[False, "out"], packed[True, "out"])
    assert torch.equal(_bits(packed[False, "grad"]), _bits(packed[True, "grad"]))


def test_a_nan_window_falls_back_to_max_pool(monkeypatch) -> None:
    x = torch.randn(2, 3, 8, 8)
    x[1, 1, 3, 2] = float("nan")
    upstream = torch.randn(2, 3, 4, 4)
    module = ReluMaxPoolBinarized(nn.MaxPool2d(2))
    fused = _run(module, x, upstream, monkeypatch, kernels=True)
    leaf = x.clone().requires_grad_()
    out = nn.functional.max_pool2d(torch.relu(leaf), 2)
    out.backward(upstream)
    assert torch.equal(out.detach().nan_to_num(7.0), fused[0].nan_to_num(7.0))
    assert torch.equal(leaf.grad.nan_to_num(7.0), fused[1].nan_to_num(7.0))
