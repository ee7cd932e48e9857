"""Lossless encodings beyond ReLU->MaxPool2d: 1-D pooling binarized, dropout masks as bits, and
recurrent layers recomputed in backward; each gives the very gradients of the plain model."""

from __future__ import annotations

import copy

import torch
from torch import nn

from cloud.training.compression import (
    ActivationCompressor,
    LayerPolicy,
    gist_transform,
    recompute_recurrent,
)
from cloud.training.compression.gist import BINARIZE

torch.set_num_threads(1)


def _grads(
    model: nn.Module, x: torch.Tensor, compressor: ActivationCompressor | None = None
) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks in every run
    if compressor is None:
        loss = model(x).square().sum()
    else:
        with compressor.active():
            loss = model(x).square().sum()
    loss.backward()
    return [_grad(p) for p in model.parameters()]


def _grad(param: nn.Parameter) -> torch.Tensor:
    assert param.grad is not None, "every parameter reaches the loss"
    return param.grad.clone()


def test_relu_maxpool1d_is_binarized_and_exact() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(2, 8, 3, padding=1), nn.ReLU(), nn.MaxPool1d(4), nn.Flatten(), nn.Linear(8 * 9, 3)
    )
    x = torch.randn(5, 2, 37)  # 37 = 9 windows of 4 and one sample left over
    reference = _grads(model, x)
    transformed, plan = gist_transform(model)
    assert [(p.producer, p.encoding) for p in plan.pairs] == [("1", BINARIZE)]
    compressor = ActivationCompressor(transformed, LayerPolicy(), min_numel=0)
    grads = _grads(transformed, x, compressor)
    assert all(torch.equal(a, b) for a, b in zip(reference, grads, strict=True))
    # No int64 pool indices and no fp32 ReLU output: the fused layer keeps 4 bits per window.
    fused = [name for name in compressor.counters if name.startswith("gist_")]
    assert compressor.counters[fused[0]].stored == 5 * 8 * 9 // 2


def test_dropout_mask_is_stored_as_bits_and_exact() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.3), nn.Linear(64, 2))
    x = torch.randn(32, 16)
    reference = _grads(model, x)
    compressor = ActivationCompressor(model, LayerPolicy(), min_numel=0)
    grads = _grads(model, x, compressor)
    assert all(torch.equal(a, b) for a, b in zip(reference, grads, strict=True))
    assert compressor.kinds["bits"] == 1
    assert compressor.counters["1"].stored == 32 * 64 // 8  # one bit per element, not one byte


def test_recomputed_recurrent_layers_give_the_same_gradients_and_save_only_their_input() -> None:
    torch.manual_seed(0)
    for layer in (nn.GRU(3, 16, batch_first=True), nn.LSTM(3, 16, batch_first=True)):
        model = nn.Sequential(layer)
        x = torch.randn(4, 30, 3)
        out = model(x)[0]
        out.square().sum().backward()
        reference = [_grad(p) for p in model.parameters()]
        recomputed = recompute_recurrent(copy.deepcopy(model))
        recomputed.zero_grad()
        compressor = ActivationCompressor(recomputed, LayerPolicy(), min_numel=0)
        with compressor.active():
            loss = recomputed(x)[0].square().sum()
        loss.backward()
        assert all(torch.equal(a, _grad(p)) for a, p in zip(reference, recomputed.parameters(), strict=True))
        assert compressor.total().original == x.numel() * 4 + out.numel() * 4  # the input; square's input
