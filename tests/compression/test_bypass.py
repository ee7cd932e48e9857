"""Layers with nothing to encode are bypassed after one learning step (bypass.py): no hooks, no
bookkeeping, the same gradients, and the counters still count every layer's bytes."""

from __future__ import annotations

import gc

import torch
from torch import nn

from cloud.training.compression import (
    ActivationCompressor,
    AdaptiveController,
    ControllerSettings,
    LayerPolicy,
    fit_compressed,
    leaf_names,
)
from models.numerics import BfpFormat
from tests.compression.test_gist_families import _grads as _step  # same seed every step

torch.set_num_threads(1)
M8 = BfpFormat(mantissa_bits=8)


def _counted(compressor: ActivationCompressor) -> dict[str, tuple[int, int, int]]:
    return {layer: (e.original, e.stored, e.tensors) for layer, e in compressor.counters.items()}


def _counting_packs(compressor: ActivationCompressor) -> list[int]:
    calls = [0]
    pack = compressor._pack

    def counted(tensor: torch.Tensor):
        calls[0] += 1
        return pack(tensor)

    compressor._pack = counted  # type: ignore[method-assign]
    return calls


def test_a_model_with_nothing_to_encode_runs_without_hooks_after_one_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    reference = _step(model, x, None)
    # Every group and the dropout mask (256 elements) are under the threshold: nothing to encode.
    compressor = ActivationCompressor(model, LayerPolicy.uniform(M8), min_numel=4096)
    packs = _counting_packs(compressor)
    first = _step(model, x, compressor)
    once = _counted(compressor)
    assert packs[0] > 0 and set(once) >= {"0", "1", "2"}
    packs[0] = 0
    for _ in range(2):
        grads = _step(model, x, compressor)
        assert all(torch.equal(a, b) for a, b in zip(reference, grads, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(reference, first, strict=True))
    assert packs[0] == 0  # the saved-tensor hooks were not even entered
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model)
    # Bypassed steps count what the learning step counted, layer by layer.
    assert _counted(compressor) == {layer: (3 * o, 3 * s, 3 * t) for layer, (o, s, t) in once.items()}
    assert compressor.kinds["raw"] == 3 * sum(t for _, _, t in once.values())
    assert compressor.kinds["bits"] == 0  # a 256-element mask is not worth its bits under 4096


def _five_layers() -> nn.Sequential:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def test_layers_that_encode_keep_their_hooks_and_the_rest_are_counted() -> None:
    model = _five_layers()
    x = torch.randn(16, 32)
    # "1" (a ReLU) encodes its 1024-element output, which "2" saves too (shared: both bookkept);
    # "3"'s output (shared with "4") stays fp32, "0" saves the model's input: both bypassed.
    compressor = ActivationCompressor(model, LayerPolicy.from_mapping({"1": M8}), min_numel=512)
    full = ActivationCompressor(_five_layers(), LayerPolicy.from_mapping({"1": M8}), min_numel=512)
    _step(model, x, compressor)
    _step(full.model, x, full)
    once = _counted(compressor)
    encoding = _step(model, x, compressor)
    assert not model[0]._forward_pre_hooks and not model[3]._forward_pre_hooks
    assert model[1]._forward_pre_hooks and model[2]._forward_pre_hooks
    assert compressor.kinds["bfp"] == 2  # one group per step, as on full steps
    assert _counted(compressor) == {layer: (2 * o, 2 * s, 2 * t) for layer, (o, s, t) in once.items()}
    assert all(torch.equal(a, b) for a, b in zip(_step(full.model, x, full), encoding, strict=True))
    # The hooks' own objects are released with the graph; autograd held the bypassed tensors.
    gc.collect()
    assert compressor.live_bytes == 0

    # A new policy is learned again: "3" now encodes (with "4", which saves the same tensor).
    compressor.policy = LayerPolicy.from_mapping({"1": M8, "3": M8})
    compressor.reset_counters()
    _step(model, x, compressor)
    _step(model, x, compressor)
    assert model[3]._forward_pre_hooks and compressor.kinds["bfp"] == 4
    assert compressor.counters["3"].stored < compressor.counters["3"].original


def test_new_input_shapes_are_learned_within_the_step() -> None:
    model = _five_layers()
    compressor = ActivationCompressor(model, LayerPolicy.from_mapping({"1": M8}), min_numel=512)
    for _ in range(2):
        _step(model, torch.randn(16, 32), compressor)
    compressor.reset_counters()
    for _ in range(2):  # the same shapes: the second step follows the plan, counts as the first
        _step(model, torch.randn(16, 32), compressor)
    at_16 = _counted(compressor)
    # The step after reset_counters kept full bookkeeping: its peak covers every saved tensor.
    assert 2 * compressor.peak_live_bytes == compressor.total().stored
    compressor.reset_counters()
    _step(model, torch.randn(4, 32), compressor)  # smaller: "1"'s group falls under min_numel
    fresh = ActivationCompressor(_five_layers(), LayerPolicy.from_mapping({"1": M8}), min_numel=512)
    _step(fresh.model, torch.randn(4, 32), fresh)
    assert _counted(compressor) == _counted(fresh)
    assert {layer: (o // 2, s // 2, t // 2) for layer, (o, s, t) in at_16.items()} != _counted(fresh)


def test_each_input_shape_keeps_its_own_plan() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    compressor = ActivationCompressor(model, LayerPolicy.uniform(M8), min_numel=4096)
    packs = _counting_packs(compressor)
    big, small = torch.randn(8, 16), torch.randn(3, 16)
    _step(model, big, compressor)
    at_8 = _counted(compressor)
    compressor.reset_counters()
    _step(model, small, compressor)  # learned here: a new shape within the step
    at_3 = _counted(compressor)
    packs[0] = 0
    compressor.reset_counters()
    _step(model, big, compressor)  # a learning step (after the reset), then both shapes bypassed
    _step(model, small, compressor)
    packs[0] = 0
    for x in (big, small, big, small):  # an epoch's last, smaller batch and back: no relearning
        _step(model, x, compressor)
    assert packs[0] == 0
    expected = {
        layer: tuple(3 * a + 3 * b for a, b in zip(at_8[layer], at_3[layer], strict=True)) for layer in at_8
    }
    assert _counted(compressor) == expected


def _fit_with_controller(model: nn.Module, min_numel: int) -> list[int]:
    """The steps whose full-precision probe ran, over 12 steps with a window of 4."""
    torch.manual_seed(3)
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(12)]
    controller = AdaptiveController(leaf_names(model), ControllerSettings(window=4))
    compressor = ActivationCompressor(model, controller.policy, min_numel=min_numel)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    result = fit_compressed(
        model, batches, nn.functional.cross_entropy, optimizer, compressor=compressor, controller=controller
    )
    return result.probe_steps


def test_the_probe_is_skipped_only_when_the_step_is_exactly_fp32() -> None:
    def model() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    # Under the threshold nothing is encoded: the compressed step is fp32's, no probe runs.
    assert _fit_with_controller(model(), min_numel=4096) == []
    # The same model with every group encoded probes at the end of each window.
    assert {3, 7, 11} <= set(_fit_with_controller(model(), min_numel=1))
