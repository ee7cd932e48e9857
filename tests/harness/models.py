"""Model versions for lifecycle tests: variants of the factory scene model, uploaded to a real cloudd
over HTTP, and the heartbeat ``models`` figures a gateway reports about the version it runs."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from models.artifact import ModelArtifact, load_artifact
from tests.harness.cloud_http import call, heartbeat

FACTORY_SCENE = Path(__file__).resolve().parents[2] / "models" / "artifacts" / "scene"


def scene_variant(version: str, labels: list[str] | None = None) -> ModelArtifact:
    """The factory scene model's bytes as another version; with ``labels`` its outputs are named
    otherwise (shuffled labels: the same network, every verdict moved to another class)."""
    factory = load_artifact(FACTORY_SCENE)
    update: dict[str, Any] = {"version": version}
    if labels is not None:
        update["labels"] = labels
    return ModelArtifact(factory.metadata.model_copy(update=update), factory.onnx_bytes)


def upload_model(url: str, token: str | None, artifact: ModelArtifact) -> tuple[int, dict]:
    """POST /v1/models/<name> as multipart/form-data (the route's own format)."""
    boundary = uuid.uuid4().hex
    parts = [
        ("metadata", "application/json", artifact.metadata.model_dump_json().encode()),
        ("onnx", "application/octet-stream", artifact.onnx_bytes),
    ]
    body = (
        b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}"\r\n'
            f"Content-Type: {kind}\r\n\r\n".encode()
            + data
            + b"\r\n"
            for name, kind, data in parts
        )
        + f"--{boundary}--\r\n".encode()
    )
    return call(
        f"{url}/v1/models/{artifact.name}",
        token,
        "POST",
        body,
        content_type=f"multipart/form-data; boundary={boundary}",
    )


def figures(version: str, *, frames: int, confidence: float, agreement: float | None = None) -> dict:
    """One model's heartbeat figures (protocol: the heartbeat ``models`` field)."""
    return {
        "version": version,
        "pinned": None,
        "stage": None,
        "frames": frames,
        "confidence_mean": confidence,
        "shadow_agreement": agreement,
        "shadow_frames": frames // 10 if agreement is not None else 0,
        "error_rate": 0.0,
        "latency_ms_p50": 3.0,
        "since_ts": time.time() - 60,
    }


def post_heartbeat(cloudd: Any, gateway: str, models: dict[str, dict]) -> tuple[int, dict]:
    """A gateway's heartbeat with its ``models`` figures, over HTTP with its own token."""
    body = heartbeat(gateway, interval_s=5.0, sent_ts=time.time()) | {"models": models}
    return call(
        f"{cloudd.url}/v1/gateways/{gateway}/heartbeat",
        cloudd.token_for(gateway),
        "POST",
        json.dumps(body).encode(),
    )


def lifecycle(cloudd: Any, name: str) -> dict:
    status, doc = call(f"{cloudd.url}/v1/models/{name}", cloudd.operator_token)
    assert status == 200, doc
    return doc


def assigned(cloudd: Any, name: str, gateway: str) -> dict:
    status, doc = call(
        f"{cloudd.url}/v1/models/{name}/assignment?gateway={gateway}", cloudd.token_for(gateway)
    )
    assert status == 200, doc
    return doc


def promote(cloudd: Any, name: str, body: dict) -> tuple[int, dict]:
    return call(f"{cloudd.url}/v1/models/{name}/promote", cloudd.operator_token, "POST", body)


def flattened_scene(version: str, factor: float = 0.05) -> ModelArtifact:
    """The factory scene model with its logits scaled by ``factor``: the same verdicts (argmax),
    far lower confidence: a version the held-out gate cannot tell apart but live figures can."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from models.artifact import build_metadata

    factory = load_artifact(FACTORY_SCENE)
    graph_model = onnx.load_from_string(factory.onnx_bytes)
    graph = graph_model.graph
    output = factory.metadata.output_name
    raw = f"{output}_unscaled"
    for node in graph.node:
        node.output[:] = [raw if name == output else name for name in node.output]
    graph.initializer.append(numpy_helper.from_array(np.array(factor, np.float32), "logit_scale"))
    graph.node.append(helper.make_node("Mul", [raw, "logit_scale"], [output]))
    onnx_bytes = graph_model.SerializeToString()
    fields = factory.metadata.model_dump(exclude={"sha256", "size", "created_ts"})
    fields.update(version=version, notes={"logit_scale": factor})
    return ModelArtifact(build_metadata(onnx_bytes, **fields), onnx_bytes)
