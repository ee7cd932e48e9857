"""The model lifecycle through a real cloudd: the factory version, stages, canary assignment per
gateway, operator rollback, and the rollout controller acting on real heartbeats posted over HTTP."""

from __future__ import annotations

import pytest

from protocol.events import parse_model_notice
from protocol.topics import model_notice_topic
from tests.harness.cloud_http import call
from tests.harness.cloudd import start_cloudd
from tests.harness.models import (
    assigned,
    figures,
    lifecycle,
    post_heartbeat,
    promote,
    scene_variant,
    upload_model,
)
from tests.harness.mqtt import retained
from tests.harness.poll import wait_until

FAST_ROLLOUT = (
    "--rollout-interval-s",
    "0.2",
    "--rollout-min-frames-to-judge",
    "20",
    "--rollout-min-frames-to-promote",
    "40",
)


@pytest.fixture
def cloudd(tmp_path):
    server = start_cloudd(tmp_path / "c", extra_args=[*FAST_ROLLOUT, "--rollout-canary-soak-s", "3600"])
    yield server
    server.stop()


def stages(cloudd, name: str = "scene") -> dict[str, str]:
    return {v["version"]: v["stage"] for v in lifecycle(cloudd, name)["versions"]}


def test_the_factory_version_is_production_assignable_and_kept_across_restarts(cloudd):
    for gateway in ("gw1", "gw2", "gw3"):
        doc = assigned(cloudd, "scene", gateway)
        assert (doc["version"], doc["stage"]) == ("1", "production") and len(doc["sha256"]) == 64
    cloudd.restart()
    doc = lifecycle(cloudd, "scene")
    assert doc["factory"] == "1" and doc["production"] == "1" and len(doc["versions"]) == 1
    status, refusal = call(f"{cloudd.url}/v1/models/scene/assignment?gateway=gw2", cloudd.token_for("gw1"))
    assert status == 403 and refusal["error"] == "forbidden"
    status, refusal = call(f"{cloudd.url}/v1/models/nothing/assignment?gateway=gw1", cloudd.token_for("gw1"))
    assert status == 404 and refusal["error"] == "no_assignment"


def test_a_version_without_evaluation_is_refused_unless_forced(cloudd):
    assert upload_model(cloudd.url, cloudd.operator_token, scene_variant("2"))[0] == 201
    assert stages(cloudd)["2"] == "candidate"
    status, refusal = promote(cloudd, "scene", {"version": "2", "canary": ["gw1"]})
    assert status == 409 and refusal["error"] == "not_promotable" and "no evaluation" in refusal["detail"]
    assert {assigned(cloudd, "scene", g)["version"] for g in ("gw1", "gw2", "gw3")} == {"1"}
    result = cloudd.ctl("models", "promote", "scene", "2", "--canary", "gw1")
    assert result.returncode == 1 and "not_promotable" in result.stderr


def test_stages_canary_per_gateway_production_and_operator_rollback(cloudd):
    for version in ("2", "3"):
        assert upload_model(cloudd.url, cloudd.operator_token, scene_variant(version))[0] == 201
    result = cloudd.ctl("models", "promote", "scene", "2", "--canary", "gw1", "--force")
    assert result.returncode == 0, result.stderr
    assert stages(cloudd) == {"1": "production", "2": "canary", "3": "candidate"}
    picks = {g: assigned(cloudd, "scene", g) for g in ("gw1", "gw2", "gw3")}
    assert (picks["gw1"]["version"], picks["gw1"]["stage"]) == ("2", "canary")
    assert {(picks[g]["version"], picks[g]["stage"]) for g in ("gw2", "gw3")} == {("1", "production")}

    status, refusal = promote(cloudd, "scene", {"version": "3", "canary": ["gw2"], "force": True})
    assert status == 409 and refusal["error"] == "canary_running"
    status, refusal = call(
        f"{cloudd.url}/v1/models/scene/2/stage", cloudd.operator_token, "POST", {"stage": "production"}
    )
    assert status == 409 and refusal["error"] == "use_promote"
    status, refusal = promote(cloudd, "scene", {"version": "3", "canary": ["gw9"], "force": True})
    assert status == 400 and "canary" in refusal["detail"]

    assert cloudd.ctl("models", "promote", "scene", "2", "--production", "--force").returncode == 0
    assert stages(cloudd) == {"1": "archived", "2": "production", "3": "candidate"}
    assert {assigned(cloudd, "scene", g)["version"] for g in ("gw1", "gw2", "gw3")} == {"2"}

    # a share of the fleet: ceil(0.5 x 3) = 2 gateways run version 3, the third keeps production
    assert promote(cloudd, "scene", {"version": "3", "share": 0.5, "force": True})[0] == 200
    canary = lifecycle(cloudd, "scene")["canary"]
    assert len(canary["gateways"]) == 2 and canary["share"] == 0.5
    versions = {g: assigned(cloudd, "scene", g)["version"] for g in ("gw1", "gw2", "gw3")}
    assert sorted(versions.values()) == ["2", "3", "3"]

    result = cloudd.ctl("models", "rollback", "scene", "--reason", "looks odd")
    assert result.returncode == 0 and "rollback 3: looks odd" in result.stdout
    assert stages(cloudd)["3"] == "archived" and lifecycle(cloudd, "scene")["canary"] is None
    result = cloudd.ctl("models", "rollback", "scene")  # no canary: production 2 -> the one before (1)
    assert result.returncode == 0, result.stderr
    assert lifecycle(cloudd, "scene")["production"] == "1"
    assert {assigned(cloudd, "scene", g)["version"] for g in ("gw1", "gw2", "gw3")} == {"1"}
    assert cloudd.ctl("models", "stage", "scene", "3", "candidate").returncode == 0
    assert stages(cloudd) == {"1": "production", "2": "archived", "3": "candidate"}

    listing = cloudd.ctl("models", "list", "--name", "scene").stdout
    actions = [e["action"] for e in lifecycle(cloudd, "scene")["history"]]
    assert actions[-6:] == ["canary", "production", "canary", "rollback", "rollback", "stage"]
    assert "rollback 3 by operator: looks odd" in listing and "production 1, factory 1" in listing


def _report(cloudd, canary_confidence: float, frames: int) -> None:
    for gateway in ("gw2", "gw3"):
        models = {"scene": figures("1", frames=500, confidence=0.93)}
        assert post_heartbeat(cloudd, gateway, models)[0] == 200
    models = {"scene": figures("2", frames=frames, confidence=canary_confidence, agreement=0.9)}
    status, answer = post_heartbeat(cloudd, "gw1", models)
    assert status == 200, answer


def test_a_worse_canary_is_rolled_back_automatically(cloudd):
    assert upload_model(cloudd.url, cloudd.operator_token, scene_variant("2"))[0] == 201
    assert promote(cloudd, "scene", {"version": "2", "canary": ["gw1"], "force": True})[0] == 200
    _report(cloudd, canary_confidence=0.91, frames=10)  # too few frames to judge: it keeps running
    wait_until(lambda: lifecycle(cloudd, "scene")["rollout"] is not None, 30, "the controller looked")
    assert lifecycle(cloudd, "scene")["rollout"]["action"] == "wait"
    _report(cloudd, canary_confidence=0.41, frames=60)
    wait_until(lambda: lifecycle(cloudd, "scene")["canary"] is None, 30, "the canary rolled back")
    doc = lifecycle(cloudd, "scene")
    last = doc["history"][-1]
    assert (
        last["action"] == "rollback" and last["by"] == "rollout-controller" and "confidence" in last["reason"]
    )
    assert last["figures"]["canary"]["confidence_mean"] == pytest.approx(0.41)
    assert stages(cloudd) == {"1": "production", "2": "archived"}
    assert assigned(cloudd, "scene", "gw1")["version"] == "1"
    assert "rollback 2 by rollout-controller" in cloudd.ctl("models", "list", "--name", "scene").stdout


def test_a_healthy_canary_becomes_production_after_the_soak(tmp_path):
    server = start_cloudd(tmp_path / "c", extra_args=[*FAST_ROLLOUT, "--rollout-canary-soak-s", "1"])
    try:
        assert upload_model(server.url, server.operator_token, scene_variant("2"))[0] == 201
        assert promote(server, "scene", {"version": "2", "canary": ["gw1"], "force": True})[0] == 200
        _report(server, canary_confidence=0.92, frames=80)
        wait_until(lambda: lifecycle(server, "scene")["production"] == "2", 30, "the canary promoted")
        last = lifecycle(server, "scene")["history"][-1]
        assert last["action"] == "production" and last["by"] == "rollout-controller"
        assert {assigned(server, "scene", g)["version"] for g in ("gw1", "gw2", "gw3")} == {"2"}
    finally:
        server.stop()


def test_each_gateway_is_told_its_assignment_never_a_mere_candidate(tmp_path, mosquitto):
    server = start_cloudd(tmp_path / "c", extra_args=["--broker", mosquitto.url])
    topics = {g: model_notice_topic(g, "scene") for g in ("gw1", "gw2", "gw3")}

    def notices() -> dict[str, str]:
        got = retained(mosquitto.port, list(topics.values()), timeout_s=3.0)
        return {g: parse_model_notice(got[t]).version for g, t in topics.items() if t in got}

    try:
        wait_until(
            lambda: notices() == {"gw1": "1", "gw2": "1", "gw3": "1"}, 30, "the factory version announced"
        )
        assert upload_model(server.url, server.operator_token, scene_variant("2"))[0] == 201
        assert notices() == {"gw1": "1", "gw2": "1", "gw3": "1"}  # a candidate is announced to no one
        assert promote(server, "scene", {"version": "2", "canary": ["gw2"], "force": True})[0] == 200
        wait_until(lambda: notices() == {"gw1": "1", "gw2": "2", "gw3": "1"}, 30, "gw2 told of its canary")
    finally:
        server.stop()


def test_with_no_production_gateway_reporting_the_canarys_own_figures_before_the_swap_are_the_baseline(
    cloudd,
):
    assert upload_model(cloudd.url, cloudd.operator_token, scene_variant("2"))[0] == 201
    assert post_heartbeat(cloudd, "gw1", {"scene": figures("1", frames=400, confidence=0.95)})[0] == 200
    ticks = lifecycle(cloudd, "scene")["controller"]["ticks"]
    wait_until(
        lambda: lifecycle(cloudd, "scene")["controller"]["ticks"] > ticks + 1, 30, "the controller saw it"
    )
    assert promote(cloudd, "scene", {"version": "2", "canary": ["gw1"], "force": True})[0] == 200
    assert post_heartbeat(cloudd, "gw1", {"scene": figures("2", frames=60, confidence=0.5)})[0] == 200
    wait_until(lambda: lifecycle(cloudd, "scene")["canary"] is None, 30, "the canary rolled back")
    judged = lifecycle(cloudd, "scene")["history"][-1]["figures"]
    assert (
        judged["baseline"]["confidence_mean"] == pytest.approx(0.95) and judged["baseline"]["gateways"] == 1
    )
