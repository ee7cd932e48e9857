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

The ``*_u8`` functions read/write a caller-owned uint8 buffer of at least ``code_capacity(n)`` codes
(zero past n when packing), so nothing is padded or copied. The codec's own fast path is
``pack_signed``/``unpack_signed``: codes as float32 values ``q`` in [-offset, offset] (the stored
code is q + offset), so the codec never makes a separate integer pass. Why the operations are the
ones they are (measured on one CPU thread): uint8 shifts are not vectorised in torch (several
times an add), so planar packing adds planes with ``alpha = 2**(width*j)``; unpacking shifts whole
int32 words (four codes at once); widths 3 and 6 pack with one matrix-vector product (the 24-bit
word of 8 or 4 codes is an exact float32 integer), and width 3 unpacks with one gather from a
table indexed by 12-bit half words (width 6 keeps the int64 squeeze, measured faster).

Invariant: ``unpack_bits(pack_bits(c, w), w, len(c)) == c`` and ``len(pack_bits(c, w)) ==
ceil(len(c)*w/8)``; ``pack_u8``/``unpack_u8`` and ``pack_signed``/``unpack_signed`` produce and
accept the same bytes.
"""

from __future__ import annotations

import functools
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
        raise ValueError(
            f"packed has {packed.numel()} bytes, {width}-bit x {numel} needs {packed_length(numel, width)}"
        )


def pack_bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """Pack an integer (or bool) tensor of codes in [0, 2**width) into ceil(n*width/8) bytes."""
    _check(width)
    flat = codes.reshape(-1)
    n = flat.numel()
    if width == 1 and flat.device.type == "cpu":
        return torch.from_numpy(np.packbits(flat.numpy(), bitorder="little"))
    if 8 % width == 0 and n % (8 // width) == 0 and flat.dtype == torch.uint8 and n:
        return pack_u8(flat, width, n)  # whole planes: pack_u8 reads no padding
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
    """Pack the first n uint8 codes of ``buffer`` (1-D, >= code_capacity(n), zero past n; planar
    widths read only the first ``8/width * ceil(n*width/8)``). Returns a new tensor owning its bytes."""
    length = packed_length(n, width)
    if width == 8:
        return buffer[:n].clone()
    if width == 1:
        if buffer.device.type == "cpu":
            return torch.from_numpy(np.packbits(buffer[:n].numpy(), bitorder="little"))
        weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=buffer.device)
        return (buffer[: code_capacity(n)].view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)
    if 8 % width == 0:
        per_byte = 8 // width
        planes = buffer[: per_byte * length].view(per_byte, length)
        out = torch.add(planes[0], planes[1], alpha=1 << width)  # codes < 2**width: no carries
        for j in range(2, per_byte):
            out.add_(planes[j], alpha=1 << (width * j))
        return out
    groups = code_capacity(n) // 8
    # Each group's eight code bytes are one little-endian int64 word (code i at bit 8i); three
    # mask-shift-or steps squeeze the 8-bit lanes to w bits (pairs, quads, the whole word).
    word = buffer[: 8 * groups].view(torch.int64)
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
        out[: bits.numel()].copy_(bits.view(-1))
        return out
    if 8 % width == 0:
        per_byte = 8 // width
        length = packed.numel()
        planes = out[: per_byte * length].view(per_byte, length)
        if length and length % 4 == 0 and packed.is_contiguous() and packed.storage_offset() % 4 == 0:
            # Four bytes per int32 word; the mask keeps each byte's field, so no bits cross bytes.
            words, planes = packed.view(torch.int32), planes.view(torch.int32)
            lane_mask = mask * 0x01010101
        else:
            words, lane_mask = packed, mask
        for j in range(per_byte):
            if j == 0:
                torch.bitwise_and(words, lane_mask, out=planes[0])
            else:
                torch.bitwise_right_shift(words, width * j, out=planes[j])
                if j < per_byte - 1:
                    planes[j].bitwise_and_(lane_mask)
                elif words is not packed:
                    planes[j].bitwise_and_(lane_mask)  # an int32 shift brings in the next byte's bits
        return out
    groups = code_capacity(n) // 8
    words = torch.zeros(groups, 8, dtype=torch.uint8, device=packed.device)
    if packed.numel() == groups * width:
        words[:, :width] = packed.view(groups, width)
    else:  # the last group is cut short: its missing bytes are zero
        whole = torch.zeros(groups * width, dtype=torch.uint8, device=packed.device)
        whole[: packed.numel()] = packed
        words[:, :width] = whole.view(groups, width)
    word = words.view(torch.int64).view(-1)
    for keep, move, shift in reversed(_squeeze_masks(width)):
        word = (word & keep) | ((word & move) << shift)
    out[: 8 * groups].copy_(word.view(torch.uint8))
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


_WORD_CODES = {3: 8, 6: 4}  # widths whose codes fill whole 24-bit words: codes per word


def pack_signed(q: torch.Tensor, width: int, n: int, offset: int, scratch_u8: torch.Tensor) -> torch.Tensor:
    """Pack float32 codes ``q`` (1-D, >= code_capacity(n) values, integral, q + offset in
    [0, 2**width), anything past n) as the codes ``q + offset``; same bytes as ``pack_bits``.
    ``q[n:]`` may be overwritten; ``scratch_u8`` holds >= code_capacity(n) bytes."""
    capacity = code_capacity(n)
    if width in _WORD_CODES:
        per_word = _WORD_CODES[width]
        if capacity != n:
            q[n:capacity].fill_(-offset)  # stored code 0 past n
        weights = _word_weights(width, q.device)
        # Exact: integers below 2**24 in float32, whatever the order of the sums.
        offsets = offset * ((1 << (width * per_word)) - 1) // ((1 << width) - 1)  # offset in every field
        words = torch.mv(q[:capacity].view(-1, per_word), weights).add_(offsets)
        as_bytes = words.to(torch.int32).view(torch.uint8).view(-1, 4)[:, :3]
        return as_bytes.reshape(-1)[: packed_length(n, width)].clone()
    per_byte = 8 // width
    if width in (2, 4) and n % per_byte == 0 and n:
        # Combine the signed planes first (sum of q_j * 2**(width*j) fits int8), then add every
        # plane's offset at once on the uint8 view (mod 256: the bytes of the offset codes).
        signed = scratch_u8[:n].view(torch.int8)
        signed.copy_(q[:n])  # exact: integral values in [-127, 127]
        planes = signed.view(per_byte, n // per_byte).unbind(0)
        out = torch.add(planes[0], planes[1], alpha=1 << width)
        for j in range(2, per_byte):
            out.add_(planes[j], alpha=1 << (width * j))
        return out.view(torch.uint8).add_(offset * sum(1 << (width * j) for j in range(per_byte)))
    codes = scratch_u8[:capacity]
    codes.view(torch.int8)[:n].copy_(q[:n])  # exact: integral values in [-127, 127]
    codes[:n].add_(offset)  # uint8 wraps: q + offset in [0, 254]
    if capacity != n:
        codes[n:].zero_()
    return pack_u8(codes, width, n)


def unpack_signed(
    packed: torch.Tensor, width: int, n: int, offset: int, out: torch.Tensor, scratch_u8: torch.Tensor
) -> torch.Tensor:
    """Inverse of ``pack_signed``: ``out[:n]`` (float32, >= code_capacity(n)) receives code - offset;
    positions n.. receive whatever the padding held. Returns ``out``."""
    _check(width, packed, n)
    capacity = code_capacity(n)
    if width == 3:  # (width 6: the squeeze below measured faster than a gather of n/2 entries)
        per_word = _WORD_CODES[width]
        words = scratch_u8[: 4 * capacity // per_word].view(-1, 4)
        whole = packed.numel() // 3
        words[:whole, :3] = packed[: 3 * whole].view(whole, 3)
        words[:, 3] = 0
        if whole < words.shape[0]:  # the last word is cut short: its missing bytes are zero
            words[whole:, :3] = 0
            tail = packed[3 * whole :]
            words[whole, : tail.numel()] = tail
        # Each 24-bit word is two 12-bit halves; a 4096-entry table turns a half into its codes,
        # one per byte, so one gather yields the codes in order.
        word = words.view(torch.int32).view(-1)
        halves = torch.empty(word.numel(), 2, dtype=torch.int32, device=packed.device)
        torch.bitwise_and(word, 0xFFF, out=halves[:, 0])
        torch.bitwise_right_shift(word, 12, out=halves[:, 1])
        codes = _half_word_table(width, packed.device).index_select(0, halves.view(-1)).view(torch.int8)
        torch.sub(codes, offset, out=out[:capacity])  # codes < 64: no int8 overflow
        return out
    codes = unpack_u8(packed, width, n, scratch_u8)
    if width < 8:  # codes < 128: as int8 the subtraction cannot overflow
        torch.sub(codes[:capacity].view(torch.int8), offset, out=out[:capacity])
    else:
        out[:n].copy_(codes[:n])
        out[:n].sub_(offset)
    return out


@functools.lru_cache(maxsize=8)
def _word_weights(width: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([float(1 << (width * i)) for i in range(_WORD_CODES[width])], device=device)


@functools.lru_cache(maxsize=8)
def _half_word_table(width: int, device: torch.device) -> torch.Tensor:
    """12-bit half word -> its four 3-bit codes, code i in byte i of an int32."""
    halves = torch.arange(1 << 12, dtype=torch.int64)
    codes = (((halves >> (width * i)) & ((1 << width) - 1)) << (8 * i) for i in range(12 // width))
    value = sum(codes, torch.zeros_like(halves))
    return value.to(torch.int32).to(device)
