"""Adaptive activation format (after "Adjusting activation compression for neural network
training", US 12,165,038): each window, read training metrics and move each layer's format one
rung along a ladder of BFP formats, tighter (fewer bytes) or looser (less error).

Metrics read at the end of each window of ``window`` steps:
- loss trend: mean training loss of this window over the previous window's, minus 1;
- gradient error: relative error of the compressed step's gradients against a full-precision
  probe of the same batch (the trainer runs both);
- per-layer activation error: relative error of each layer's encoded saved tensors in the probe.
Rule, per layer with a measured error ``a`` (one rung per window at most):
- loosen if ``a > act_loosen_above``, or if the step is bad (gradient error > ``grad_loosen_above``
  or loss trend > ``loss_rise_tolerance``) and this is the layer with the largest ``a``;
- tighten if the step is good (gradient error < ``grad_tighten_below`` and the loss is not rising)
  and ``a < act_tighten_below``, but never past ``tightest_rung``.

Time cost: by default (``tightest_rung=3``) tightening stops at m4, whose codec is as cheap as
any on the ladder (4-bit codes pack whole bytes, uniform levels need no table). The rungs past it
save few bytes for their codec time: m4 log the same bytes at ~2x the CPU, m3+1% outliers 8% fewer
bytes at ~2x, m3 24% fewer at ~1.5x (3-bit codes are not byte aligned). A caller who values bytes
over step time sets ``tightest_rung=len(ladder) - 1``. A layer starts at the loosest rung
(``start_rung=0``, m8) and tightens one rung per good window: early training is the fragile part
(the scene CNN started at m4 + 1% outliers collapsed to its majority class, 0.46 against fp32's
0.72, and the loss trend never rose to call for loosening; started at m8 it reached m4 and 1.00).

Invariant: every change of a layer's format is one ``Decision`` in ``decisions`` (bounded; older
ones are dropped and counted in ``dropped_decisions``) and one log record; ``policy`` always maps
every controlled layer to a ladder format no tighter than ``tightest_rung``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from cloud.training.compression.policy import LayerPolicy
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


@dataclass(frozen=True)
class ControllerSettings:
    window: int = 20
    start_rung: int = 0  # m8: training starts at the loosest rung and tightens while the metrics allow
    tightest_rung: int = 3  # m4: the controller never tightens past it (see the module doc)
    act_tighten_below: float = 0.2
    act_loosen_above: float = 0.35
    grad_tighten_below: float = 0.15
    grad_loosen_above: float = 0.3
    loss_rise_tolerance: float = 0.1
    max_decisions: int = 256


@dataclass(frozen=True)
class Decision:
    step: int
    layer: str
    old: str
    new: str
    reason: str


class AdaptiveController:
    def __init__(self, layers: Sequence[str], settings: ControllerSettings = ControllerSettings(),
                 ladder: Sequence[BfpFormat] = DEFAULT_LADDER) -> None:
        if not 0 <= settings.start_rung <= settings.tightest_rung < len(ladder):
            raise ValueError(f"need 0 <= start_rung ({settings.start_rung}) <= tightest_rung "
                             f"({settings.tightest_rung}) < ladder length ({len(ladder)})")
        self.settings = settings
        self.ladder = tuple(ladder)
        self.rungs = dict.fromkeys(layers, settings.start_rung)
        self.decisions: deque[Decision] = deque(maxlen=settings.max_decisions)
        self.dropped_decisions = 0
        self.last_metrics: dict[str, object] = {}
        self._window_losses: list[float] = []
        self._previous_window_loss: float | None = None

    @property
    def policy(self) -> LayerPolicy:
        return LayerPolicy.from_mapping({layer: self.ladder[rung] for layer, rung in self.rungs.items()})

    def probe_due(self, step: int) -> bool:
        """True on the last step of each window: the trainer runs its full-precision probe then."""
        return step % self.settings.window == self.settings.window - 1

    def record_loss(self, loss: float) -> None:
        self._window_losses.append(loss)

    def decide(self, step: int, grad_rel_error: float | None,
               layer_errors: Mapping[str, float]) -> list[Decision]:
        """``grad_rel_error`` None: no full-precision probe was run (a pipeline stage cannot run
        one alone); the step is then judged by the loss trend only."""
        s = self.settings
        window_loss = sum(self._window_losses) / max(1, len(self._window_losses))
        previous = self._previous_window_loss
        trend = 0.0 if previous in (None, 0.0) else window_loss / previous - 1
        self._previous_window_loss, self._window_losses = window_loss, []
        grad_bad = grad_rel_error is not None and grad_rel_error > s.grad_loosen_above
        grad_good = grad_rel_error is None or grad_rel_error < s.grad_tighten_below
        bad = grad_bad or trend > s.loss_rise_tolerance
        good = grad_good and trend <= s.loss_rise_tolerance
        measured = {layer: error for layer, error in layer_errors.items() if layer in self.rungs}
        worst = max(measured, key=measured.__getitem__) if measured else None
        self.last_metrics = {"step": step, "loss_trend": trend, "grad_rel_error": grad_rel_error,
                             "layer_errors": dict(measured)}
        made = []
        for layer, error in sorted(measured.items()):
            rung = self.rungs[layer]
            grad_text = "n/a" if grad_rel_error is None else f"{grad_rel_error:.3f}"
            metrics = f"act_err={error:.3f} grad_err={grad_text} loss_trend={trend:+.3f}"
            if (error > s.act_loosen_above or (bad and layer == worst)) and rung > 0:
                made.append(self._move(step, layer, rung - 1, f"loosen: {metrics}"))
            elif good and error < s.act_tighten_below and rung < s.tightest_rung:
                made.append(self._move(step, layer, rung + 1, f"tighten: {metrics}"))
        return made

    def _move(self, step: int, layer: str, rung: int, reason: str) -> Decision:
        decision = Decision(step, layer, str(self.ladder[self.rungs[layer]]), str(self.ladder[rung]), reason)
        self.rungs[layer] = rung
        if len(self.decisions) == self.decisions.maxlen:
            self.dropped_decisions += 1
        self.decisions.append(decision)
        log.info("step %d layer %s: %s -> %s (%s)", step, layer, decision.old, decision.new, reason)
        return decision

    def status(self) -> dict[str, object]:
        """JSON-ready view for the job status."""
        return {"formats": {layer: str(self.ladder[rung]) for layer, rung in self.rungs.items()},
                "last_metrics": self.last_metrics,
                "decisions": [asdict(d) for d in self.decisions],
                "dropped_decisions": self.dropped_decisions}
