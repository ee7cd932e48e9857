"""The cloud's half of the camera service: ``summarise`` an edge inference, or ``infer`` a frame the
gateway uploaded and summarise it, each into the one CameraEvent of its input record.

``summarise`` is ``models.summarise``, the code the gateway runs too. ``FrameInference`` does the
blocking work (read the blob, decode the JPEG, run the model) and is called on a worker thread by
the runner. Models come from the registry (``DATA_DIR/models/<name>/<version>``), else from the
factory artifacts shipped with the code (``models/artifacts/<name>``, when its version is the one
asked for); each version is loaded and probed once and kept in a small LRU cache.

Outcomes are values: ``Made`` (the event), ``BlobNotYet`` (the frame's blob is not committed: try
again later; the runner gives up after ``blob_wait_s``, ``blob_missing``), ``Failed`` (a blob that
is unreadable, corrupt or undecodable, a model that cannot be found or loaded, any other error while
inferring: stored as a ``task_failed`` event in the event's place, so the log goes on). ``infer``
raises nothing: one bad frame must not stop the runner.

Invariant: one input record gives at most one stored outcome, ``Made`` or ``Failed``, keyed by its LSN.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cloud.registry import ModelRegistry
from cloud.store.blobs import BlobStore, valid_blob_id
from models.artifact import ArtifactError, ModelArtifact, load_artifact
from models.inference import InferenceInput, LoadedModel, load_and_probe, run_batch
from models.summarise import summarise
from protocol.derived import CameraEvent, FrameForCloud
from protocol.errors import ProtocolError

CAMERA_TASK = "camera/summarise"  # the task whose output a CameraEvent is
FailureReason = Literal[
    "blob_missing",
    "blob_unreadable",
    "blob_corrupt",
    "frame_undecodable",
    "model_unavailable",
    "inference_failed",
]


def failure_body(
    reason: FailureReason, detail: str, *, task: str, input_lsn: int, source: str
) -> dict[str, Any]:
    """What is stored in place of a result the cloud could not make (counted and logged too)."""
    return {
        "v": 1,
        "type": "task_failed",
        "task": task,
        "input": input_lsn,
        "source": source,
        "reason": reason,
        "detail": detail[:300],
        "ran_at": "cloud",
    }


@dataclass(frozen=True)
class Made:
    event: CameraEvent


@dataclass(frozen=True)
class BlobNotYet:
    blob_id: str


@dataclass(frozen=True)
class Failed:
    reason: FailureReason
    detail: str


FrameOutcome = Made | BlobNotYet | Failed


class FrameInference:
    """Blocking; one caller at a time (the runner's single inference thread)."""

    def __init__(
        self,
        blobs: BlobStore,
        registry: ModelRegistry | None,
        factory_dir: Path,
        *,
        cache_size: int = 4,
        threads: int = 1,
    ) -> None:
        self.blobs = blobs
        self.registry = registry
        self.factory_dir = factory_dir
        self.cache_size = cache_size
        self.threads = threads
        self._models: OrderedDict[tuple[str, str], LoadedModel | Failed] = OrderedDict()
        self.loads = 0

    def infer(self, gateway: str, lsn: int, frame: FrameForCloud) -> FrameOutcome:
        try:
            return self._infer(gateway, lsn, frame)
        except Exception as exc:  # the boundary: whatever else goes wrong is this frame's failure
            return Failed("inference_failed", f"{type(exc).__name__}: {exc}")

    def _infer(self, gateway: str, lsn: int, frame: FrameForCloud) -> FrameOutcome:
        blob_id = str(frame.blob.get("id", ""))
        if not valid_blob_id(blob_id):
            return Failed("blob_corrupt", f"blob id {blob_id!r} is not a valid blob id")
        status = self.blobs.status(gateway, blob_id)
        if not status.committed:
            return BlobNotYet(blob_id)
        try:
            jpeg = self.blobs.committed_path(gateway, blob_id).read_bytes()
        except OSError as exc:
            return Failed("blob_unreadable", f"blob {blob_id}: {exc}")
        expected = frame.blob.get("sha256")
        if expected is not None and hashlib.sha256(jpeg).hexdigest() != expected:
            return Failed("blob_corrupt", f"blob {blob_id} does not hash to the sha256 its record names")
        image = _decode_jpeg(jpeg)
        if image is None:
            return Failed("frame_undecodable", f"blob {blob_id} ({len(jpeg)} bytes) is not a JPEG image")
        model = self.model(frame.model, frame.model_version)
        if isinstance(model, Failed):
            return model
        try:
            [inferred] = run_batch(model, [InferenceInput(frame.source, frame.seq, frame.capture_ts, image)])
        except Exception as exc:  # onnxruntime's own errors, converted at the boundary
            return Failed("inference_failed", f"{type(exc).__name__}: {exc}")
        event = summarise(
            inferred.event,
            frame.camera,
            infer_at="cloud",
            summarise_at="cloud",
            input=lsn,
            frame={"seq": frame.seq, "jpeg_bytes": len(jpeg)},
            blob=frame.blob,
        )
        return Made(event)

    def model(self, name: str, version: str) -> LoadedModel | Failed:
        """The loaded model, from the cache or loaded now; a version that failed to load is
        remembered as failed (until evicted) rather than tried on every frame."""
        key = (name, version)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        try:
            loaded: LoadedModel | Failed = load_and_probe(self._artifact(name, version), self.threads)
        except (ArtifactError, ProtocolError) as exc:
            loaded = Failed("model_unavailable", f"model {name} version {version}: {exc}")
        self.loads += 1
        self._models[key] = loaded
        while len(self._models) > self.cache_size:
            self._models.popitem(last=False)
        return loaded

    def _artifact(self, name: str, version: str) -> ModelArtifact:
        if self.registry is not None and self.registry.entry(name, version) is not None:
            return self.registry.load(name, version)
        factory = load_artifact(self.factory_dir / name)
        if factory.version != version:
            raise ArtifactError(
                "not_found", f"not in the registry, and the factory artifact is version {factory.version}"
            )
        return factory


def _decode_jpeg(data: bytes) -> Any:
    """The image, or None when ``data`` is no image (OpenCV raises for some, e.g. empty, input)."""
    import cv2
    import numpy as np

    try:
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:
        return None
