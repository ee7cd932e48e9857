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
    assert compressor.kinds == {"raw": 1, "bfp": 1, "sparse": 0, "bits": 0}
    # A leaf that requires grad (a stashed weight version, a pipeline stage's input) is its owner's.
    compressor.reset_counters()
    stashed_weight = model[0].weight.detach().clone().requires_grad_(True)
    with compressor.active():
        nn.functional.linear(x, stashed_weight).sum().backward()
    assert compressor.total().original == 16 * 64 * 4  # x only: the weight copy is not counted


def test_bytes_counted_once_per_tensor_and_released(batch) -> None:
    x, y = batch
    model = digits_cnn()
    compressor = ActivationCompressor(model, LayerPolicy.uniform(BfpFormat(mantissa_bits=4)))
    with compressor.active():
        loss = nn.functional.cross_entropy(model(x), y)
    # ReLU "1" saves its output and conv "2" saves the same tensor: one encoding, counted once.
    assert "2" not in compressor.counters and compressor.counters["1"].tensors == 1
    assert compressor.live_bytes == compressor.total().stored > 0
    loss.backward()
    del loss
    gc.collect()
    assert compressor.live_bytes == 0 and compressor.peak_live_bytes > 0


def test_tensor_saved_by_two_ops_is_decoded_once(batch) -> None:
    x, y = batch
    model = digits_cnn()
    fmt = BfpFormat(mantissa_bits=4)
    compressor = ActivationCompressor(model, LayerPolicy.uniform(fmt), min_numel=64)
    codec = compressor._codec(fmt)
    decode, decoded = codec.decode, []
    codec.decode = lambda packed: decoded.append(packed) or decode(packed)
    grads_of(model, x, y, compressor)
    # Every ReLU output is also saved by the next layer: each encoding is still decoded once.
    assert compressor.kinds["bfp"] >= 3 and len(decoded) == compressor.kinds["bfp"]
    assert len({id(p) for p in decoded}) == len(decoded)


def test_lossy_policy_gradients_close_and_per_layer_none(batch) -> None:
    x, y = batch
    torch.manual_seed(0)
    model = digits_cnn()
    reference = grads_of(model, x, y)
    params = list(model.parameters())
    fine = ActivationCompressor(model, LayerPolicy.uniform(BfpFormat(mantissa_bits=8)), min_numel=64)
    grads_of(model, x, y, fine)
    assert relative_grad_error(reference, params) < 0.05
    only_relu = ActivationCompressor(
        model, LayerPolicy.from_mapping({"1": BfpFormat(mantissa_bits=4)}), min_numel=64
    )
    grads_of(model, x, y, only_relu)
    assert only_relu.kinds["bfp"] == 1 and set(only_relu.counters) >= {"1", "3"}
    assert only_relu.counters["3"].stored == only_relu.counters["3"].original


def test_gist_plan_on_digits_cnn() -> None:
    _, plan = gist_transform(digits_cnn())
    encodings = {(p.producer, p.encoding) for p in plan.pairs}
    assert encodings == {("1", SSDC), ("3", BINARIZE), ("7", SSDC)}
    assert plan.ssdc_layers == {"1", "7"}


def test_gist_lossless_gradients_bit_identical(batch) -> None:
    x, y = batch
    torch.manual_seed(0)
    model = digits_cnn()
    original = copy.deepcopy(model)
    transformed, plan = gist_transform(model)
    reference = grads_of(original, x, y)
    compressor = ActivationCompressor(transformed, LayerPolicy(), ssdc_layers=plan.ssdc_layers)
    got = grads_of(transformed, x, y, compressor)
    assert all(torch.equal(a, b) for a, b in zip(reference, got, strict=True))
    assert compressor.kinds["sparse"] >= 1
    assert compressor.total().stored < compressor.total().original
    # Binarize: one 4-bit code per 2x2 window of the (48, 32, 8, 8) ReLU output, 1 bit per element.
    assert compressor.counters["gist_3_4"].stored == 48 * 32 * 8 * 8 // 8


def test_binarize_exact_with_odd_sizes_nan_and_overlap_falls_back() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3)
    )
    original = copy.deepcopy(model)
    transformed, plan = gist_transform(model)
    assert [p.encoding for p in plan.pairs] == [BINARIZE]
    x = torch.randn(5, 2, 9, 9)  # 7x7 after the conv: the last row/column falls outside the pool
    x[0, 0, 4, 4] = float("nan")
    y = torch.tensor([0, 1, 2, 0, 1])
    reference = grads_of(original, x, y)
    got = grads_of(transformed, x, y)
    assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(reference, got, strict=True))
    overlapping = nn.Sequential(nn.ReLU(), nn.MaxPool2d(3, stride=2))
    _, plan = gist_transform(overlapping)
    assert [p.encoding for p in plan.pairs] == [DPR]


@pytest.mark.parametrize("kernel", [2, (2, 3), 3])
@pytest.mark.parametrize("upstream_inf", [False, True])
def test_binarize_ties_pick_the_first_maximum_like_max_pool(kernel, upstream_inf) -> None:
    """Small integers make ties inside windows common; positive ties must send the gradient to the
    first maximum in row-major window order, as ``max_pool2d`` does. Gradients are compared bit by
    bit (signed zeros too), with an infinite upstream gradient as well (the masked_fill path)."""
    torch.manual_seed(2)
    x = torch.randint(-2, 3, (3, 2, 7, 8)).float()
    x[0, 0, 0, 0] = float("inf")
    x[1, 1, 3, 3] = float("-inf")
    upstream = torch.randn_like(nn.functional.max_pool2d(x, kernel))
    if upstream_inf:
        upstream.view(-1)[::7] = float("inf")
    results = []
    for module in (
        nn.Sequential(nn.ReLU(), nn.MaxPool2d(kernel)),
        gist_transform(nn.Sequential(nn.ReLU(), nn.MaxPool2d(kernel)))[0],
    ):
        leaf = x.clone().requires_grad_()
        out = module(leaf)
        out.backward(upstream)
        results.append((out.detach(), leaf.grad))
    (ref_out, ref_grad), (out, grad) = results
    assert torch.equal(ref_out, out)
    assert torch.equal(ref_grad.view(torch.int32), grad.view(torch.int32))


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
    threshold = compressor.min_numel
    assert threshold is not None and threshold == measured_min_numel("cpu") and threshold % 32 == 0


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
    return [torch.zeros(0) if p.grad is None else p.grad.clone() for p in model.parameters()]
