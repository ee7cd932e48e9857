"""One saved tensor as the pack hook stores it on its own (not in a layer call's BFP group): as
it is, Gist's sparse form, or a mask as one bit per element; and how backward reads it back.

Invariant: ``Stored.unpack`` returns the very tensor that was stored (bit for bit: the lossless
kinds are exact, "raw" is the tensor itself), and ``nbytes`` is what the stored form holds.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from cloud.training.compression.sparse import SparsePacked, decode_sparse
from models.numerics import Packed, fused_kernels, pack_bits, packed_length, unpack_bits

StoredKind = Literal["raw", "bfp", "sparse", "bits"]  # as-is, Packed, SparsePacked, a bool tensor as bits


class Stored:
    """What the pack hook hands autograd: an encoded (or raw) saved tensor."""

    __slots__ = ("kind", "payload", "nbytes", "shape", "scale", "users", "decoded", "owner", "__weakref__")

    def __init__(
        self,
        kind: StoredKind,
        payload: torch.Tensor | Packed | SparsePacked,
        nbytes: int,
        shape: torch.Size | None = None,  # "bits": the mask's shape
        scale: float | None = None,  # "bits" of a float mask: its one non-zero value (None: bool)
    ) -> None:
        self.kind, self.payload, self.nbytes, self.shape, self.scale = kind, payload, nbytes, shape, scale
        self.users = 1  # saved-tensor slots that hold this encoding and have not unpacked it yet
        self.decoded: torch.Tensor | None = None
        self.owner: Any = None  # whose live_bytes count it (an ActivationCompressor)

    def __del__(self) -> None:  # cheaper than a weakref.finalize per saved tensor
        if self.owner is not None:
            self.owner.live_bytes -= self.nbytes

    def unpack(self) -> torch.Tensor:
        """The tensor as backward reads it (a sparse encoding is decoded once for all its users)."""
        payload = self.payload
        if self.kind == "bits":
            assert isinstance(payload, torch.Tensor) and self.shape is not None
            if self.scale is not None and payload.device.type == "cpu":
                mask = torch.empty(self.shape, dtype=torch.float32)
                fused_kernels().unpack_mask(payload.numpy(), self.scale, mask.view(-1).numpy())
                return mask
            codes = unpack_bits(payload, 1, math.prod(self.shape)).view(self.shape)
            if self.scale is None:
                return codes.view(torch.bool)
            return codes.to(torch.float32).mul_(self.scale)
        if isinstance(payload, torch.Tensor):  # kept as it was ("raw")
            return payload
        decoded = self.decoded
        if decoded is None:
            assert isinstance(payload, SparsePacked)
            decoded = decode_sparse(payload)
        self.users -= 1
        self.decoded = decoded if self.users > 0 else None
        return decoded


def as_bits(tensor: torch.Tensor, dropout: bool) -> Stored | None:
    """A bool tensor, or the float32 mask a CPU ``nn.Dropout`` saves (``dropout``: every element 0
    or the one value 1/(1-p), by construction; its maximum is that value, so decoding reproduces
    it bit for bit), as one bit per element; ``None`` for anything else. Not checked element by
    element: a bool comparison of a 64 Ki tensor costs ~0.2 ms on a CPU (tests check the
    gradients bit-identical)."""
    if tensor.dtype == torch.bool:
        mask, scale = tensor, None
    elif dropout and tensor.dtype == torch.float32 and tensor.device.type == "cpu":
        # One compiled pass (fused.py): the bits and the maximum.
        bits = torch.empty(packed_length(tensor.numel(), 1), dtype=torch.uint8)
        scale = float(fused_kernels().pack_mask(tensor.detach().contiguous().view(-1).numpy(), bits.numpy()))
        return Stored("bits", bits, bits.numel(), tensor.shape, scale) if scale > 0 else None
    elif dropout and tensor.dtype == torch.float32:
        scale = float(tensor.max())
        if not scale > 0:
            return None
        mask = tensor != 0
    else:
        return None
    bits = pack_bits(mask.reshape(-1).view(torch.uint8), 1)
    return Stored("bits", bits, bits.numel(), tensor.shape, scale)


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
