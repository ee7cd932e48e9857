"""The rollout's pure parts: the canary judgement on combined figures, and stage transitions."""

from __future__ import annotations

import pytest

from cloud.rollout.gate import live_expectation
from cloud.rollout.health import Expected, RolloutConfig, combine, judge
from cloud.rollout.lifecycle import MAX_EVENTS, Lifecycle
from cloud.rollout.transitions import (
    Refused,
    assignment,
    canary_share_gateways,
    promote_canary,
    promote_production,
    rollback,
)

CONFIG = RolloutConfig(canary_soak_s=60, min_frames_to_judge=20, min_frames_to_promote=50)


def report(frames: int, confidence: float, agreement: float | None = None, errors: float = 0.0) -> dict:
    return {
        "version": "2",
        "frames": frames,
        "confidence_mean": confidence,
        "shadow_agreement": agreement,
        "shadow_frames": frames,
        "error_rate": errors,
        "latency_ms_p50": 3.0,
    }


def test_figures_combine_frame_weighted():
    figures = combine([report(100, 0.9), report(300, 0.5)])
    assert figures.frames == 400 and figures.gateways == 2
    assert figures.confidence_mean == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("canary", "ran_s", "action", "why"),
    [
        (report(10, 0.1), 600, "wait", "to judge"),  # too few frames: never rolled back on noise
        (report(40, 0.6), 5, "rollback", "confidence"),
        (report(60, 0.9, agreement=0.3), 5, "rollback", "shadow agreement"),
        (report(40, 0.9, errors=0.2), 5, "rollback", "error rate"),
        (report(40, 0.9), 600, "wait", "frames"),  # soaked, but too few frames to promote
        (report(80, 0.9, agreement=0.95), 30, "wait", "soak"),
        (report(80, 0.9, agreement=0.95), 61, "promote", "healthy"),
    ],
)
def test_judgement(canary, ran_s, action, why):
    baseline = combine([report(500, 0.92)])
    judgement = judge(combine([canary]), baseline, ran_s, CONFIG)
    assert judgement.action == action and why in judgement.reason


def test_auto_promote_off_waits_for_the_operator():
    config = RolloutConfig(canary_soak_s=0, min_frames_to_promote=1, auto_promote=False)
    judgement = judge(combine([report(80, 0.9)]), None, 10, config)
    assert judgement.action == "wait" and "operator" in judgement.reason


def gated(candidate: float, production: float, agreement: float, baseline: str = "1") -> dict:
    """A stored evaluation whose ``live`` figures the gate measured against ``baseline``."""
    return {
        "promotable": True,
        "baseline": {"version": baseline, "value": 0.6},
        "live": {
            "confidence_mean": candidate,
            "baseline_confidence_mean": production,
            "agreement_with_baseline": agreement,
        },
    }


def test_the_gate_measures_what_to_expect_live_on_the_same_rows():
    candidate = [("circle", 0.7), ("square", 0.6), ("empty", 0.8), ("circle", 0.5)]
    production = [("circle", 1.0), ("circle", 0.9), ("empty", 1.0), ("circle", 1.0)]
    live = live_expectation(candidate, production)
    assert live["confidence_mean"] == pytest.approx(0.65)
    assert live["baseline_confidence_mean"] == pytest.approx(0.975)
    assert live["agreement_with_baseline"] == pytest.approx(0.75)


def test_an_expectation_holds_only_against_the_production_the_gate_compared_with():
    assert Expected.from_evaluation(gated(0.75, 1.0, 0.5), "1") == Expected(-0.25, 0.5, "1")
    assert Expected.from_evaluation(gated(0.7, 1.0, 0.6), "job-00002") is None  # production moved on
    assert Expected.from_evaluation(None, "1") is None  # uploaded by hand: never evaluated
    assert Expected.from_evaluation({"promotable": True, "baseline": None}, "1") is None


# The cause of the old single threshold's failure: production (the factory model) answers the camera's
# frames at ~1.0 confidence, a retrained version that is better on the true labels at 0.6-0.8, a
# flattened one at ~0.3. Judged against what its gate saw, the first is kept, the second rolled back.
RETRAINED = Expected.from_evaluation(gated(0.70, 0.99, 0.55), "1")
BASELINE = combine([report(400, 0.99)])


@pytest.mark.parametrize(
    ("canary", "expected", "action", "why"),
    [
        (report(60, 0.68, agreement=0.52), RETRAINED, "wait", "healthy"),  # as the gate saw it: kept
        (report(60, 0.68, agreement=0.52), None, "rollback", "no gate figure"),  # no gate figure: too far
        (report(60, 0.30), None, "rollback", "confidence"),  # flattened, uploaded by hand
        (report(60, 0.30, agreement=0.55), RETRAINED, "rollback", "the gate's -0.290"),  # strays live
        (report(60, 0.68, agreement=0.20), RETRAINED, "rollback", "shadow agreement 0.200 < the gate's"),
        (report(60, 0.68, agreement=0.52, errors=0.5), RETRAINED, "rollback", "error rate"),
    ],
)
def test_live_figures_are_judged_against_what_the_gate_measured(canary, expected, action, why):
    judgement = judge(combine([canary]), BASELINE, 10, CONFIG, expected)
    assert judgement.action == action and why in judgement.reason, judgement.reason
    assert judgement.to_json()["expected"] == (dict(expected.__dict__) if expected else None)


def entry(version: str, promotable: bool | None = True, factory: bool = False) -> dict:
    evaluation = None if promotable is None else {"promotable": promotable, "reason": "r", "dataset": "d"}
    return {"name": "scene", "version": version, "factory": factory, "evaluation": evaluation}


def test_transitions_keep_one_production_one_canary_and_record_each_event():
    state = Lifecycle()
    promote_production(state, entry("1", None, factory=True), force=False, by="t", now=1, reason="factory")
    with pytest.raises(Refused) as refused:
        promote_canary(state, entry("2", False), ["gw1"], None, force=False, by="t", now=2)
    assert refused.value.reason == "not_promotable"
    promote_canary(state, entry("2"), ["gw1"], None, force=False, by="t", now=2)
    assert assignment(state, "gw1", "1") == ("2", "canary", "in the canary set (named)")
    assert assignment(state, "gw2", "1") == ("1", "production", "production alias")
    with pytest.raises(Refused, match="is the canary"):
        promote_canary(state, entry("3"), ["gw2"], None, force=False, by="t", now=3)
    promote_production(state, entry("2"), force=False, by="t", now=4, reason="soaked")
    assert (state.production, state.canary, state.stage("1"), state.stage("2")) == (
        "2",
        None,
        "archived",
        "production",
    )
    assert rollback(state, None, "1", by="t", now=5, reason="bad") == "1"  # the production before
    assert (state.production, state.stage("2")) == ("1", "archived")
    with pytest.raises(Refused) as refused:
        rollback(state, None, "1", by="t", now=6, reason="again")  # nothing earlier than the factory
    assert refused.value.reason == "no_target"
    assert [e["action"] for e in state.events] == ["production", "canary", "production", "rollback"]


def test_events_are_bounded_and_counted():
    state = Lifecycle()
    for i in range(MAX_EVENTS + 5):
        state.record({"ts": i, "action": "stored"})
    assert (
        len(state.events) == MAX_EVENTS
        and state.events_total == MAX_EVENTS + 5
        and state.events[0]["ts"] == 5
    )


def test_a_share_picks_a_stable_ceiling_of_the_fleet():
    fleet = [f"gw{i}" for i in range(10)]
    picked = canary_share_gateways(fleet, 0.25, "scene", "2")
    assert len(picked) == 3 and picked == canary_share_gateways(list(reversed(fleet)), 0.25, "scene", "2")
    with pytest.raises(Refused):
        canary_share_gateways(fleet, 0.0, "scene", "2")
