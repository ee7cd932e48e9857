"""Fused CPU kernels for the common BFP case: a few compiled passes instead of ~10 torch ops.

The torch codec (``codec.py``) pays 10-25 us of dispatch per op and one memory pass per op; on a
small CNN's activations that is most of the cost of compressing them. These numba kernels do the
same arithmetic in compiled loops: block maxima, shared exponents and codes in one pass over the
tensor, then the bit packing; on decode, unpacking, then scaling block by block.

Covered (``covers``): float32 CPU tensors in blocks of ``BLOCK_SIZE`` (32, the default; a constant
so that the compiler unrolls and vectorises the per-block loops), uniform levels, nearest
rounding, 8 exponent bits, no outliers. Everything else (log levels, stochastic rounding,
outliers, other block sizes, devices or dtypes) stays on the torch path, and so does a tensor
holding a non-finite value: ``encode_into`` reports it instead of encoding.

Why the loops look as they do: magnitudes are compared as int32 bit patterns (for non-negative
floats the integer order is the float order, and a pattern >= 0x7F800000 is inf or NaN), which
vectorises where a float max with NaN semantics does not; rounding to nearest even is the
float32 add-and-subtract of 1.5 * 2**23 (codes are far below 2**22), which is what ``torch.round``
computes.

Also here, for the trainer's hooks: a float32 dropout mask (0 or one value 1/(1-p)) as one bit
per element (``pack_mask``, ``unpack_mask``), the layout of ``bitpack.pack_bits(..., 1)``: one
pass each instead of a max, a bool comparison (slow on CPU torch), numpy's packbits, then a
conversion and a multiply on the way back.

Invariant: for every input they accept, the kernels produce the torch path's bytes (the same
exponents, float32 products, round half to even, and the packed layouts of ``bitpack.py``: planar
for widths 1, 2, 4 and 8, a little-endian bit stream for the others), and decode produces the same
float32 values. tests/numerics/test_fused.py checks both, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.numerics.format import BfpFormat

BLOCK_SIZE = 32
_ROUNDING_MAGIC = np.float32(1.5 * 2**23)
_SMALLEST_NORMAL_BITS = 0x00800000
_NON_FINITE_BITS = 0x7F800000
_SUBNORMAL_UNIT = 2.0**-149  # the value of bit pattern 1


def covers(fmt: BfpFormat) -> bool:
    """Whether the kernels implement ``fmt`` (for float32 CPU tensors)."""
    return (
        fmt.block_size == BLOCK_SIZE
        and fmt.levels == "uniform"
        and fmt.rounding == "nearest"
        and fmt.exponent_bits == 8
        and fmt.outlier_fraction == 0.0
    )


@njit(cache=True, nogil=True)
def _frexp_exponent(top_bits):
    """The exponent ``torch.frexp`` gives for the non-negative float32 with these bits."""
    if top_bits >= _SMALLEST_NORMAL_BITS:
        return (top_bits >> 23) - 126
    if top_bits == 0:
        return 0
    return math.frexp(np.float64(top_bits) * _SUBNORMAL_UNIT)[1]


@njit(cache=True, nogil=True)
def _encode_codes(x, max_code, exponent_floor, exponent_high, exponent_low, encode_scales, exponents, codes):
    """Exponent codes (E - exponent_low) per block and stored codes (code + max_code) per element;
    False as soon as a block holds a non-finite value. The tail block reads zeros past the end
    (``x`` is padded by the caller). Sign-preserving: a non-zero value never gets the zero code."""
    bits = x.view(np.int32)
    top_code = np.int32(max_code)
    for block in range(exponents.shape[0]):
        start = block * BLOCK_SIZE
        # Slices, not offsets: numba then drops its negative-index checks and vectorises the loops.
        end = start + BLOCK_SIZE
        words, values, out = bits[start:end], x[start:end], codes[start:end]
        top = np.int32(0)
        for j in range(BLOCK_SIZE):
            top = max(top, words[j] & np.int32(0x7FFFFFFF))
        if top >= _NON_FINITE_BITS:
            return False
        exponent = min(max(_frexp_exponent(top), exponent_floor), exponent_high)
        exponents[block] = exponent - exponent_low
        scale = encode_scales[exponent - exponent_low]
        for j in range(BLOCK_SIZE):
            word = words[j]
            q = np.int32((abs(values[j]) * scale + _ROUNDING_MAGIC) - _ROUNDING_MAGIC)
            q = min(max(q, np.int32(1)), top_code)
            q = q if (word & np.int32(0x7FFFFFFF)) != 0 else np.int32(0)
            out[j] = np.uint8(top_code - q if word < 0 else top_code + q)
    return True


@njit(cache=True, nogil=True)
def pack_codes(codes, n, width, mantissas):
    """``bitpack`` layouts. Planar (width divides 8): byte k holds codes k, k + L, k + 2L, ... (L =
    len(mantissas); codes past n are 0). Otherwise a little-endian stream (code i at bit width*i)."""
    length = mantissas.shape[0]
    if 8 % width == 0:
        mantissas[:] = 0
        for plane in range(8 // width):
            start = plane * length
            count = max(0, min(length, n - start))
            source, shift = codes[start : start + count], np.uint8(width * plane)
            for k in range(count):
                mantissas[k] |= source[k] << shift
        return
    buffer, filled, out = np.int64(0), 0, 0
    for i in range(n):
        buffer |= np.int64(codes[i]) << filled
        filled += width
        if filled >= 8:
            mantissas[out] = np.uint8(buffer & 0xFF)
            buffer >>= 8
            filled -= 8
            out += 1
    if out < length:
        mantissas[out] = np.uint8(buffer & 0xFF)


@njit(cache=True, nogil=True)
def encode_into(
    x, n, width, max_code, exponent_floor, exponent_high, exponent_low, encode_scales, exponents, mantissas
):
    """Encode the first ``n`` elements of float32 ``x`` (zero-padded to whole blocks) into
    ``exponents`` (uint8, one per block) and ``mantissas`` (uint8, ceil(n * width / 8) bytes).
    Returns False, outputs unspecified, if an element is not finite."""
    codes = np.empty(x.shape[0], dtype=np.uint8)
    if not _encode_codes(
        x, max_code, exponent_floor, exponent_high, exponent_low, encode_scales, exponents, codes
    ):
        return False
    pack_codes(codes, n, width, mantissas)
    return True


@njit(cache=True, nogil=True)
def unpack_planes(mantissas, n, width, codes):
    mask = np.uint8((1 << width) - 1)
    length = mantissas.shape[0]
    for plane in range(8 // width):
        start = plane * length
        count = max(0, min(length, n - start))
        source, target, shift = mantissas[:count], codes[start : start + count], np.uint8(width * plane)
        for k in range(count):  # slices, not offsets: numba then drops the negative-index checks
            target[k] = (source[k] >> shift) & mask


@njit(cache=True, nogil=True)
def _unpack_stream(mantissas, n, width, codes):
    mask = np.int64((1 << width) - 1)
    buffer, filled, read = np.int64(0), 0, 0
    for i in range(n):
        if filled < width:
            buffer |= np.int64(mantissas[read]) << filled
            read += 1
            filled += 8
        codes[i] = np.uint8(buffer & mask)
        buffer >>= width
        filled -= width


@njit(cache=True, nogil=True)
def decode_into(mantissas, exponents, n, width, offset, decode_scales, out):
    """``out[:n]`` (float32; ``out`` holds n rounded up to whole blocks, the rest is left as it
    was) = (code - offset) * the block's scale, unpacking the ``pack_codes`` layout."""
    if width == 8:
        codes = mantissas
    else:
        codes = np.empty(out.shape[0], dtype=np.uint8)
        if 8 % width == 0:
            unpack_planes(mantissas, n, width, codes)
        else:
            _unpack_stream(mantissas, n, width, codes)
    for block in range(exponents.shape[0]):
        start = block * BLOCK_SIZE
        source, target = codes[start : start + BLOCK_SIZE], out[start : start + BLOCK_SIZE]
        scale, shifted = decode_scales[exponents[block]], np.float32(offset)
        for j in range(min(BLOCK_SIZE, n - start)):
            target[j] = (np.float32(source[j]) - shifted) * scale


@njit(cache=True, nogil=True)
def pack_mask(x, bits):
    """Bit i of ``bits`` (little-endian within each byte, ``np.packbits(..., bitorder="little")``)
    set where float32 ``x[i] != 0``; returns the largest element (0.0 if none is positive), NaN if
    any is NaN. On int32 bit
    patterns, as ``_encode_codes`` (their order is the float order among positive values, and a
    magnitude pattern above 0x7F800000 is a NaN), whole bytes in a loop of constant length: a
    float max with NaN semantics or a loop of variable length measured 5-10x slower."""
    n = x.shape[0]
    words = x.view(np.int32)
    top, top_magnitude = np.int32(-(2**31)), np.int32(0)
    for k in range(n // 8):
        byte = np.uint8(0)
        for j in range(8):
            word = words[8 * k + j]
            magnitude = word & np.int32(0x7FFFFFFF)
            byte |= np.uint8(1 << j) if magnitude != 0 else np.uint8(0)
            top, top_magnitude = max(top, word), max(top_magnitude, magnitude)
        bits[k] = byte
    if n % 8:
        byte = np.uint8(0)
        for i in range(n - n % 8, n):
            word = words[i]
            magnitude = word & np.int32(0x7FFFFFFF)
            byte |= np.uint8(1 << (i % 8)) if magnitude != 0 else np.uint8(0)
            top, top_magnitude = max(top, word), max(top_magnitude, magnitude)
        bits[n // 8] = byte
    if top_magnitude > _NON_FINITE_BITS:
        return np.float32(np.nan)
    # The largest pattern is the largest value when any is positive; otherwise a value <= 0,
    # which the caller refuses either way.
    return np.array([top], dtype=np.int32).view(np.float32)[0] if top > 0 else np.float32(0.0)


@njit(cache=True, nogil=True)
def unpack_mask(bits, scale, out):
    """``out[i]`` (float32) = ``scale`` where bit i of ``bits`` is set, else +0.0: the inverse of
    ``pack_mask`` for a mask whose non-zero elements all equal ``scale``."""
    n = out.shape[0]
    value, zero = np.float32(scale), np.float32(0.0)
    for k in range(n // 8):
        byte = bits[k]
        for j in range(8):
            out[8 * k + j] = value if (byte >> j) & 1 else zero
    for i in range(n - n % 8, n):
        out[i] = value if (bits[i // 8] >> (i % 8)) & 1 else zero
