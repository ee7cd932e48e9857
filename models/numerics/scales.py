"""Shared exponents and their power-of-two scales for the BFP codec (``codec.py``): the per-format
tables that turn a biased exponent code into the encode scale 2**(m-1-E) or the decode scale
2**(E+1-m) (2**E for log levels) by one gather per block, and the lazy loader of the fused kernels.

Invariant: ``scale_table(fmt, use)[c]`` equals ``from_exponent`` of the code's exponent exactly
(both build the float32 from its bits), so the torch path and the fused kernels, which read the
same tables, scale by the same values.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from models.numerics.bitpack import unpack_bits
from models.numerics.format import BfpFormat

if TYPE_CHECKING:
    from models.numerics.codec import Packed


@functools.cache
def fused_kernels():
    """models.numerics.fused, imported by the first user of the kernels (a codec with
    ``use_kernels``, the trainer's hooks): numba takes ~0.3 s
    and ~145 MB to load, which processes that do not (the gateway) should not pay."""
    from models.numerics import fused

    return fused


def from_exponent(exponent: torch.Tensor, offset: int, *, negate: bool) -> torch.Tensor:
    """float32 2**(offset - exponent) (negate) or 2**(exponent + offset), built from its bits.
    The codec's exponents keep it normal (exponent_floor = m - 127, E <= 128), except the encode
    scale 2**(1 - E) of m = 2 at E = 128; the clamp makes that 2**-126, which gives the same code
    (every non-zero value is +-1 at m = 2). 2**128 (log levels at E = 128) is inf, as exp2 gives."""
    power = (offset + 127 - exponent) if negate else (exponent + (offset + 127))
    return power.clamp_(1, 255).bitwise_left_shift_(23).view(torch.float32)


@functools.lru_cache(maxsize=64)
def scale_table(fmt: BfpFormat, use: str, device: torch.device) -> torch.Tensor:
    """float32 per biased exponent code c (E = exponent_range[0] + c), the same values
    ``from_exponent`` builds: "encode" 2**(m-1-E) (uniform), "decode" 2**(E+1-m) (uniform) or
    2**E (log levels). One gather per block replaces five small ops per tensor."""
    codes = torch.arange(1 << fmt.exponent_bits, dtype=torch.int32)
    low = fmt.exponent_range[0]
    if use == "encode":
        table = from_exponent(codes + low, fmt.mantissa_bits - 1, negate=True)
    else:
        offset = 1 - fmt.mantissa_bits if fmt.levels == "uniform" else 0
        table = from_exponent(codes, low + offset, negate=False)
    return table.to(device)


def power_of_two(packed: Packed) -> torch.Tensor:
    """The decode scale per block (``scale_table(fmt, "decode")``), from the stored exponent codes."""
    fmt = packed.fmt
    n_blocks = max(1, -(-packed.numel // fmt.block_size))
    if fmt.exponent_bits == 8:
        codes = packed.exponents.to(torch.int32)
    else:
        codes = unpack_bits(packed.exponents, fmt.exponent_bits, n_blocks).to(torch.int32)
    return scale_table(fmt, "decode", codes.device).index_select(0, codes)


def stored_exponents(packed: Packed, n_blocks: int) -> torch.Tensor:
    fmt = packed.fmt
    return unpack_bits(packed.exponents, fmt.exponent_bits, n_blocks).to(torch.int32) + fmt.exponent_range[0]
