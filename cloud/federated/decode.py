"""Decoding a gateway's update into a flat delta, refusing anything malformed (errors as values).

The section encodings are specified in protocol/federated.py (the gateway's encoder is
gateway/federated/encoder.py). A refusal is a ``Refused(reason, detail)`` value the coordinator counts
by reason; nothing here raises for bad input.

The flat result holds deltas for parameters and values for the layout's state tensors (floating
buffers), which must come as ``state_fp32`` (and nothing else may): a running variance is
checked, and an update holding a negative one is refused (``negative_variance``, naming the buffer).

Invariant: ``decode_update`` returns a tensor only if every tensor entry names the layout's tensor
in order with its shape and the encoding its kind allows, every section decodes to exactly that
many finite values, no running variance is negative, and the payload passed
``protocol.federated.split_payload``'s size and digest checks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

from cloud.federated.layout import Layout
from models.numerics import WireFormatError, decode, from_bytes
from protocol.errors import ProtocolError
from protocol.federated import TensorEntry, UpdateEnvelope, split_payload


@dataclass(frozen=True)
class Refused:
    reason: str  # stable token: invalid, too_large, digest_mismatch, wrong_model, bad_tensor, ...
    detail: str


def _section(entry: TensorEntry, data: bytes) -> torch.Tensor:
    """One section to a flat float32 tensor of entry.numel values; ValueError if malformed."""
    n = entry.numel
    if entry.encoding in ("fp32", "state_fp32"):
        if len(data) != 4 * n:
            raise ValueError(f"fp32 section of {len(data)} bytes for {n} values")
        return torch.from_numpy(np.frombuffer(data, dtype="<f4").copy())
    if entry.encoding == "bfp":
        values = decode(from_bytes(data)).reshape(-1).float()
        if values.numel() != n:
            raise ValueError(f"bfp section holds {values.numel()} values, shape needs {n}")
        return values
    mask_bytes = (n + 7) // 8
    if len(data) < 4 + mask_bytes:
        raise ValueError(f"topk section of {len(data)} bytes is shorter than its count and mask")
    (k,) = struct.unpack_from("<I", data, 0)
    mask = np.unpackbits(np.frombuffer(data, dtype=np.uint8, count=mask_bytes, offset=4), bitorder="little")
    if mask[n:].any():
        raise ValueError("topk mask has bits set past the tensor's end")
    index = torch.from_numpy(np.flatnonzero(mask[:n]))
    if index.numel() != k:
        raise ValueError(f"topk count {k} != {index.numel()} bits set in the mask")
    values = decode(from_bytes(data[4 + mask_bytes :])).reshape(-1).float()
    if values.numel() != k:
        raise ValueError(f"topk section has {k} kept elements but {values.numel()} values")
    out = torch.zeros(n, dtype=torch.float32)
    out[index] = values
    return out


def decode_update(
    envelope: UpdateEnvelope, model: str, layout: Layout, max_bytes: int
) -> torch.Tensor | Refused:
    if envelope.model != model:
        return Refused("wrong_model", f"update for model {envelope.model!r}, the job trains {model!r}")
    try:  # size first (before anything is decoded), then digest and lengths
        sections = split_payload(envelope.tensors, envelope.payload_b64, envelope.payload_sha256, max_bytes)
    except ProtocolError as exc:
        return Refused(exc.reason, exc.detail)
    names = tuple(t.name for t in envelope.tensors)
    shapes = tuple(tuple(t.shape) for t in envelope.tensors)
    if names != layout.names or shapes != layout.shapes:
        return Refused(
            "bad_tensor",
            f"tensors {list(zip(names, shapes, strict=False))[:4]}... do not match the global model's layout",
        )
    parts = []
    for entry, data in zip(envelope.tensors, sections, strict=True):
        if (entry.encoding == "state_fp32") != (entry.name in layout.state_names):
            kind = (
                "a buffer, sent as its value" if entry.name in layout.state_names else "a parameter's delta"
            )
            return Refused("bad_tensor", f"{entry.name} is {kind}: encoding {entry.encoding} does not fit")
        try:
            parts.append(_section(entry, data))
        except (ValueError, WireFormatError, RuntimeError, struct.error) as exc:
            return Refused("bad_tensor", f"{entry.name} ({entry.encoding}): {exc}")
    flat = torch.cat(parts)
    if not bool(torch.isfinite(flat).all()):
        return Refused("not_finite", "the update holds NaN or infinite values")
    for entry, values in zip(envelope.tensors, parts, strict=True):
        if entry.name in layout.variance_names and bool((values < 0).any()):
            worst = int(values.argmin())
            return Refused(
                "negative_variance",
                f"{entry.name}[{worst}] = {float(values[worst]):.4g}: a running variance cannot be negative",
            )
    return flat
