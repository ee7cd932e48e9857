"""Running an ONNX model artifact on inputs: preprocessing, one onnxruntime session, postprocessing.

The same functions serve the gateway's inference engine (gateway/camera/inference.py, which adds
batching, an executor and hot swaps) and cloudd's camera tasks (cloud/tasks), so an input gives
the same label and score on both sides. onnxruntime is imported only when a model is loaded.

Invariant: ``load_and_probe`` returns a model only if its bytes match the metadata's sha256 and it
ran once on a probe input and gave a finite score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from models.artifact import ArtifactError, ModelArtifact, check_bytes, preprocess_images
from protocol.events import InferenceEvent, InferenceKind


@dataclass(frozen=True)
class InferenceInput:
    source: str  # camera or device id
    seq: int
    capture_ts: float
    data: np.ndarray  # a BGR frame (image models) or a ready float vector (preprocess "none")
    payload: Any = None  # carried through untouched (e.g. the JPEG to upload)


@dataclass(frozen=True)
class Inferred:
    """One input and the event its inference made."""

    item: InferenceInput
    event: InferenceEvent


@dataclass(frozen=True)
class LoadedModel:
    artifact: ModelArtifact
    session: Any  # onnxruntime.InferenceSession

    @property
    def version(self) -> str:
        return self.artifact.version


def build_inputs(artifact: ModelArtifact, items: list[InferenceInput]) -> np.ndarray:
    spec = artifact.metadata.input
    if spec.preprocess == "image_rgb01":
        return preprocess_images([item.data for item in items], spec)
    return np.stack([np.asarray(item.data, np.float32).reshape(spec.sample_shape) for item in items])


def postprocess(artifact: ModelArtifact, inputs: np.ndarray, outputs: np.ndarray) -> list[tuple[str, float]]:
    """(label, score) per row: softmax class and probability, or anomaly verdict and error."""
    metadata = artifact.metadata
    if metadata.postprocess == "softmax_labels":
        shifted = np.exp(outputs - outputs.max(axis=1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        best = probabilities.argmax(axis=1)
        return [(metadata.labels[i], float(probabilities[row, i])) for row, i in enumerate(best)]
    errors = ((outputs.reshape(len(outputs), -1) - inputs.reshape(len(inputs), -1)) ** 2).mean(axis=1)
    threshold = metadata.threshold if metadata.threshold is not None else float("inf")
    return [("anomaly" if e > threshold else "normal", float(e)) for e in errors]


def run_batch(model: LoadedModel, items: list[InferenceInput]) -> list[Inferred]:
    """Blocking: preprocess, run, postprocess. Called in the engine's executor."""
    artifact = model.artifact
    inputs = build_inputs(artifact, items)
    outputs = model.session.run([artifact.metadata.output_name], {artifact.metadata.input.name: inputs})[0]
    kind: InferenceKind = "classification" if artifact.metadata.postprocess == "softmax_labels" else "anomaly"
    return [
        Inferred(
            item,
            InferenceEvent(
                type=kind,
                source=item.source,
                seq=item.seq,
                capture_ts=item.capture_ts,
                model=artifact.name,
                model_version=artifact.version,
                label=label,
                score=score,
            ),
        )
        for item, (label, score) in zip(items, postprocess(artifact, inputs, outputs), strict=True)
    ]


def probe_input(artifact: ModelArtifact) -> InferenceInput:
    spec = artifact.metadata.input
    data: np.ndarray
    if spec.preprocess == "image_rgb01":
        height, width = spec.sample_shape[1:3]  # NCHW
        data = np.full((height, width, 3), 128, np.uint8)  # a grey BGR frame
    else:
        data = np.zeros(spec.sample_shape, np.float32)
    return InferenceInput("probe", 0, 0.0, data)


def load_and_probe(artifact: ModelArtifact, threads: int) -> LoadedModel:
    """Blocking: verify the bytes, build a session, run the probe; raise ArtifactError on any failure."""
    import onnxruntime as ort

    check_bytes(artifact.metadata, artifact.onnx_bytes)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(artifact.onnx_bytes, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types; convert at the boundary
        raise ArtifactError("load_failed", str(exc)[:300]) from None
    model = LoadedModel(artifact, session)
    try:
        [result] = run_batch(model, [probe_input(artifact)])
    except Exception as exc:
        raise ArtifactError("probe_failed", str(exc)[:300]) from None
    if not np.isfinite(result.event.score):
        raise ArtifactError("probe_failed", "probe output is not finite")
    return model
