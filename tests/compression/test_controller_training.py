"""Adaptive controller decisions, and a compressed training run of the digits CNN."""

from __future__ import annotations

import json

import pytest
import torch

from cloud.training.compression import (
    DEFAULT_LADDER,
    ActivationCompressor,
    AdaptiveController,
    ControllerSettings,
    LayerPolicy,
    gist_transform,
    train_compressed,
)
from models.digits import accuracy, digits_cnn, load_digits_split, train_single_process
from models.numerics import BfpFormat

torch.set_num_threads(1)


def test_controller_tightens_loosens_and_logs_bounded() -> None:
    settings = ControllerSettings(window=2, start_rung=3, tightest_rung=len(DEFAULT_LADDER) - 1,
                                  max_decisions=3)
    controller = AdaptiveController(["a", "b"], settings)
    controller.record_loss(1.0)
    made = controller.decide(1, grad_rel_error=0.01, layer_errors={"a": 0.05, "b": 0.3})
    assert [(d.layer, d.new) for d in made] == [("a", str(DEFAULT_LADDER[4]))]  # b is neither cheap nor bad
    controller.record_loss(0.9)
    made = controller.decide(3, grad_rel_error=0.5, layer_errors={"a": 0.1, "b": 0.3})
    assert [(d.layer, d.new) for d in made] == [("b", str(DEFAULT_LADDER[2]))]  # bad step: loosen the worst
    controller.record_loss(2.0)  # loss rising sharply: loosen the worst, never tighten
    made = controller.decide(5, grad_rel_error=0.01, layer_errors={"a": 0.5, "b": 0.1})
    assert [(d.layer, d.new) for d in made] == [("a", str(DEFAULT_LADDER[3]))]
    controller.record_loss(1.0)
    controller.decide(7, grad_rel_error=0.01, layer_errors={"a": 0.01, "b": 0.01})
    assert len(controller.decisions) == 3 and controller.dropped_decisions == 2
    status = controller.status()
    json.dumps(status)
    assert status["formats"]["a"] == str(DEFAULT_LADDER[4]) and status["dropped_decisions"] == 2
    assert controller.policy.format_for("b") == DEFAULT_LADDER[3]


def test_default_settings_tighten_to_m4_and_no_further() -> None:
    controller = AdaptiveController(["a"], ControllerSettings(window=2))
    assert controller.policy.format_for("a") == DEFAULT_LADDER[0]  # training starts at m8
    for step, rung in ((1, 1), (3, 2), (5, 3)):  # one rung per good window, down to m4
        controller.record_loss(1.0)
        made = controller.decide(step, grad_rel_error=0.01, layer_errors={"a": 0.01})
        assert [d.new for d in made] == [str(DEFAULT_LADDER[rung])]
    assert controller.policy.format_for("a") == BfpFormat(mantissa_bits=4)
    for step in range(7, 14, 2):  # good steps, tiny error: the bytes-first rule would tighten each time
        controller.record_loss(1.0)
        assert controller.decide(step, grad_rel_error=0.01, layer_errors={"a": 0.01}) == []
    controller.record_loss(1.0)
    made = controller.decide(15, grad_rel_error=0.01, layer_errors={"a": 0.5})  # it still loosens
    assert [(d.layer, d.new) for d in made] == [("a", str(DEFAULT_LADDER[2]))]
    with pytest.raises(ValueError, match="tightest_rung"):
        AdaptiveController(["a"], ControllerSettings(start_rung=4))  # starts past its own floor


def test_compressed_training_reaches_fp32_accuracy() -> None:
    split = load_digits_split()
    torch.manual_seed(0)
    reference = digits_cnn()
    train_single_process(reference, split, epochs=6, batch_size=64)
    fp32_accuracy = accuracy(reference, split.test_x, split.test_y)
    torch.manual_seed(0)
    model, plan = gist_transform(digits_cnn())
    layers = [name for name, module in model.named_modules() if name and not list(module.children())]
    controller = AdaptiveController(layers, ControllerSettings(window=10))
    compressor = ActivationCompressor(model, LayerPolicy(), ssdc_layers=plan.ssdc_layers)
    result = train_compressed(model, split, compressor=compressor, controller=controller, epochs=6,
                              batch_size=64)
    assert result.probe_grad_errors and len(result.epoch_losses) == 6
    assert controller.decisions  # the controller acted, and said so
    assert accuracy(model, split.test_x, split.test_y) >= fp32_accuracy - 0.03
