"""Lossless sparse storage of a mostly-zero tensor (Gist's Sparse Storage, Dense Compute).

Stored: a 1-bit-per-element occupancy mask (bit-packed, ``models.numerics.pack_bits`` width 1)
plus the non-zero values in order. "Zero" means the all-zero bit pattern, so -0.0 and NaN are kept
as values and decoding is bit-exact. On the CPU the mask, the count, the packing and the
compaction are numpy C loops over the tensor's own memory (torch's boolean indexing is several
times slower on these sizes).

Invariant: ``decode_sparse(encode_sparse(t))`` equals ``t`` bit for bit, and
``nbytes == ceil(n/8) + nnz * itemsize``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from models.numerics import pack_bits, unpack_bits

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, eq=False)
class SparsePacked:
    shape: tuple[int, ...]
    dtype: torch.dtype
    mask: torch.Tensor  # uint8, ceil(n/8) bytes
    values: torch.Tensor  # dtype, nnz

    @property
    def nbytes(self) -> int:
        return int(self.mask.numel() + self.values.numel() * self.values.element_size())


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    return flat.view(_SAME_SIZE_INT[flat.element_size()])


def nonzero_bits(tensor: torch.Tensor) -> torch.Tensor:
    """Bool tensor: which elements have a non-zero bit pattern."""
    bits = _bits(tensor)
    if bits.device.type == "cpu":
        return torch.from_numpy(bits.numpy() != 0)
    return bits != 0


def count_nonzero_bits(tensor: torch.Tensor) -> int:
    bits = _bits(tensor)
    if bits.device.type == "cpu":
        return int(np.count_nonzero(bits.numpy()))
    return int(torch.count_nonzero(bits))


def sparse_nbytes(numel: int, nnz: int, itemsize: int) -> int:
    return math.ceil(numel / 8) + nnz * itemsize


def encode_sparse(tensor: torch.Tensor, occupied: torch.Tensor | None = None) -> SparsePacked:
    flat = tensor.detach().reshape(-1)
    occupied = nonzero_bits(flat) if occupied is None else occupied
    if flat.device.type == "cpu" and flat.dtype in (torch.float32, torch.float64, torch.float16):
        values = torch.from_numpy(np.compress(occupied.numpy(), flat.numpy()))
    else:
        values = flat[occupied]
    return SparsePacked(tuple(tensor.shape), tensor.dtype, pack_bits(occupied, 1), values)


def decode_sparse(packed: SparsePacked) -> torch.Tensor:
    n = math.prod(packed.shape)
    out = torch.zeros(n, dtype=packed.dtype, device=packed.values.device)
    if packed.mask.device.type == "cpu":
        occupied = np.unpackbits(packed.mask.numpy(), count=n, bitorder="little").view(np.bool_)
        out.index_copy_(0, torch.from_numpy(np.flatnonzero(occupied)), packed.values)
    else:
        out[unpack_bits(packed.mask, 1, n).bool()] = packed.values
    return out.view(packed.shape)
