"""Bit packing of small unsigned codes into uint8 storage, vectorised (no per-element Python).

Three layouts, all exactly ceil(n*width/8) bytes:
- width 1: consecutive, little-endian bit order (code 8k+i at bit i of byte k): numpy's
  ``packbits(..., bitorder="little")``, one C pass on the CPU.
- widths 2, 4, 8 are planar: with p = 8/width codes per byte and L = ceil(n/p), byte k holds codes
  k, k+L, k+2L, ... at bit offsets 0, width, 2*width, ... (codes past n are 0). Planes are
  contiguous slices, so packing is one shift-or per plane on uint8 views.
- widths 3, 5, 6, 7: groups of eight codes form one 8*width-bit little-endian word (code i at
  bits width*i..), cut into width bytes; zero bytes past the last code are not stored. The eight
  code bytes of a group are read as one int64 and squeezed in three mask-shift-or steps.
Planar arithmetic is on uint8 (a shift left drops the bits that leave the byte). Loops run over
planes or squeeze steps (constants), never over elements.

The ``*_u8`` functions are the codec's fast path: they read/write a caller-owned uint8 buffer of
at least ``code_capacity(n)`` codes (zero past n when packing), so nothing is padded or copied.

Invariant: ``unpack_bits(pack_bits(c, w), w, len(c)) == c`` and ``len(pack_bits(c, w)) ==
ceil(len(c)*w/8)``; ``pack_u8``/``unpack_u8`` produce and accept the same bytes.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def packed_length(numel: int, width: int) -> int:
    return math.ceil(numel * width / 8)


def code_capacity(numel: int) -> int:
    """Codes a buffer must hold for ``pack_u8``/``unpack_u8``: n rounded up to a multiple of 8."""
    return 8 * math.ceil(numel / 8)


def _check(width: int, packed: torch.Tensor | None = None, numel: int = 0) -> None:
    if not 1 <= width <= 8:
        raise ValueError(f"width must be in 1..8, got {width}")
    if packed is not None and packed.numel() != packed_length(numel, width):
        raise ValueError(f"packed has {packed.numel()} bytes, {width}-bit x {numel} needs "
                         f"{packed_length(numel, width)}")


def pack_bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """Pack an integer (or bool) tensor of codes in [0, 2**width) into ceil(n*width/8) bytes."""
    _check(width)
    flat = codes.reshape(-1)
    n = flat.numel()
    if width == 1 and flat.device.type == "cpu":
        return torch.from_numpy(np.packbits(flat.numpy(), bitorder="little"))
    buffer = torch.zeros(code_capacity(n), dtype=torch.uint8, device=flat.device)
    buffer[:n] = flat
    return pack_u8(buffer, width, n)


def unpack_bits(packed: torch.Tensor, width: int, numel: int) -> torch.Tensor:
    """Inverse of ``pack_bits``: a uint8 tensor of ``numel`` codes."""
    _check(width, packed, numel)
    if width == 8:
        return packed.view(-1)
    if width == 1 and packed.device.type == "cpu":
        return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel, bitorder="little"))
    out = torch.empty(code_capacity(numel), dtype=torch.uint8, device=packed.device)
    return unpack_u8(packed, width, numel, out)[:numel]


def pack_u8(buffer: torch.Tensor, width: int, n: int) -> torch.Tensor:
    """Pack the first n uint8 codes of ``buffer`` (1-D, >= code_capacity(n), zero past n).
    Returns a new tensor owning its bytes."""
    length = packed_length(n, width)
    if width == 8:
        return buffer[:n].clone()
    if width == 1:
        if buffer.device.type == "cpu":
            return torch.from_numpy(np.packbits(buffer[:n].numpy(), bitorder="little"))
        weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=buffer.device)
        return (buffer[:code_capacity(n)].view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)
    if 8 % width == 0:
        per_byte = 8 // width
        planes = buffer[:per_byte * length].view(per_byte, length)
        out = planes[0].clone()
        shifted = torch.empty_like(out)
        for j in range(1, per_byte):
            out.bitwise_or_(torch.bitwise_left_shift(planes[j], width * j, out=shifted))
        return out
    groups = code_capacity(n) // 8
    # Each group's eight code bytes are one little-endian int64 word (code i at bit 8i); three
    # mask-shift-or steps squeeze the 8-bit lanes to w bits (pairs, quads, the whole word).
    word = buffer[:8 * groups].view(torch.int64)
    for keep, move, shift in _squeeze_masks(width):
        word = (word & keep) | ((word >> shift) & move)
    return word.view(torch.uint8).view(groups, 8)[:, :width].reshape(-1)[:length].clone()


def unpack_u8(packed: torch.Tensor, width: int, n: int, out: torch.Tensor) -> torch.Tensor:
    """Unpack n codes into ``out`` (uint8, 1-D, >= code_capacity(n)); returns ``out``.
    Positions n.. of ``out`` receive whatever the padding held (callers overwrite them)."""
    _check(width, packed, n)
    if width == 8:
        out[:n].copy_(packed)
        return out
    mask = (1 << width) - 1
    if width == 1:
        if packed.device.type == "cpu":
            out[:n].copy_(torch.from_numpy(np.unpackbits(packed.numpy(), count=n, bitorder="little")))
            return out
        shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
        bits = (packed.view(-1, 1) >> shifts) & 1
        out[:bits.numel()].copy_(bits.view(-1))
        return out
    if 8 % width == 0:
        per_byte = 8 // width
        planes = out[:per_byte * packed.numel()].view(per_byte, -1)
        for j in range(per_byte):
            torch.bitwise_right_shift(packed, width * j, out=planes[j])
            if j < per_byte - 1:
                planes[j].bitwise_and_(mask)
        return out
    groups = code_capacity(n) // 8
    words = torch.zeros(groups, 8, dtype=torch.uint8, device=packed.device)
    if packed.numel() == groups * width:
        words[:, :width] = packed.view(groups, width)
    else:  # the last group is cut short: its missing bytes are zero
        whole = torch.zeros(groups * width, dtype=torch.uint8, device=packed.device)
        whole[:packed.numel()] = packed
        words[:, :width] = whole.view(groups, width)
    word = words.view(torch.int64).view(-1)
    for keep, move, shift in reversed(_squeeze_masks(width)):
        word = (word & keep) | ((word & move) << shift)
    out[:8 * groups].copy_(word.view(torch.uint8))
    return out


def _squeeze_masks(width: int) -> list[tuple[int, int, int]]:
    """(keep, move, shift) per step: lanes of 8, 16, 32 bits holding fields of w, 2w, 4w bits become
    lanes of 16, 32, 64 bits holding fields of 2w, 4w, 8w bits: ``(x & keep) | ((x >> shift) & move)``.
    Codes are < 2**7 for w <= 7, so the int64 words stay non-negative and shifts are logical."""
    steps, field = [], width
    for lane in (8, 16, 32):
        field_mask = (1 << field) - 1
        keep = sum(field_mask << (2 * lane * j) for j in range(64 // (2 * lane)))
        move = sum(field_mask << (2 * lane * j + field) for j in range(64 // (2 * lane)))
        steps.append((keep, move, lane - field))
        field *= 2
    return steps
