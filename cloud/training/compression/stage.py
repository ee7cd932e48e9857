"""Activation compression of one pipeline stage in a ``torchrun`` job (the ``[compression]`` job
section): the stage module (Gist-transformed when asked), its ``ActivationCompressor``, and, in
adaptive mode, its ``AdaptiveController``.

In a pipeline no stage can run a full-precision probe of the whole model alone, so the stage's
controller reads the loss trend (every rank learns the loss at each progress line) and the
activation error of its own layers, measured on the last step of each window; it decides once per
window, at a progress line, on every rank at the same step.

Invariant: with ``activations = "none"`` and ``gist = false`` the stage module and its forward are
untouched; otherwise
``report()`` returns the bytes the stage's hooks saw since the previous report (then resets them),
and ``decide`` returns every decision the controller made, as JSON-ready dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict

from torch import nn

from cloud.training.compression.controller import AdaptiveController, ControllerSettings, propagating_layers
from cloud.training.compression.gist import GistPlan, gist_transform
from cloud.training.compression.hooks import ActivationCompressor, leaf_names
from cloud.training.compression.layer_formats import LayerPolicy
from cloud.training.compression.step_bypass import OUTSIDE_LAYERS
from cloud.training.options import CompressionOptions
from models.numerics import BfpFormat


class StageCompression:
    def __init__(self, module: nn.Module, options: CompressionOptions) -> None:
        self.module = module
        self.compressor: ActivationCompressor | None = None
        self.controller: AdaptiveController | None = None  # adaptive mode: steers the compressor
        self.gist_plan: GistPlan | None = None
        if options.activations == "none" and not options.gist:
            return
        ssdc: frozenset[str] = frozenset()
        if options.gist:
            self.module, self.gist_plan = gist_transform(module)
            ssdc = self.gist_plan.ssdc_layers
        if options.activations == "adaptive":
            settings = ControllerSettings(window=options.window, **options.controller.model_dump())
            layers = leaf_names(self.module)
            propagating = propagating_layers(self.module, layers)
            self.controller = AdaptiveController(layers, settings, propagating=propagating)
            policy = self.controller.policy
        elif options.activations == "bfp":
            policy = LayerPolicy.uniform(BfpFormat.parse(options.format))
        else:  # Gist alone: sparse ReLU->conv where smaller, every other saved tensor as it is
            policy = LayerPolicy.uniform(None)
        self.compressor = ActivationCompressor(
            self.module, policy, ssdc_layers=ssdc, min_numel=options.min_numel
        )

    @property
    def context(self) -> Callable[[], AbstractContextManager] | None:
        return None if self.compressor is None else self.compressor.active

    def _adaptive(self) -> tuple[AdaptiveController, ActivationCompressor] | None:
        """In adaptive mode, the controller and the compressor it steers."""
        if self.controller is None or self.compressor is None:
            return None
        return self.controller, self.compressor

    def before_step(self, step: int) -> None:
        """``step``: 0-based index of the step about to run."""
        adaptive = self._adaptive()
        if adaptive is not None:
            controller, compressor = adaptive
            compressor.measure_errors = controller.probe_due(step)
            if compressor.measure_errors:
                compressor.layer_errors.clear()

    def report(self) -> dict:
        if self.compressor is None:
            return {
                "saved_bytes_fp32": 0,
                "saved_bytes_stored": 0,
                "formats": {},
                "encode_s": 0.0,
                "decode_s": 0.0,
            }
        total, c = self.compressor.total(), self.compressor
        formats = {
            layer: str(c.policy.format_for(layer) or "fp32")
            for layer in c.counters
            if layer != OUTSIDE_LAYERS
        }
        report = {
            "saved_bytes_fp32": total.original,
            "saved_bytes_stored": total.stored,
            "formats": formats,
            "encode_s": round(c.encode_s, 4),
            "decode_s": round(c.decode_s, 4),
        }
        errors = dict(c.layer_errors)
        c.reset_counters()
        c.layer_errors.update(errors)  # read by the decision at the end of the window
        return report

    def record_loss(self, loss: float) -> None:
        if self.controller is not None:
            self.controller.record_loss(loss)

    def decide(self, step: int) -> list[dict]:
        """At the end of a window (``step`` steps done): move formats; returns the decisions."""
        adaptive = self._adaptive()
        if adaptive is None or step % adaptive[0].settings.window:
            return []
        controller, compressor = adaptive
        made = controller.decide(step, None, compressor.layer_errors)
        compressor.policy = controller.policy
        compressor.measure_errors = False
        return [asdict(d) for d in made]

    def status(self) -> dict | None:
        return None if self.controller is None else self.controller.status()
