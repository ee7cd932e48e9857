"""The quality gate: a version is promotable only if it beats or ties, on held-out rows, the version it
would replace. Scored with onnxruntime on real ONNX models; through cloudd with real torchrun jobs."""

from __future__ import annotations

import json
import math

import pytest

from cloud.rollout.gate import HeldOut, evaluate
from cloud.rollout.verdict import GateConfig, evaluation_document, verdict
from models.artifact import load_artifact
from tests.harness.cloud_http import call
from tests.harness.cloudd import start_cloudd
from tests.harness.models import FACTORY_SCENE, assigned, lifecycle, promote, scene_variant


@pytest.fixture(scope="module")
def scene_rows() -> HeldOut:
    from models.scene import LABELS, scene_dataset

    data = scene_dataset(seed=1234, n=120)  # frames no scene model was trained on (its seed is 0)
    return HeldOut(data.x.numpy(), data.y.numpy(), "synthetic scenes, seed 1234", list(LABELS))


def test_shuffled_labels_are_refused_and_a_tie_passes(scene_rows):
    factory = load_artifact(FACTORY_SCENE)
    labels = list(factory.metadata.labels)
    shuffled = scene_variant("2", labels=labels[1:] + labels[:1])
    bad = evaluate(shuffled, factory, scene_rows, GateConfig())
    assert bad["metric"] == "accuracy" and bad["rows"] == 120 and bad["baseline"]["version"] == "1"
    assert bad["baseline"]["value"] > 0.8 and bad["value"] < 0.5 and bad["promotable"] is False
    same = evaluate(scene_variant("3"), factory, scene_rows, GateConfig())
    assert same["value"] == same["baseline"]["value"] and same["promotable"] is True
    alone = evaluate(shuffled, None, scene_rows, GateConfig())  # nothing to replace: chance + floor
    assert alone["baseline"] is None and alone["promotable"] is False and "chance" in alone["reason"]


def test_verdict_arithmetic():
    config = GateConfig(tolerance=0.02, floor_over_chance=0.2)
    assert verdict("accuracy", 0.89, 0.90, 10, config)[0] is True  # ties within 2 points
    assert verdict("accuracy", 0.87, 0.90, 10, config)[0] is False
    assert verdict("accuracy", 0.29, None, 10, config)[0] is False  # chance 0.1 + floor 0.2
    assert verdict("loss", 1.019, 1.0, 0, config)[0] is True  # relative tolerance
    assert verdict("loss", 1.03, 1.0, 0, config)[0] is False
    assert verdict("loss", math.nan, None, 0, config)[0] is False
    empty = evaluation_document("accuracy", math.nan, "nothing", 0, None, 4, config)
    assert empty["promotable"] is False and empty["value"] is None and "no held-out rows" in empty["reason"]
    with pytest.raises(ValueError, match="tolerance"):
        GateConfig(tolerance=1.5)


@pytest.mark.slow  # two torchrun jobs
@pytest.mark.timeout(600)
def test_a_diverged_job_is_refused_by_the_gate_and_never_assigned(tmp_path):
    cloudd = start_cloudd(tmp_path / "c")
    try:
        train = ("train", "--model", "digits_cnn", "--nproc", "2", "--wait")
        assert cloudd.ctl(*train, "--epochs", "4").returncode == 0
        good = lifecycle(cloudd, "digits")["versions"][0]
        assert good["version"] == "job-00001" and good["evaluation"]["promotable"] is True
        assert good["evaluation"]["baseline"] is None and good["evaluation"]["rows"] == 359
        assert cloudd.ctl("models", "promote", "digits", "job-00001", "--production").returncode == 0

        result = cloudd.ctl(
            *train, "--epochs", "1", "--lr", "10"
        )  # diverges to a constant guess; loss stays finite
        assert result.returncode == 0, result.stdout + result.stderr
        bad = next(v for v in lifecycle(cloudd, "digits")["versions"] if v["version"] == "job-00002")
        evaluation = bad["evaluation"]
        assert evaluation["baseline"] == {"version": "job-00001", "value": good["evaluation"]["value"]}
        assert evaluation["value"] < 0.5 and evaluation["promotable"] is False and bad["stage"] == "candidate"
        assert "digits test split" in evaluation["dataset"]

        for body in (
            {"version": "job-00002", "canary": ["gw1"]},
            {"version": "job-00002", "production": True},
        ):
            status, refusal = promote(cloudd, "digits", body)
            assert status == 409 and refusal["error"] == "not_promotable"
            assert "accuracy" in refusal["detail"] and "job-00001" in refusal["detail"]
        assert {assigned(cloudd, "digits", g)["version"] for g in ("gw1", "gw2", "gw3")} == {"job-00001"}
        listing = cloudd.ctl("models", "list", "--name", "digits").stdout
        assert "REFUSED" in listing and "job-00002" in listing
        status, job = call(f"{cloudd.url}/v1/jobs/job-00002", cloudd.operator_token)
        assert job["model"]["evaluation"]["promotable"] is False
        events = cloudd.ctl("watch", "job-00002", "--json").stdout
        assert any(
            json.loads(line).get("event") == "evaluated"
            for line in events.splitlines()
            if line.startswith("{")
        )
    finally:
        cloudd.stop()
