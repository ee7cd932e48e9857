"""The rollout's pure parts: the canary judgement on combined figures, and stage transitions."""

from __future__ import annotations

import pytest

from cloud.rollout.health import RolloutConfig, combine, judge
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
        "shadow_frames": frames // 10,
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
