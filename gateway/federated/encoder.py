"""UpdateEncoder: a model delta to the sections of an update payload (formats: protocol/federated.py).

Codecs: ``fp32`` (the baseline), ``bfp`` (models/numerics block floating point, every element),
``topk_bfp`` (only the largest ``topk_fraction`` of |delta + residual| per tensor, as a bit mask
plus BFP values). With ``error_feedback`` the part of the delta that was not sent (dropped by
top-k or lost to rounding) is kept locally as a residual and added to the next round's delta
(Stich et al., NeurIPS'18; Deep Gradient Compression, ICLR'18), so nothing is lost for ever,
only delayed. BFP here does not lift small values to the smallest code (``preserve_signs=False``):
nothing reads a delta's signs, and on heavy-tailed deltas the lifting made BFP-6's error 0.26
instead of 0.03 (docs/compression.md, heavy-tailed table).

Tensors named in ``state_names`` (floating buffers: BatchNorm running statistics) are values, not
deltas: they go as ``state_fp32``, exactly, whatever the codec, and never through top-k or the
error-feedback residual.

Invariant: after ``encode``, residual_new = (delta + residual_old) - decoded(sections), exactly the
value the cloud will decode (the encoder decodes its own output to compute it); a state tensor's
section decodes to its value bit for bit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import torch

from models.numerics import BfpFormat, decode, encode, to_bytes
from protocol.federated import CodecName, TensorEntry

DEFAULT_FORMAT = BfpFormat(block_size=32, mantissa_bits=6)


@dataclass(frozen=True)
class CodecSpec:
    kind: CodecName = "bfp"
    fmt: BfpFormat = DEFAULT_FORMAT
    topk_fraction: float = 0.1
    error_feedback: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.topk_fraction <= 1.0:
            raise ValueError(f"topk_fraction must be in (0, 1], got {self.topk_fraction}")

    def describe(self) -> str:
        if self.kind == "fp32":
            return "fp32"
        text = str(self.fmt) if self.kind == "bfp" else f"topk({self.topk_fraction:g})+{self.fmt}"
        return text + ("+ef" if self.error_feedback else "")


@dataclass
class UpdateEncoder:
    spec: CodecSpec = field(default_factory=CodecSpec)
    residual: dict[str, torch.Tensor] = field(default_factory=dict)

    def encode(
        self, tensors: dict[str, torch.Tensor], state_names: frozenset[str] = frozenset()
    ) -> tuple[list[TensorEntry], list[bytes]]:
        """Sections for ``tensors`` in their order: deltas, except the values named in ``state_names``."""
        entries, sections = [], []
        for name, tensor in tensors.items():
            if name in state_names:
                data = tensor.detach().reshape(-1).float().numpy().astype("<f4").tobytes()
                entries.append(
                    TensorEntry(name=name, shape=list(tensor.shape), encoding="state_fp32", nbytes=len(data))
                )
                sections.append(data)
                continue
            target = tensor.detach().reshape(-1).float()
            if self.spec.error_feedback and name in self.residual:
                target = target + self.residual[name]
            data, sent = self._section(target)
            if self.spec.error_feedback and self.spec.kind != "fp32":
                self.residual[name] = target - sent
            entries.append(
                TensorEntry(name=name, shape=list(tensor.shape), encoding=self.spec.kind, nbytes=len(data))
            )
            sections.append(data)
        return entries, sections

    def _section(self, flat: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        """(section bytes, the values the cloud will decode from them)."""
        if self.spec.kind == "fp32":
            return flat.numpy().astype("<f4").tobytes(), flat
        if self.spec.kind == "bfp":
            packed = encode(flat, self.spec.fmt, preserve_signs=False)
            return to_bytes(packed), decode(packed).reshape(-1).float()
        n = flat.numel()
        k = max(1, min(n, round(self.spec.topk_fraction * n)))
        index = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
        mask = np.zeros(n, dtype=np.uint8)
        mask[index.numpy()] = 1
        packed = encode(flat[index], self.spec.fmt, preserve_signs=False)
        sent = torch.zeros(n, dtype=torch.float32)
        sent[index] = decode(packed).reshape(-1).float()
        data = struct.pack("<I", k) + np.packbits(mask, bitorder="little").tobytes() + to_bytes(packed)
        return data, sent
