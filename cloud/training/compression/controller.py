"""Adaptive activation format (after "Adjusting activation compression for neural network
training", US 12,165,038): each window, read training metrics and move each layer's format one
rung along a ladder of BFP formats, tighter (fewer bytes) or looser (less error).

Metrics read at the end of each window of ``window`` steps:
- loss trend: mean training loss of this window over the previous window's, minus 1;
- gradient error: relative error of the compressed step's gradients against a full-precision
  probe of the same batch (the trainer runs both);
- per-layer activation error: relative error of each layer's encoded saved tensors in the probe;
- per-layer gradient error (optional): relative error of each parameter-owning layer's gradients
  against the probe. A layer's weight gradient reads its saved input, so this catches a format
  that ruins one small layer's gradient while the whole model's error (dominated by the largest
  layers) looks fine.
Rule, per layer with a measured error ``a`` and its own gradient error ``g`` where known (one move
per decision at most):
- loosen if ``a > act_loosen_above``, or ``g > grad_loosen_above``, or if the step is bad (gradient
  error, or any layer's ``g``, > ``grad_loosen_above``, or loss trend > ``loss_rise_tolerance``)
  and this is the layer with the largest ``a``. Loosening goes **at once to the last rung at
  which the layer was measured good** (not one rung per window); with no such rung looser than the
  current one, one rung; a layer already at the loosest rung whose own errors (``a`` or ``g``)
  are bad in two decisions in a row goes to fp32 (its saved tensors kept as they are);
- tighten (``tighten_rungs`` rungs) if the step is good (gradient error < ``grad_tighten_below``
  and the loss is not rising), ``a < act_tighten_below`` and ``g < grad_tighten_below``, but never
  past ``tightest_rung`` nor past a rung that failed its confirmation (below).
- **Propagating layers** (normalizations, attention, smooth activations: ``propagating_layers``)
  stop at ``propagating_tightest_rung`` (m8): their backward reads the saved input for the
  input's own gradient, so their error reaches every earlier layer (on the suite's transformer,
  LayerNorm inputs at m4 cost ~2 pp that m8 did not).
- **Confirmation**: the step right after a tightening also runs the probe (``probe_due``), and its
  decision (``decide`` at that step) only loosens: a format that ruins a layer's gradient (a
  GRU's at m4) is caught on its first step, not a window later. A rung that fails its
  confirmation is not tried again for that layer.
A layer's "good" measurement: neither ``a`` nor ``g`` over its loosen threshold, the step not bad.

Time cost: by default (``tightest_rung=3``) tightening stops at m4, whose codec is as cheap as
any on the ladder (4-bit codes pack whole bytes, uniform levels need no table). The rungs past it
save few bytes for their codec time: m4 log the same bytes at ~2x the CPU, m3+1% outliers 8% fewer
bytes at ~2x, m3 24% fewer at ~1.5x (3-bit codes are not byte aligned). A caller who values bytes
over step time sets ``tightest_rung=len(ladder) - 1``. A layer starts at the loosest rung
(``start_rung=0``, m8) for the first window and, if it is good, goes straight to m4
(``tighten_rungs=3``): the first window is the fragile part of training, and m6, the slowest
codec, is skipped. Over 24 seeds this ended the scene CNN at its majority class (<= 0.55) as
often as fp32 (2 and 2, the same seeds), near 1.0 in 14 against fp32's 10; starting at m4 + 1%
outliers did so in 2 of 12 other seeds, whose probes read whole-model gradient errors <= 0.033.
On digits, within 0.15 pp of fp32 over 10 seeds either way (docs/compression.md).

Invariant: every change of a layer's format is one ``Decision`` in ``decisions`` (bounded; older
ones are dropped and counted in ``dropped_decisions``) and one log record; ``policy`` always maps
every controlled layer to a ladder format no tighter than ``tightest_rung``, or to fp32 (``None``,
rung ``FP32``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass

from torch import nn

from cloud.training.compression.layer_formats import LayerPolicy
from models.numerics import BfpFormat

log = logging.getLogger(__name__)

# Loosest first. Each rung changes one of: mantissa bits, outliers, non-uniform levels.
DEFAULT_LADDER: tuple[BfpFormat, ...] = (
    BfpFormat(mantissa_bits=8),
    BfpFormat(mantissa_bits=6),
    BfpFormat(mantissa_bits=4, outlier_fraction=0.01),
    BfpFormat(mantissa_bits=4),
    BfpFormat(mantissa_bits=4, levels="log"),
    BfpFormat(mantissa_bits=3, outlier_fraction=0.01),
    BfpFormat(mantissa_bits=3),
)


FP32 = -1  # the rung below the ladder: the layer's saved tensors kept as they are


@dataclass(frozen=True)
class ControllerSettings:
    window: int = 20
    start_rung: int = 0  # m8: training starts at the loosest rung and tightens while the metrics allow
    tightest_rung: int = 3  # m4: the controller never tightens past it (see the module doc)
    tighten_rungs: int = 3  # per good window (loosening is one rung): m8 for one window, then m4
    act_tighten_below: float = 0.2
    act_loosen_above: float = 0.35
    grad_tighten_below: float = 0.15
    grad_loosen_above: float = 0.3
    loss_rise_tolerance: float = 0.1
    max_decisions: int = 256
    propagating_tightest_rung: int = 0  # m8: the floor of layers whose error reaches every earlier layer


@dataclass(frozen=True)
class Decision:
    step: int
    layer: str
    old: str
    new: str
    reason: str


class AdaptiveController:
    def __init__(
        self,
        layers: Sequence[str],
        settings: ControllerSettings = ControllerSettings(),
        ladder: Sequence[BfpFormat] = DEFAULT_LADDER,
        propagating: Collection[str] = (),
    ) -> None:
        """``propagating``: layers whose backward reads their saved input to compute the gradient
        of that input (``propagating_layers``), kept at ``propagating_tightest_rung`` or looser."""
        if not 0 <= settings.start_rung <= settings.tightest_rung < len(ladder):
            raise ValueError(
                f"need 0 <= start_rung ({settings.start_rung}) <= tightest_rung "
                f"({settings.tightest_rung}) < ladder length ({len(ladder)})"
            )
        if settings.tighten_rungs < 1:
            raise ValueError(f"tighten_rungs must be at least 1, got {settings.tighten_rungs}")
        self.settings = settings
        self.ladder = tuple(ladder)
        self.rungs = dict.fromkeys(layers, settings.start_rung)
        self._safe: dict[str, int] = {}  # the tightest rung each layer was last measured good at
        self._ceiling = {  # lowered by failed confirmations
            layer: min(settings.tightest_rung, settings.propagating_tightest_rung)
            if layer in propagating
            else settings.tightest_rung
            for layer in layers
        }
        self._confirm_at: int | None = None  # the step after a tightening: its probe confirms it
        self._strikes = dict.fromkeys(layers, 0)  # consecutive bad decisions at the loosest rung
        self.decisions: deque[Decision] = deque(maxlen=settings.max_decisions)
        self.dropped_decisions = 0
        self.last_metrics: dict[str, object] = {}
        self._window_losses: list[float] = []
        self._previous_window_loss: float | None = None

    @property
    def policy(self) -> LayerPolicy:
        return LayerPolicy.from_mapping({layer: self._format(rung) for layer, rung in self.rungs.items()})

    def _format(self, rung: int) -> BfpFormat | None:
        return None if rung == FP32 else self.ladder[rung]

    def probe_due(self, step: int) -> bool:
        """True on the last step of each window, and on the step after a tightening (its
        confirmation): the trainer runs its full-precision probe then."""
        return step % self.settings.window == self.settings.window - 1 or step == self._confirm_at

    def record_loss(self, loss: float) -> None:
        self._window_losses.append(loss)

    def decide(
        self,
        step: int,
        grad_rel_error: float | None,
        layer_errors: Mapping[str, float],
        layer_grad_errors: Mapping[str, float] | None = None,
    ) -> list[Decision]:
        """``grad_rel_error`` None: no full-precision probe was run (a pipeline stage cannot run
        one alone); the step is then judged by the loss trend only. ``layer_grad_errors``: each
        parameter-owning layer's own gradient error against the probe (None: not measured)."""
        s = self.settings
        confirming = step == self._confirm_at and step % s.window != s.window - 1
        self._confirm_at = None
        if confirming:  # one step into the window: no loss trend yet
            trend = 0.0
        else:
            window_loss = sum(self._window_losses) / max(1, len(self._window_losses))
            previous = self._previous_window_loss
            trend = 0.0 if previous in (None, 0.0) else window_loss / previous - 1
            self._previous_window_loss, self._window_losses = window_loss, []
        own_grad = dict(layer_grad_errors or {})
        worst_own = max(own_grad.values(), default=0.0)
        grad_bad = (grad_rel_error is not None and grad_rel_error > s.grad_loosen_above) or (
            worst_own > s.grad_loosen_above
        )
        grad_good = grad_rel_error is None or grad_rel_error < s.grad_tighten_below
        bad = grad_bad or trend > s.loss_rise_tolerance
        good = grad_good and not bad and not confirming
        measured = {layer: error for layer, error in layer_errors.items() if layer in self.rungs}
        worst = max(measured, key=measured.__getitem__) if measured else None
        self.last_metrics = {
            "step": step,
            "loss_trend": trend,
            "grad_rel_error": grad_rel_error,
            "layer_errors": dict(measured),
            "layer_grad_errors": own_grad,
        }
        made = []
        for layer, error in sorted(measured.items()):
            rung = self.rungs[layer]
            own = own_grad.get(layer)
            metrics = (
                f"act_err={error:.3f} grad_err={_text(grad_rel_error)} "
                f"layer_grad_err={_text(own)} loss_trend={trend:+.3f}"
            )
            own_bad = error > s.act_loosen_above or (own is not None and own > s.grad_loosen_above)
            own_good = own is None or own < s.grad_tighten_below
            if own_bad or (bad and layer == worst):
                self._strikes[layer] = self._strikes[layer] + 1 if rung == 0 and own_bad else 0
                target = self._loosened(layer, rung, self._strikes[layer] >= 2)
                if confirming:
                    self._ceiling[layer] = min(self._ceiling[layer], rung - 1)
                if target != rung:
                    made.append(self._move(step, layer, target, f"loosen: {metrics}"))
                continue
            self._strikes[layer] = 0
            if not bad:
                self._safe[layer] = rung
            ceiling = self._ceiling[layer]
            if good and own_good and error < s.act_tighten_below and FP32 < rung < ceiling:
                made.append(
                    self._move(step, layer, min(rung + s.tighten_rungs, ceiling), f"tighten: {metrics}")
                )
                self._confirm_at = step + 1
        return made

    def _loosened(self, layer: str, rung: int, to_fp32: bool) -> int:
        """The rung a damaged layer moves to: the last one it was good at, if looser; else one
        rung looser; fp32 from the loosest rung when ``to_fp32`` (its own errors bad twice in a row
        there: one bad gradient error at m8 is mostly noise on a near-zero gradient)."""
        safe = self._safe.get(layer)
        if safe is not None and safe < rung:
            return safe
        if rung > 0:
            return rung - 1
        return FP32 if to_fp32 else rung

    def _move(self, step: int, layer: str, rung: int, reason: str) -> Decision:
        decision = Decision(
            step, layer, _name(self._format(self.rungs[layer])), _name(self._format(rung)), reason
        )
        self.rungs[layer] = rung
        if len(self.decisions) == self.decisions.maxlen:
            self.dropped_decisions += 1
        self.decisions.append(decision)
        log.info("step %d layer %s: %s -> %s (%s)", step, layer, decision.old, decision.new, reason)
        return decision

    def status(self) -> dict[str, object]:
        """JSON-ready view for the job status."""
        return {
            "formats": {layer: _name(self._format(rung)) for layer, rung in self.rungs.items()},
            "last_metrics": self.last_metrics,
            "decisions": [asdict(d) for d in self.decisions],
            "dropped_decisions": self.dropped_decisions,
        }


# Layers whose backward reads the saved input to compute the input's own gradient: an error there
# reaches the gradients of every earlier layer, not only the layer's own weight gradient (a conv's
# or linear's input gradient reads the weight; ReLU's, only the sign; max-pool's, the indices).
_PROPAGATING = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.MultiheadAttention,
    nn.Softmax,
    nn.LogSoftmax,
    nn.Tanh,
    nn.Sigmoid,
    nn.GELU,
    nn.SiLU,
)


def propagating_layers(model: nn.Module, layers: Collection[str]) -> list[str]:
    """Those of ``layers`` (names in ``model``) that are normalizations, attention or smooth
    activations: the controller keeps them at ``propagating_tightest_rung`` or looser."""
    return [name for name in layers if isinstance(model.get_submodule(name), _PROPAGATING)]


def _name(fmt: BfpFormat | None) -> str:
    return "fp32" if fmt is None else str(fmt)


def _text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
