"""Federated training on the wire: the update a gateway sends, the global model it fetches, the job.

An update travels as the ``body`` of a log ``Record`` of kind ``"update"`` (so it survives outages
like any record and goes up in an ordinary upload batch)::

    {"v": 1, "update_id": "r12-3f2a9c01", "model": "digits", "base_version": 7, "samples": 144,
     "local_steps": 18, "fetched_ts": 1764489600.2, "trained_s": 0.41, "train_loss": 0.31,
     "codec": "topk(0.25)+bfp(b=32,m=6,...)",
     "tensors": [{"name": "1.weight", "shape": [64, 64], "encoding": "topk_bfp", "nbytes": 5126}, ...],
     "payload_sha256": "9f2c...", "payload_b64": "..."}

``payload`` := the tensors' sections concatenated in ``tensors`` order, each ``nbytes`` long; the
digest is SHA-256 of the raw (decoded) payload. Section encodings (little-endian):

    fp32        numel float32 values of the delta
    bfp         one models.numerics wire blob (``to_bytes(encode(delta, fmt))``)
    topk_bfp    k u32 | keep mask, ceil(numel/8) bytes (bit i, LSB first, set = element i sent)
                | one numerics wire blob of the k kept values, in index order
    state_fp32  numel float32 values of the tensor itself after local training, not a delta: every
                floating buffer (BatchNorm running statistics), and only those, travels so

The delta is ``trained - base`` where ``base`` is global version ``base_version``; staleness is
computed by the cloud as (its version when applying) - ``base_version``. ``(gateway, update_id)``
names an update for ever: the cloud applies each at most once.

The global model a gateway fetches (``GlobalModel``) uses the same container with every section
``fp32`` (the full weights, not a delta) and carries the ``RoundConfig`` the gateway trains with
(FedProx's ``mu`` among it). This module is pure (no torch): it checks lengths and digests only.

Invariant: ``split_payload`` returns sections only if the payload decodes, is within the size
limit, hashes to ``payload_sha256`` and its length equals the sum of the declared ``nbytes``;
otherwise it raises ``ProtocolError`` whose reason (``too_large``, ``bad_payload``,
``digest_mismatch``, ``length_mismatch``) the cloud counts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol.errors import ProtocolError
from protocol.telemetry import describe_validation_error
from protocol.topics import ID_PATTERN

UPDATE_KIND = "update"
SAMPLE_EVENT_TYPE = "training_sample"
MAX_UPDATE_PAYLOAD_BYTES = 4 * 1024 * 1024  # raw; base64 makes it 4/3 larger, still < one 8 MiB batch
MAX_TENSORS = 256
TENSOR_NAME_PATTERN = r"^[A-Za-z0-9_.]{1,128}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
CodecName = Literal["fp32", "bfp", "topk_bfp"]  # how a gateway sends its parameters' deltas
Encoding = Literal["fp32", "bfp", "topk_bfp", "state_fp32"]
ModelKind = Literal["digits_mlp", "digits_cnn"]  # models.digits.DIGITS_MODELS
# Built-in federated architectures (models.architectures.BUILTIN_ARCHITECTURES, written out: this
# module imports no torch; a test keeps the two equal). Any other arch is a factory "pkg.mod:function".
BUILTIN_ARCHS = ("digits_mlp", "digits_cnn", "digits_bn_cnn", "scene_cnn")
FACTORY_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"
AggregatorName = Literal["fedavg", "fedprox", "fedbuff"]
RobustName = Literal["none", "median", "trimmed_mean"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorEntry(_Strict):
    name: str = Field(pattern=TENSOR_NAME_PATTERN)
    shape: list[int] = Field(max_length=8)
    encoding: Encoding
    nbytes: int = Field(ge=0)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ModelArch(_Strict):
    """The architecture both ends build, with ``models.architectures.build_architecture``: a
    built-in name (``BUILTIN_ARCHS``; ``width`` applies to the digits ones) or a factory
    ``package.module:function`` importable on the cloud and on every training gateway, called with
    no arguments. Federated models are classifiers (gateways train them with cross-entropy);
    ``input_shape`` (one sample's, no batch) is what the ONNX export feeds them: None takes the
    built-in's own, a factory must give it."""

    kind: str = Field(default="digits_mlp", max_length=200)
    width: int = Field(default=64, ge=1, le=1024)
    input_shape: list[int] | None = Field(default=None, min_length=1, max_length=4)

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in BUILTIN_ARCHS and not re.fullmatch(FACTORY_PATTERN, value):
            raise ValueError(
                f"{value!r} is neither a built-in architecture ({', '.join(BUILTIN_ARCHS)}) nor a "
                "factory 'package.module:function'"
            )
        return value

    @model_validator(mode="after")
    def _shape(self) -> ModelArch:
        if self.kind not in BUILTIN_ARCHS and self.input_shape is None:
            raise ValueError("input_shape: a factory architecture needs one sample's input shape")
        return self


class RoundConfig(_Strict):
    """How a gateway trains one local round (sent with every global model)."""

    lr: float = Field(default=0.05, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    local_epochs: int = Field(default=2, ge=1, le=100)
    batch_size: int = Field(default=16, ge=1)
    max_local_steps: int = Field(default=1000, ge=1)
    mu: float = Field(default=0.0, ge=0)  # FedProx proximal term; 0 = plain local SGD


class FederatedJob(_Strict):
    """What an operator PUTs to /v1/federated/job: the model, the aggregator and its knobs."""

    v: Literal[1] = 1
    model: str = Field(default="digits", pattern=f"^{ID_PATTERN}$")
    arch: ModelArch = ModelArch()
    seed: int = 0
    aggregator: AggregatorName = "fedbuff"
    buffer_k: int = Field(default=5, ge=1, le=10_000)  # fedbuff: aggregate once K updates arrived
    min_updates: int = Field(default=5, ge=1)  # fedavg/fedprox: updates on the current version per round
    round_timeout_s: float = Field(default=30.0, gt=0)  # fedavg/fedprox: close a round with what came
    max_staleness: int = Field(default=20, ge=0)  # fedbuff: older updates are refused
    server_lr: float = Field(default=1.0, gt=0)
    clip_norm: float | None = Field(default=None, gt=0)  # L2 clip of each update before aggregation
    robust: RobustName = "none"
    trim_fraction: float = Field(default=0.2, ge=0, lt=0.5)
    round: RoundConfig = RoundConfig()
    max_update_bytes: int = Field(default=1024 * 1024, ge=1, le=MAX_UPDATE_PAYLOAD_BYTES)
    onnx_every: int = Field(default=1, ge=0)  # export every n-th version to the model registry; 0 = never
    poll_interval_s: float = Field(default=0.5, gt=0, le=60)


class UpdateEnvelope(_Strict):
    v: Literal[1] = 1
    update_id: str = Field(pattern=f"^{ID_PATTERN}$")
    model: str = Field(pattern=f"^{ID_PATTERN}$")
    base_version: int = Field(ge=0)
    samples: int = Field(ge=1)
    local_steps: int = Field(ge=0)
    fetched_ts: float = 0.0
    trained_s: float = Field(default=0.0, ge=0)
    train_loss: float | None = None
    codec: str = Field(max_length=200)
    tensors: list[TensorEntry] = Field(min_length=1, max_length=MAX_TENSORS)
    payload_sha256: str = Field(pattern=SHA256_PATTERN)
    payload_b64: str


class GlobalModel(_Strict):
    v: Literal[1] = 1
    model: str = Field(pattern=f"^{ID_PATTERN}$")
    arch: ModelArch
    version: int = Field(ge=0)
    round: RoundConfig
    tensors: list[TensorEntry] = Field(min_length=1, max_length=MAX_TENSORS)
    payload_sha256: str = Field(pattern=SHA256_PATTERN)
    payload_b64: str


class TrainingSample(_Strict):
    """A labelled sample kept on the gateway (body of an ``event`` record, type training_sample)."""

    v: Literal[1] = 1
    type: Literal["training_sample"] = "training_sample"
    x: list[float] = Field(max_length=65_536)
    shape: list[int] = Field(max_length=4)
    y: int = Field(ge=0)


def pack_payload(sections: list[bytes]) -> tuple[str, str]:
    """(payload_b64, payload_sha256) of the sections concatenated."""
    payload = b"".join(sections)
    return base64.b64encode(payload).decode("ascii"), hashlib.sha256(payload).hexdigest()


def split_payload(
    tensors: list[TensorEntry],
    payload_b64: str,
    payload_sha256: str,
    max_bytes: int = MAX_UPDATE_PAYLOAD_BYTES,
) -> list[bytes]:
    """The raw sections, one per tensor entry (see the module invariant)."""
    if len(payload_b64) > 4 * math.ceil(max_bytes / 3):  # checked before decoding anything
        raise ProtocolError("too_large", f"payload of ~{len(payload_b64) * 3 // 4} bytes > limit {max_bytes}")
    try:
        payload = base64.b64decode(payload_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError("bad_payload", f"payload_b64 is not base64: {exc}") from None
    if len(payload) > max_bytes:
        raise ProtocolError("too_large", f"payload of {len(payload)} bytes > limit {max_bytes}")
    digest = hashlib.sha256(payload).hexdigest()
    if digest != payload_sha256:
        raise ProtocolError("digest_mismatch", f"payload sha256 {digest[:16]}... != {payload_sha256[:16]}...")
    declared = sum(t.nbytes for t in tensors)
    if declared != len(payload):
        raise ProtocolError(
            "length_mismatch", f"tensors declare {declared} bytes, payload has {len(payload)}"
        )
    sections, cursor = [], 0
    for entry in tensors:
        sections.append(payload[cursor : cursor + entry.nbytes])
        cursor += entry.nbytes
    return sections


def parse_update(body: object) -> UpdateEnvelope:
    """Validate an update record's body; ``ProtocolError("invalid", ...)`` names the bad field."""
    try:
        return UpdateEnvelope.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError("invalid", describe_validation_error(exc)) from None


def parse_global_model(data: bytes | str) -> GlobalModel:
    try:
        return GlobalModel.model_validate_json(data)
    except ValidationError as exc:
        raise ProtocolError("invalid", describe_validation_error(exc)) from None


def parse_job(data: bytes | str) -> FederatedJob:
    try:
        return FederatedJob.model_validate_json(data)
    except ValidationError as exc:
        if any(err["type"] == "json_invalid" for err in exc.errors()):
            raise ProtocolError("not_json", "job is not valid JSON") from None
        raise ProtocolError("invalid", describe_validation_error(exc)) from None
