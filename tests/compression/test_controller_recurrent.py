"""The adaptive controller on a recurrent model: a format that ruins the GRU's gradient is caught by
the probe on the first step after the tightening and undone at once, within one window."""

from __future__ import annotations

import torch
from torch import nn

from cloud.training.compression import (
    ActivationCompressor,
    AdaptiveController,
    ControllerSettings,
    fit_compressed,
    leaf_names,
    shuffled_batches,
)
from models.numerics import BfpFormat

torch.set_num_threads(1)
SAFE = BfpFormat(mantissa_bits=8)
RUINOUS = BfpFormat(mantissa_bits=2, block_size=1024)  # one exponent per 1024 values, 2-bit codes


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(1, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0][:, -1])


def test_controller_loosens_within_one_window_when_a_recurrent_gradient_is_ruined() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 24, 1)
    y = (x[:, -8:].sum(dim=(1, 2)) > 0).long()  # the label lives in the last steps: backprop through time
    model = _Recurrent()
    window = 5
    settings = ControllerSettings(window=window, start_rung=0, tightest_rung=1, tighten_rungs=1)
    controller = AdaptiveController(leaf_names(model), settings, ladder=(SAFE, RUINOUS))
    compressor = ActivationCompressor(model, controller.policy, min_numel=0)
    result = fit_compressed(
        model,
        shuffled_batches(x, y, 32, seed=0),
        nn.functional.cross_entropy,
        torch.optim.Adam(model.parameters(), lr=1e-2),
        compressor=compressor,
        controller=controller,
        epochs=3,
    )
    gru = [d for d in controller.decisions if d.layer == "gru"]
    tightened, loosened = gru[0], gru[1]
    assert (tightened.step, tightened.new) == (window - 1, str(RUINOUS))  # first window good: tighten
    # The very next step ran the probe (a confirmation) and saw the damage: back to the last safe
    # format at once, not one window later.
    assert window in result.probe_steps
    assert (loosened.step, loosened.old, loosened.new) == (window, str(RUINOUS), str(SAFE))
    grad_error = float(loosened.reason.split("layer_grad_err=")[1].split()[0])
    assert grad_error > settings.grad_loosen_above
    # The rung failed its confirmation: the GRU is not put back on it for the rest of training.
    assert len(gru) == 2 and controller.policy.format_for("gru") == SAFE
