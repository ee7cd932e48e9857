"""deploy/k8s: every manifest is a valid object of its kind, and the job they run is this repository's.

No cluster is available here, so validity is checked against the API's own models: the ``kubernetes``
client's for core and apps objects, the training operator's ``kubeflow-training`` SDK for the
PyTorchJob. A manifest must deserialize (required fields present, enums and types right) and
serialize back to exactly itself (a misspelt or unknown field is dropped by the models, so it
shows as a difference).
"""

from __future__ import annotations

import json
import shlex
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloud.training.jobfile import load_job
from tests.harness.processes import REPO

kubernetes = pytest.importorskip("kubernetes", reason="the [test] extra installs the kubernetes client")
kubeflow_training = pytest.importorskip(
    "kubeflow.training", reason="the [test] extra installs kubeflow-training"
)

K8S = REPO / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def all_documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for path in MANIFESTS for doc in documents(path)}


def round_trip(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` through its kind's model and back."""
    if doc["apiVersion"] == "kubeflow.org/v1":
        client, model = kubeflow_training.ApiClient(), f"KubeflowOrgV1{doc['kind']}"
    else:
        client, model = kubernetes.client.ApiClient(), f"V1{doc['kind']}"
    typed = client.deserialize(types.SimpleNamespace(data=json.dumps(doc)), model)
    back: dict[str, Any] = client.sanitize_for_serialization(typed)
    return back


def test_the_manifests_are_there():
    assert {p.name for p in MANIFESTS} == {"job-config.yaml", "pytorchjob.yaml", "statefulset.yaml"}
    assert set(all_documents()) == {
        "ConfigMap",
        "PersistentVolumeClaim",
        "PyTorchJob",
        "Service",
        "StatefulSet",
    }


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_is_a_valid_object_of_its_kind(path):
    for doc in documents(path):
        assert round_trip(doc) == doc, f"{path.name}: {doc['kind']} has fields its API does not know"


def test_the_validation_catches_a_misspelt_and_a_missing_field():
    job = all_documents()["PyTorchJob"]
    misspelt = json.loads(json.dumps(job))
    misspelt["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 2
    assert round_trip(misspelt) != misspelt
    nameless = json.loads(json.dumps(job))
    del nameless["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(ValueError, match="name"):
        round_trip(nameless)


def test_the_job_file_loads_and_puts_one_stage_on_each_node(tmp_path):
    docs = all_documents()
    job_file = tmp_path / "job.toml"
    job_file.write_text(docs["ConfigMap"]["data"]["job.toml"])
    job = load_job(job_file)
    assert job.checkpoint.dir.startswith("/shared/") and job.progress.file.startswith("/shared/")
    nodes_in_job = len(job.partition.stages)
    operator = docs["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
    assert operator["Master"]["replicas"] + operator["Worker"]["replicas"] == nodes_in_job
    assert docs["StatefulSet"]["spec"]["replicas"] == nodes_in_job
    command = operator["Master"]["template"]["spec"]["containers"][0]["command"]
    assert f"--nnodes={nodes_in_job}" in command and command[-3:] == [
        "cloud.training.run",
        "--job",
        "/job/job.toml",
    ]
    script = shlex.split(docs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["args"][0])
    launch = script.index("deploy/torchrun/launch.sh")
    assert (REPO / script[launch]).is_file()
    assert script[launch + 1 : launch + 4] == ["/job/job.toml", str(nodes_in_job), "1"]
    host = script[launch + 4].split(":")[0]
    service, statefulset = docs["Service"], docs["StatefulSet"]
    assert host == f"{statefulset['metadata']['name']}-0.{service['metadata']['name']}"  # pod 0's DNS name
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == statefulset["spec"]["template"]["metadata"]["labels"]
