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
from cloud.training.compression.trainer import layer_grad_errors, relative_grad_error
from models.digits import accuracy, digits_cnn, load_digits_split, train_single_process
from models.numerics import BfpFormat

torch.set_num_threads(1)


def test_controller_tightens_loosens_and_logs_bounded() -> None:
    settings = ControllerSettings(
        window=2, start_rung=3, tightest_rung=len(DEFAULT_LADDER) - 1, tighten_rungs=1, max_decisions=3
    )
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
    controller.record_loss(1.0)
    made = controller.decide(1, grad_rel_error=0.01, layer_errors={"a": 0.01})
    assert [d.new for d in made] == [str(DEFAULT_LADDER[3])]  # one good window: straight to m4
    assert controller.policy.format_for("a") == BfpFormat(mantissa_bits=4)
    for step in range(7, 14, 2):  # good steps, tiny error: the bytes-first rule would tighten each time
        controller.record_loss(1.0)
        assert controller.decide(step, grad_rel_error=0.01, layer_errors={"a": 0.01}) == []
    controller.record_loss(1.0)
    made = controller.decide(15, grad_rel_error=0.01, layer_errors={"a": 0.5})  # it still loosens
    assert [(d.layer, d.new) for d in made] == [("a", str(DEFAULT_LADDER[2]))]
    controller.record_loss(1.0)
    made = controller.decide(17, grad_rel_error=0.01, layer_errors={"a": 0.01})  # one rung back down
    assert [(d.layer, d.new) for d in made] == [("a", str(DEFAULT_LADDER[3]))]
    with pytest.raises(ValueError, match="tightest_rung"):
        AdaptiveController(["a"], ControllerSettings(start_rung=4))  # starts past its own floor
    with pytest.raises(ValueError, match="tighten_rungs"):
        AdaptiveController(["a"], ControllerSettings(tighten_rungs=0))


def test_layer_whose_gradient_is_ruined_is_loosened_though_the_model_gradient_looks_fine() -> None:
    # A small layer's gradient error barely moves the whole model's (dominated by the big layer),
    # and its activation error is small: only its own gradient error shows the damage.
    big, small = torch.nn.Linear(64, 64), torch.nn.Linear(4, 2)
    params = [big.weight, small.weight]
    reference = [torch.ones(64, 64), torch.ones(2, 4)]
    big.weight.grad, small.weight.grad = reference[0].clone(), -reference[1]  # small's gradient flipped
    global_error = relative_grad_error(reference, params)
    per_layer = layer_grad_errors(reference, params, ["big", "small"])
    assert global_error < 0.15 and per_layer == {"big": 0.0, "small": pytest.approx(2.0)}
    controller = AdaptiveController(["big", "small"], ControllerSettings(window=2, start_rung=3))
    controller.record_loss(1.0)  # without the per-layer signal the window reads as good
    assert controller.decide(1, global_error, {"big": 0.05, "small": 0.1}) == []  # both at the floor
    controller.record_loss(1.0)
    made = controller.decide(3, global_error, {"big": 0.05, "small": 0.1}, per_layer)
    assert [(d.layer, d.new) for d in made] == [("small", str(DEFAULT_LADDER[2]))]
    assert "layer_grad_err=2.000" in made[0].reason  # the decision says why
    assert controller.last_metrics["layer_grad_errors"] == per_layer


@pytest.mark.slow  # trains the digits model twice, to a target accuracy
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
    result = train_compressed(
        model, split, compressor=compressor, controller=controller, epochs=6, batch_size=64
    )
    assert result.probe_grad_errors and len(result.epoch_losses) == 6
    assert controller.decisions  # the controller acted, and said so
    assert accuracy(model, split.test_x, split.test_y) >= fp32_accuracy - 0.03


def test_loosening_goes_to_the_last_safe_rung_then_fp32_and_propagating_layers_stop_at_m8() -> None:
    settings = ControllerSettings(window=2, tightest_rung=5, tighten_rungs=5)
    controller = AdaptiveController(["conv", "norm"], settings, propagating=["norm"])
    controller.record_loss(1.0)
    made = controller.decide(1, 0.01, {"conv": 0.01, "norm": 0.01})
    assert [(d.layer, d.new) for d in made] == [("conv", str(DEFAULT_LADDER[5]))]  # norm: held at m8
    assert controller.probe_due(2)  # the tightening's confirmation, mid-window
    controller.record_loss(1.0)
    made = controller.decide(3, 0.01, {"conv": 0.5, "norm": 0.01})  # a window later: damage
    assert [(d.layer, d.new) for d in made] == [("conv", str(DEFAULT_LADDER[0]))]  # at once to m8
    for step in (5, 7):  # bad at m8 twice in a row (its own gradient): fp32
        controller.record_loss(1.0)
        made = controller.decide(step, 0.01, {"conv": 0.01, "norm": 0.01}, {"conv": 0.9})
    assert [(d.layer, d.new) for d in made] == [("conv", "fp32")]
    assert controller.policy.format_for("conv") is None and "fp32" in str(controller.status()["formats"])
