"""Saved-tensor hooks and Gist: parameters untouched, bytes counted, lossless encodings exact."""

from __future__ import annotations

import contextlib
import copy
import gc

import pytest
import torch
from torch import nn

from cloud.training.compression import ActivationCompressor, LayerPolicy, gist_transform
from cloud.training.compression.gist import BINARIZE, DPR, SSDC
from cloud.training.compression.groups import measured_min_numel
from cloud.training.compression.trainer import relative_grad_error
from models.digits import digits_cnn, load_digits_split
from models.numerics import BfpFormat, packed_nbytes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    split = load_digits_split()
    return split.train_x[:48], split.train_y[:48]


def grads_of(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, compressor: ActivationCompressor | None = None
) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    if compressor is None:
        loss = nn.functional.cross_entropy(model(x), y)
    else:
        with compressor.active():
            loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_parameters_are_not_touched_or_counted() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    fmt = BfpFormat(mantissa_bits=4)
    compressor = ActivationCompressor(model, LayerPolicy.uniform(fmt), min_numel=64)
    x = torch.randn(16, 64)
    with compressor.active():
        model(x).sum().backward()
    # Besides the weights (parameters), "0" saves the batch, which the caller holds: kept raw and
    # counted; "1" saves "0"'s output, an activation: encoded.
    assert compressor.counters["0"].original == compressor.counters["0"].stored == 16 * 64 * 4
    assert compressor.counters["1"].original == 16 * 64 * 4
    assert compressor.counters["1"].stored == packed_nbytes(16 * 64, fmt, 0, 4)
    assert compressor.kinds == {"raw": 1, "bfp": 1, "sparse": 0}
    # A leaf that requires grad (a stashed weight version, a pipeline stage's input) is its owner's.
    compressor.reset_counters()
    stashed_weight = model[0].weight.detach().clone().requires_grad_(True)
    with compressor.active():
        nn.functional.linear(x, stashed_weight).sum().backward()
    assert compressor.total().original == 16 * 64 * 4  # x only: the weight copy is not counted


def test_groups_below_min_numel_are_kept_raw_and_counted() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    fmt = BfpFormat(mantissa_bits=4)
    compressor = ActivationCompressor(model, LayerPolicy.uniform(fmt), min_numel=16 * 64 + 1)
    with compressor.active():
        model(torch.randn(16, 64)).sum().backward()
    assert compressor.kinds["bfp"] == 0 and compressor.counters["1"].stored == 16 * 64 * 4


def test_default_min_numel_is_measured_in_whole_blocks() -> None:
    model = nn.Sequential(nn.Linear(64, 32))
    compressor = ActivationCompressor(model, LayerPolicy.uniform(BfpFormat(mantissa_bits=4)))
    assert compressor.min_numel is None  # measured on the first active()
    with compressor.active():
        model(torch.randn(16, 64)).sum().backward()
    assert compressor.min_numel == measured_min_numel("cpu") and compressor.min_numel % 32 == 0


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 32, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0]


def test_a_recurrent_layer_is_one_encode_per_call() -> None:
    torch.manual_seed(0)
    model = _Recurrent()
    x = torch.randn(8, 24, 4)
    reference = grads_of_sum(model, x)
    fmt = BfpFormat(mantissa_bits=8)
    compressor = ActivationCompressor(model, LayerPolicy.uniform(fmt), min_numel=0)
    grads_of_sum(model, x, compressor)
    # Dozens of small tensors per call (one set per time step), one encode: the call's group.
    assert compressor.counters["gru"].tensors > 24 and compressor.kinds["bfp"] == 1
    assert compressor.counters["gru"].stored < compressor.counters["gru"].original / 3
    assert relative_grad_error(reference, list(model.parameters())) < 0.02


def grads_of_sum(
    model: nn.Module, x: torch.Tensor, compressor: ActivationCompressor | None = None
) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with compressor.active() if compressor else contextlib.nullcontext():
        loss = model(x).square().sum()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]
