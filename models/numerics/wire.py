"""The wire form of a ``Packed``: one self-describing byte string / uint8 tensor.

Layout (little-endian), also in docs/compression.md:
    header  := magic "EBFP" | version u8 | dtype u8 | ndim u8 | fmt_len u16 | n_side u32
               | shape u64 * ndim | fmt text (utf-8, ``str(BfpFormat)``)
    payload := mantissas | exponents | side_index (int32) | side_value (dtype)
The payload section lengths follow from the header (``packed_nbytes``), so the total length is
checked, and a short or long buffer is rejected with ``WireFormatError``.

Over torch.distributed the receiver must know the length first: send
``torch.tensor([t.numel()])`` (int64) and then the uint8 tensor from ``pack_for_wire``.

Devices: the wire tensor lives where the packed storage lives (a GPU's packed tensor stays on the
GPU, so NCCL can send it); unpacking reads only the header on the host (its fields decide the
section sizes) and leaves the sections on the wire tensor's device.

Invariant: ``unpack_from_wire(pack_for_wire(p))`` and ``from_bytes(to_bytes(p))`` decode to the
same tensor as ``p``, bit for bit.
"""

from __future__ import annotations

import math
import struct

import torch

from models.numerics.bitpack import packed_length
from models.numerics.codec import Packed
from models.numerics.format import BfpFormat

MAGIC = b"EBFP"
VERSION = 1
_FIXED = struct.Struct("<4sBBBHI")
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
_DTYPE_BY_CODE = {code: dtype for dtype, code in _DTYPES.items()}


class WireFormatError(ValueError):
    """The bytes are not a valid packed tensor (truncated, wrong magic/version, bad lengths)."""


def _header(packed: Packed) -> bytes:
    fmt_text = str(packed.fmt).encode()
    if packed.dtype not in _DTYPES:
        raise TypeError(f"no wire code for dtype {packed.dtype}")
    ndim = len(packed.shape)
    fixed = _FIXED.pack(MAGIC, VERSION, _DTYPES[packed.dtype], ndim, len(fmt_text), packed.n_side)
    return fixed + struct.pack(f"<{len(packed.shape)}Q", *packed.shape) + fmt_text


def pack_for_wire(packed: Packed) -> torch.Tensor:
    """One contiguous uint8 tensor on the mantissas' device: header followed by the payload sections."""
    device = packed.mantissas.device
    header = torch.frombuffer(bytearray(_header(packed)), dtype=torch.uint8).to(device)
    parts = [
        header,
        packed.mantissas,
        packed.exponents.to(device),
        packed.side_index.to(device).contiguous().view(torch.uint8),
        packed.side_value.to(device).contiguous().view(torch.uint8),
    ]
    return torch.cat(parts)


def unpack_from_wire(wire: torch.Tensor) -> Packed:
    if wire.dtype != torch.uint8 or wire.dim() != 1:
        raise WireFormatError(f"expected a 1-D uint8 tensor, got {wire.dtype} with {wire.dim()} dims")
    if wire.numel() < _FIXED.size:
        raise WireFormatError(f"{wire.numel()} bytes is shorter than the {_FIXED.size}-byte header")
    magic, version, dtype_code, ndim, fmt_len, n_side = _FIXED.unpack(_host_bytes(wire[: _FIXED.size]))
    if magic != MAGIC or version != VERSION:
        raise WireFormatError(f"bad magic/version {magic!r}/{version}")
    if dtype_code not in _DTYPE_BY_CODE:
        raise WireFormatError(f"unknown dtype code {dtype_code}")
    dtype = _DTYPE_BY_CODE[dtype_code]
    offset = _FIXED.size
    header_end = offset + 8 * ndim + fmt_len
    if wire.numel() < header_end:
        raise WireFormatError("truncated header")
    variable = _host_bytes(wire[offset:header_end])  # shape and format text: one more copy to the host
    shape = struct.unpack(f"<{ndim}Q", variable[: 8 * ndim])
    try:
        fmt = BfpFormat.parse(variable[8 * ndim :].decode())
    except (UnicodeDecodeError, ValueError) as err:
        raise WireFormatError(f"bad format text: {err}") from err
    numel = math.prod(shape)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    sizes = [
        packed_length(numel, fmt.mantissa_bits),
        packed_length(max(1, math.ceil(numel / fmt.block_size)), fmt.exponent_bits),
        4 * n_side,
        itemsize * n_side,
    ]
    if wire.numel() != header_end + sum(sizes):
        raise WireFormatError(f"length {wire.numel()} != header {header_end} + payload {sum(sizes)}")
    sections, cursor = [], header_end
    for size in sizes:
        sections.append(wire[cursor : cursor + size].clone())  # clone: aligned, owns its memory
        cursor += size
    return Packed(
        fmt=fmt,
        shape=tuple(shape),
        dtype=dtype,
        mantissas=sections[0],
        exponents=sections[1],
        side_index=sections[2].view(torch.int32),
        side_value=sections[3].view(dtype),
    )


def _host_bytes(part: torch.Tensor) -> bytes:
    return part.cpu().numpy().tobytes()


def to_bytes(packed: Packed) -> bytes:
    return _host_bytes(pack_for_wire(packed))


def from_bytes(data: bytes) -> Packed:
    return unpack_from_wire(torch.frombuffer(bytearray(data), dtype=torch.uint8))
