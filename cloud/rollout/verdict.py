"""The quality gate's arithmetic: a candidate's held-out figure against the version it would replace.

Pure: figures in, verdict out. ``accuracy`` (balanced: the mean recall of the classes in the
held-out rows, so answering the commonest class always scores chance) is better higher and ties
within ``tolerance`` (absolute: 0.02 = two points); ``loss`` is better lower and ties within
``tolerance`` relative to the baseline. With no version to replace, an accuracy must beat chance
(1 / classes) by ``floor_over_chance`` and a loss need only be finite.

Invariant: a value that is not finite is never promotable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Metric = Literal["accuracy", "loss"]


@dataclass(frozen=True)
class GateConfig:
    tolerance: float = 0.02
    floor_over_chance: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"gate tolerance: {self.tolerance} is not in [0, 1)")
        if not 0 <= self.floor_over_chance < 1:
            raise ValueError(f"gate floor_over_chance: {self.floor_over_chance} is not in [0, 1)")


def verdict(
    metric: Metric,
    value: float,
    baseline: float | None,
    classes: int,
    config: GateConfig,
    baseline_name: str = "baseline",
) -> tuple[bool, str]:
    """(promotable, why) for ``value`` against ``baseline`` (None: nothing to replace)."""
    if not math.isfinite(value):
        return False, f"{metric} is {value}"
    if metric == "accuracy":
        if baseline is None:
            floor = 1.0 / max(classes, 1) + config.floor_over_chance
            return value >= floor, f"accuracy {value:.4f} vs chance+floor {floor:.4f} (no version to replace)"
        return (
            value >= baseline - config.tolerance,
            f"accuracy {value:.4f} vs {baseline_name} {baseline:.4f} - tolerance {config.tolerance}",
        )
    if baseline is None:
        return True, f"loss {value:.6g} (no version to replace)"
    limit = baseline * (1 + config.tolerance)
    return value <= limit, f"loss {value:.6g} vs {baseline_name} {baseline:.6g} x (1 + {config.tolerance})"


def evaluation_document(
    metric: Metric,
    value: float,
    dataset: str,
    rows: int,
    baseline: tuple[str, float] | None,
    classes: int,
    config: GateConfig,
) -> dict[str, Any]:
    """The ``evaluation`` stored with a version (docs/models.md)."""
    if rows == 0:
        promotable, why = False, f"no held-out rows in {dataset}: nothing to judge the version on"
    else:
        value_of, name = (baseline[1], f"baseline {baseline[0]}") if baseline else (None, "baseline")
        promotable, why = verdict(metric, value, value_of, classes, config, name)
    return {
        "metric": metric,
        "value": value if math.isfinite(value) else None,
        "dataset": dataset,
        "rows": rows,
        "baseline": {"version": baseline[0], "value": baseline[1]} if baseline else None,
        "tolerance": config.tolerance,
        "promotable": promotable,
        "reason": why,
    }
