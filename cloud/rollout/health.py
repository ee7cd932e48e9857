"""Is a canary healthy? Its gateways' live figures (the heartbeat ``models`` field) against a baseline:
the production version's figures on the other gateways, else the figures the canary gateways
themselves reported for production before the swap.

Pure: figures, thresholds and what the gate measured in, a ``Judgement`` out. Live figures are
compared on like terms: a retrained version may be less confident than production, or disagree with
it, on the same frames and still be better (the gate measured both on held-out rows with true
labels), so what counts is how far the canary strays live from what the gate saw of it against the
same production (``Expected``: the ``live`` figures of its evaluation, when that evaluation's
baseline is the current production). Without that (a version uploaded by hand, or evaluated against
an earlier production) the canary is expected to match production: a confidence shift of 0, and
shadow agreement of at least ``min_shadow_agreement``.

A canary is judged only once its gateways have reported ``min_frames_to_judge`` frames on it; then
it is worse when any of:
  - its confidence shift (canary mean confidence minus the baseline's) is below the expected shift
    by more than ``max_confidence_drop``;
  - its shadow agreement (with the previous version, on ``min_shadow_frames`` or more sampled
    frames) is below the expected agreement by more than ``max_agreement_drop`` (without an
    expectation: below ``min_shadow_agreement``);
  - its error rate is above ``max_error_rate``.
It is ready for production when it has run ``canary_soak_s`` with ``min_frames_to_promote`` frames
and is not worse.

Invariant: "rollback" is returned only on figures of the canary version itself, never on a
gateway that has not swapped yet (its figures are for another version and are not counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["rollback", "promote", "wait"]


@dataclass(frozen=True)
class RolloutConfig:
    interval_s: float = 1.0  # how often the controller looks
    canary_soak_s: float = 300.0
    auto_promote: bool = True  # False: a healthy canary waits for `cloudctl models promote --production`
    # like min_shadow_frames: a canary's mean confidence over a few frames is that of one scene
    min_frames_to_judge: int = 50
    min_frames_to_promote: int = 100
    max_confidence_drop: float = 0.15
    min_shadow_agreement: float = 0.6
    max_agreement_drop: float = 0.2
    # consecutive frames show the same scene, and two versions that disagree on one class agree 0 % or
    # 100 % for as long as it is in view: only many frames make the share comparable to the gate's
    min_shadow_frames: int = 50
    max_error_rate: float = 0.05

    def __post_init__(self) -> None:
        for name in (
            "interval_s",
            "canary_soak_s",
            "max_confidence_drop",
            "max_agreement_drop",
            "max_error_rate",
        ):
            if getattr(self, name) < 0 or (name == "interval_s" and self.interval_s == 0):
                raise ValueError(f"rollout {name}: {getattr(self, name)} must be positive")
        if not 0 <= self.min_shadow_agreement <= 1:
            raise ValueError(f"rollout min_shadow_agreement: {self.min_shadow_agreement} is not in [0, 1]")


@dataclass(frozen=True)
class Figures:
    """Figures of one version summed over gateways (frame-weighted means)."""

    gateways: int
    frames: int
    confidence_mean: float | None
    shadow_agreement: float | None
    shadow_frames: int
    error_rate: float | None
    latency_ms_p50: float | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _weighted(pairs: list[tuple[float | None, int]]) -> float | None:
    known = [(value, weight) for value, weight in pairs if value is not None and weight > 0]
    total = sum(weight for _, weight in known)
    return sum(value * weight for value, weight in known) / total if total else None


def combine(reports: Iterable[dict[str, Any]]) -> Figures:
    """Sum the per-gateway figures of one version (each a heartbeat ``models[name]`` value)."""
    rows = list(reports)
    frames = [int(r.get("frames") or 0) for r in rows]
    shadow = [int(r.get("shadow_frames") or 0) for r in rows]
    latencies = sorted(r["latency_ms_p50"] for r in rows if r.get("latency_ms_p50") is not None)
    return Figures(
        gateways=len(rows),
        frames=sum(frames),
        confidence_mean=_weighted([(r.get("confidence_mean"), f) for r, f in zip(rows, frames, strict=True)]),
        shadow_agreement=_weighted(
            [(r.get("shadow_agreement"), s) for r, s in zip(rows, shadow, strict=True)]
        ),
        shadow_frames=sum(shadow),
        error_rate=_weighted([(r.get("error_rate"), f) for r, f in zip(rows, frames, strict=True)]),
        latency_ms_p50=latencies[len(latencies) // 2] if latencies else None,
    )


@dataclass(frozen=True)
class Expected:
    """What the gate measured of the canary against the current production on the same held-out rows:
    the canary's mean confidence minus production's, and the share of rows where their verdicts agree."""

    confidence_shift: float
    agreement: float
    baseline_version: str

    @classmethod
    def from_evaluation(cls, evaluation: dict[str, Any] | None, production: str | None) -> Expected | None:
        """From a stored evaluation, when it compared the canary with ``production`` itself."""
        live = (evaluation or {}).get("live")
        baseline = (evaluation or {}).get("baseline") or {}
        if not live or production is None or baseline.get("version") != production:
            return None
        return cls(
            confidence_shift=live["confidence_mean"] - live["baseline_confidence_mean"],
            agreement=live["agreement_with_baseline"],
            baseline_version=production,
        )


@dataclass(frozen=True)
class Judgement:
    action: Action
    reason: str
    canary: Figures
    baseline: Figures | None
    expected: Expected | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "reason": self.reason,
            "canary": self.canary.to_json(),
            "baseline": self.baseline.to_json() if self.baseline else None,
            "expected": dict(self.expected.__dict__) if self.expected else None,
        }


def worse_because(
    canary: Figures, baseline: Figures | None, config: RolloutConfig, expected: Expected | None = None
) -> str | None:
    gate = f"the gate's {expected.confidence_shift:+.3f}" if expected else "expected +0.000 (no gate figure)"
    allowed_shift = expected.confidence_shift if expected else 0.0
    if (
        baseline is not None
        and canary.confidence_mean is not None
        and baseline.confidence_mean is not None
        and canary.confidence_mean - baseline.confidence_mean < allowed_shift - config.max_confidence_drop
    ):
        shift = canary.confidence_mean - baseline.confidence_mean
        return (
            f"confidence {canary.confidence_mean:.3f} vs baseline {baseline.confidence_mean:.3f}: "
            f"shift {shift:+.3f} < {gate} - {config.max_confidence_drop}"
        )
    floor = expected.agreement - config.max_agreement_drop if expected else config.min_shadow_agreement
    if (
        canary.shadow_agreement is not None
        and canary.shadow_frames >= config.min_shadow_frames
        and canary.shadow_agreement < floor
    ):
        why = (
            f"the gate's {expected.agreement:.3f} - {config.max_agreement_drop}"
            if expected
            else f"{config.min_shadow_agreement} (no gate figure)"
        )
        return f"shadow agreement {canary.shadow_agreement:.3f} < {why}"
    if canary.error_rate is not None and canary.error_rate > config.max_error_rate:
        return f"error rate {canary.error_rate:.3f} > {config.max_error_rate}"
    return None


def judge(
    canary: Figures,
    baseline: Figures | None,
    ran_s: float,
    config: RolloutConfig,
    expected: Expected | None = None,
) -> Judgement:
    if canary.frames < config.min_frames_to_judge:
        why = f"{canary.frames} canary frames < {config.min_frames_to_judge} to judge"
        return Judgement("wait", why, canary, baseline, expected)
    worse = worse_because(canary, baseline, config, expected)
    if worse is not None:
        return Judgement("rollback", f"canary worse: {worse}", canary, baseline, expected)
    if ran_s < config.canary_soak_s or canary.frames < config.min_frames_to_promote:
        why = (
            f"healthy so far: {ran_s:.0f}/{config.canary_soak_s:.0f}s soak, "
            f"{canary.frames}/{config.min_frames_to_promote} frames"
        )
        return Judgement("wait", why, canary, baseline, expected)
    if not config.auto_promote:
        return Judgement(
            "wait", "healthy after the soak; waiting for the operator (auto promote off)", canary, baseline
        )
    return Judgement(
        "promote", f"healthy for {ran_s:.0f}s over {canary.frames} frames", canary, baseline, expected
    )
