"""A model artifact: an ONNX file plus its metadata (name, version, input spec, labels, sha256).

On disk an artifact is a folder holding ``model.onnx`` and ``metadata.json``. This module imports
neither torch nor onnxruntime: the gateway loads artifacts with it and runs them elsewhere.

Invariant: a `ModelArtifact` value exists only if sha256(onnx_bytes) equals its metadata's
sha256 and the size matches; `load_artifact` and `artifact_from_bytes` raise `ArtifactError`
(a value the caller reports) otherwise.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.errors import ProtocolError
from protocol.events import InputSpec, ModelMetadata, parse_model_metadata
from runtime.files import atomic_write

if TYPE_CHECKING:  # numpy is imported where images are preprocessed, not by every reader of metadata
    import numpy as np

ONNX_FILE = "model.onnx"
METADATA_FILE = "metadata.json"


class ArtifactError(ValueError):
    """An artifact that must not be run: ``reason`` is a stable token (hash_mismatch, ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ModelArtifact:
    metadata: ModelMetadata
    onnx_bytes: bytes

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def version(self) -> str:
        return self.metadata.version

    def __post_init__(self) -> None:
        check_bytes(self.metadata, self.onnx_bytes)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_bytes(metadata: ModelMetadata, onnx_bytes: bytes) -> None:
    if len(onnx_bytes) != metadata.size:
        raise ArtifactError("size_mismatch", f"{len(onnx_bytes)} bytes, metadata says {metadata.size}")
    digest = sha256_hex(onnx_bytes)
    if digest != metadata.sha256:
        raise ArtifactError("hash_mismatch", f"sha256 {digest[:16]}... != metadata {metadata.sha256[:16]}...")


def build_metadata(onnx_bytes: bytes, **fields: Any) -> ModelMetadata:
    """Metadata for ``onnx_bytes``: hash and size computed here, the rest from ``fields``."""
    fields.setdefault("created_ts", time.time())
    try:
        return ModelMetadata.model_validate(
            {**fields, "sha256": sha256_hex(onnx_bytes), "size": len(onnx_bytes)}
        )
    except Exception as exc:  # pydantic ValidationError -> our boundary error
        raise ArtifactError("invalid_metadata", str(exc)) from None


def artifact_from_bytes(metadata_json: bytes | str, onnx_bytes: bytes) -> ModelArtifact:
    try:
        metadata = parse_model_metadata(metadata_json)
    except ProtocolError as exc:
        raise ArtifactError("invalid_metadata", exc.detail) from None
    return ModelArtifact(metadata, onnx_bytes)


def save_artifact(folder: Path, artifact: ModelArtifact) -> Path:
    """Write both files, ONNX first and metadata last (renamed into place): a folder with a
    metadata.json always has the ONNX file that metadata describes."""
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, data in (
        (ONNX_FILE, artifact.onnx_bytes),
        (METADATA_FILE, artifact.metadata.model_dump_json(indent=1).encode()),
    ):
        atomic_write(folder / file_name, data)
    return folder


def load_artifact(folder: Path) -> ModelArtifact:
    try:
        metadata_json = (folder / METADATA_FILE).read_bytes()
        onnx_bytes = (folder / ONNX_FILE).read_bytes()
    except OSError as exc:
        raise ArtifactError("unreadable", f"{folder}: {exc.strerror}") from None
    return artifact_from_bytes(metadata_json, onnx_bytes)


def metadata_dict(artifact: ModelArtifact) -> dict[str, Any]:
    return json.loads(artifact.metadata.model_dump_json())


def preprocess_images(images_bgr: Sequence[np.ndarray], spec: InputSpec) -> np.ndarray:
    """``image_rgb01``: resize each BGR frame to the spec's H x W, RGB, scale to [0, 1], NCHW float32.
    Training and the gateway both call this, so a model sees the same pixels at both ends."""
    import cv2
    import numpy as np

    if spec.preprocess != "image_rgb01":
        raise ArtifactError("bad_preprocess", f"{spec.preprocess!r} is not an image preprocessing")
    height, width = spec.sample_shape[1:3]  # NCHW
    batch = np.empty((len(images_bgr), 3, height, width), dtype=np.float32)
    for row, image in enumerate(images_bgr):
        small = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
        batch[row] = small[:, :, ::-1].transpose(2, 0, 1) * (1.0 / 255.0)
    if spec.mean is not None and spec.std is not None:
        batch = (batch - np.asarray(spec.mean, np.float32)[:, None, None]) / np.asarray(spec.std, np.float32)[
            :, None, None
        ]
    return batch
