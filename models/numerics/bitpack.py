"""Bit packing of small unsigned codes into uint8 storage, vectorised (no per-element Python).

Two layouts, both exactly ceil(n*width/8) bytes:
- widths dividing 8 (1, 2, 4, 8) are planar: with p = 8/width codes per byte and L = ceil(n/p),
  byte k holds codes k, k+L, k+2L, ... at bit offsets 0, width, 2*width, ... (codes past n are 0).
  Planes are contiguous slices, so packing and unpacking never touch strided memory.
- widths 3, 5, 6, 7: groups of eight codes form one 8*width-bit little-endian word (code i at
  bits width*i..), cut into width bytes; zero bytes past the last code are not stored.
Loops below run over the planes or bytes of one code (constants), never over elements.

Invariant: ``unpack_bits(pack_bits(c, w), w, len(c)) == c`` and ``len(pack_bits(c, w)) ==
ceil(len(c)*w/8)``; the ``*_float_codes`` variants produce and accept the same bytes.
"""

from __future__ import annotations

import math

import torch


def packed_length(numel: int, width: int) -> int:
    return math.ceil(numel * width / 8)


def _check(width: int, packed: torch.Tensor | None = None, numel: int = 0) -> None:
    if not 1 <= width <= 8:
        raise ValueError(f"width must be in 1..8, got {width}")
    if packed is not None and packed.numel() != packed_length(numel, width):
        raise ValueError(f"packed has {packed.numel()} bytes, {width}-bit x {numel} needs "
                         f"{packed_length(numel, width)}")


def _planes(flat: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    per_byte = 8 // width
    length = math.ceil(flat.numel() / per_byte)
    if flat.numel() == per_byte * length and flat.dtype == dtype:
        return flat.view(per_byte, length)
    padded = torch.zeros(per_byte * length, dtype=dtype, device=flat.device)
    padded[:flat.numel()] = flat
    return padded.view(per_byte, length)


def pack_bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """Pack an integer tensor of codes in [0, 2**width) into ceil(n*width/8) bytes (uint8, 1-D)."""
    _check(width)
    flat = codes.reshape(-1)
    if width == 8:
        return flat.to(torch.uint8) if flat.dtype != torch.uint8 else flat.clone()
    if 8 % width == 0:
        planes = _planes(flat, width, torch.uint8)
        out = planes[0].clone()
        for j in range(1, planes.shape[0]):
            out |= planes[j] << (width * j)
        return out
    n = flat.numel()
    n_groups = math.ceil(n / 8)
    groups = torch.zeros(n_groups * 8, dtype=torch.int64, device=flat.device)
    groups[:n] = flat
    shifts = torch.arange(8, dtype=torch.int64, device=flat.device) * width
    words = (groups.view(n_groups, 8) << shifts).sum(dim=1)  # disjoint bits, < 2**56
    out = torch.empty(n_groups, width, dtype=torch.uint8, device=flat.device)
    for byte in range(width):
        out[:, byte] = (words >> (8 * byte)) & 0xFF
    return out.view(-1)[:packed_length(n, width)]


def unpack_bits(packed: torch.Tensor, width: int, numel: int) -> torch.Tensor:
    """Inverse of ``pack_bits``: a uint8 tensor of ``numel`` codes."""
    _check(width, packed, numel)
    if width == 8:
        return packed.view(-1)
    mask = (1 << width) - 1
    if 8 % width == 0:
        planes = [(packed >> (width * j)) & mask for j in range(8 // width)]
        return torch.cat(planes)[:numel]
    n_groups = math.ceil(numel / 8)
    rows = torch.zeros(n_groups, width, dtype=torch.int64, device=packed.device)
    rows.view(-1)[:packed.numel()] = packed
    words = rows[:, 0].clone()
    for byte in range(1, width):
        words |= rows[:, byte] << (8 * byte)
    shifts = torch.arange(8, dtype=torch.int64, device=packed.device) * width
    return ((words.unsqueeze(1) >> shifts) & mask).to(torch.uint8).view(-1)[:numel]


def pack_float_codes(codes: torch.Tensor, width: int) -> torch.Tensor:
    """``pack_bits`` for codes held as integral float32 values (the codec's intermediate form).
    For widths dividing 8 each byte is formed in float (exact, < 256) and converted once."""
    _check(width)
    flat = codes.reshape(-1)
    if width == 8:
        return flat.to(torch.uint8)
    if 8 % width:
        return pack_bits(flat.to(torch.uint8), width)
    planes = _planes(flat, width, torch.float32)
    out = planes[0].clone()
    for j in range(1, planes.shape[0]):
        out.add_(planes[j], alpha=float(1 << (width * j)))
    return out.to(torch.uint8)


def unpack_float_codes(packed: torch.Tensor, width: int, numel: int) -> torch.Tensor:
    """``unpack_bits`` returning float32 codes (what decoding multiplies anyway)."""
    _check(width, packed, numel)
    if width == 8 or 8 % width:
        return unpack_bits(packed, width, numel).to(torch.float32)
    rest = packed.to(torch.float32)
    planes = []
    for _ in range(8 // width - 1):  # peel the lowest code off each byte
        high = torch.floor(rest * (1.0 / (1 << width)))
        planes.append(rest - high * (1 << width))
        rest = high
    planes.append(rest)
    return torch.cat(planes)[:numel]
