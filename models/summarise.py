"""The camera service's ``summarise`` task, the same code at the edge and in the cloud: an inference
becomes a ``CameraEvent`` with its severity and where each task ran.

Invariant: an event is an alert exactly when its score is at or above ``alert_score`` and its label is
one of ``alert_labels`` (any label when the list is empty); the rule is a pure function of the
inference and the ``CameraParams`` the placement marker carried, so both sides agree.
"""

from __future__ import annotations

from typing import Any

from protocol.control import Side
from protocol.derived import CameraEvent, CameraParams, Severity
from protocol.events import InferenceEvent


def severity(event: InferenceEvent, params: CameraParams) -> Severity:
    label_counts = not params.alert_labels or event.label in params.alert_labels
    return "alert" if label_counts and event.score >= params.alert_score else "info"


def summarise(
    event: InferenceEvent,
    params: CameraParams,
    *,
    infer_at: Side,
    summarise_at: Side,
    **extra: Any,
) -> CameraEvent:
    """The ``summarise`` task; ``extra`` carries ``input``, ``frame`` and ``blob`` when known."""
    return CameraEvent(
        **event.model_dump(),
        severity=severity(event, params),
        ran_at={"infer": infer_at, "summarise": summarise_at},
        **extra,
    )
