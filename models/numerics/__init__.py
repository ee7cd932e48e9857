"""Numeric formats shared by the cloud trainer and the gateway: block floating point (narrow,
non-uniform mantissas, outliers), real bit-packed storage, its wire form, and error statistics.

Invariant: pure tensor code with no training logic; every function is vectorised torch, except the
fused numba kernels (fused.py) that the codec uses where they give the same bytes faster.
"""

from models.numerics.bitpack import pack_bits, packed_length, unpack_bits
from models.numerics.codec import BfpCodec, Packed, decode, encode
from models.numerics.format import BfpFormat, packed_nbytes, side_entry_bytes
from models.numerics.scales import fused_kernels
from models.numerics.stats import ErrorStats, error_stats
from models.numerics.wire import WireFormatError, from_bytes, pack_for_wire, to_bytes, unpack_from_wire

__all__ = [
    "BfpCodec",
    "BfpFormat",
    "ErrorStats",
    "Packed",
    "WireFormatError",
    "decode",
    "encode",
    "error_stats",
    "from_bytes",
    "fused_kernels",
    "pack_bits",
    "pack_for_wire",
    "packed_length",
    "packed_nbytes",
    "side_entry_bytes",
    "to_bytes",
    "unpack_bits",
    "unpack_from_wire",
]
