"""Block floating-point formats as small immutable values with a text form.

A format says how one block of ``block_size`` consecutive elements (row-major order of the
flattened tensor) is stored: one shared exponent of ``exponent_bits`` bits and, per element, a
``mantissa_bits``-wide code that INCLUDES the sign (MSFP convention: "4-bit" means sign + 3
magnitude bits, so two codes fit in one byte). ``levels`` chooses uniform mantissas or a
non-uniform, log-spaced lookup table; ``outlier_fraction`` of the elements (chosen per tensor by
their size relative to their block) are kept exactly in side storage.

Invariant: ``BfpFormat.parse(str(fmt)) == fmt`` for every valid format.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

ROUNDINGS = ("nearest", "stochastic")
LEVEL_KINDS = ("uniform", "log")
# Non-uniform (log) levels span this many octaves below the block's top when there are enough codes.
LOG_LEVEL_OCTAVES = 4.0

_TEXT = re.compile(
    r"^bfp\(b=(?P<b>\d+),m=(?P<m>\d+),e=(?P<e>\d+),r=(?P<r>[a-z]+),l=(?P<l>[a-z]+),o=(?P<o>[0-9.eE+-]+)\)$"
)


@dataclass(frozen=True)
class BfpFormat:
    block_size: int = 32
    mantissa_bits: int = 4
    exponent_bits: int = 8
    rounding: str = "nearest"
    levels: str = "uniform"
    outlier_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 2 <= self.mantissa_bits <= 8:
            raise ValueError(f"mantissa_bits (sign included) must be in 2..8, got {self.mantissa_bits}")
        if not 2 <= self.exponent_bits <= 8:
            raise ValueError(f"exponent_bits must be in 2..8, got {self.exponent_bits}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.levels not in LEVEL_KINDS:
            raise ValueError(f"levels must be one of {LEVEL_KINDS}, got {self.levels!r}")
        if not 0.0 <= self.outlier_fraction < 1.0:
            raise ValueError(f"outlier_fraction must be in [0, 1), got {self.outlier_fraction}")

    def __str__(self) -> str:
        return (
            f"bfp(b={self.block_size},m={self.mantissa_bits},e={self.exponent_bits},"
            f"r={self.rounding},l={self.levels},o={self.outlier_fraction!r})"
        )

    @classmethod
    def parse(cls, text: str) -> BfpFormat:
        match = _TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"not a BFP format: {text!r} (expected e.g. {cls()!s})")
        return cls(
            int(match["b"]), int(match["m"]), int(match["e"]), match["r"], match["l"], float(match["o"])
        )

    # Derived constants (pure functions of the format) -----------------------------------------

    @property
    def max_code(self) -> int:
        """Largest magnitude code: codes are signed in [-max_code, max_code]."""
        return (1 << (self.mantissa_bits - 1)) - 1

    @property
    def exponent_range(self) -> tuple[int, int]:
        """Stored shared exponents E (a block's values satisfy |x| < 2**E); E = low + code."""
        high = 1 << (self.exponent_bits - 1)
        return high - (1 << self.exponent_bits) + 1, high

    @property
    def exponent_floor(self) -> int:
        """Smallest E actually used: keeps the element step 2**(E-m+1) a normal fp32 number."""
        return max(self.exponent_range[0], self.mantissa_bits - 127)

    def bits_per_element(self, n_side_fraction: float = 0.0, side_bytes: int = 8) -> float:
        """Average stored bits per element for large tensors (side entries: index + value)."""
        return self.mantissa_bits + self.exponent_bits / self.block_size + 8 * side_bytes * n_side_fraction

    def level_table(self) -> tuple[float, ...]:
        """Magnitude levels relative to 2**E for code 0..max_code (``levels == 'log'`` only)."""
        return _log_levels(self.max_code)

    def max_error_fraction(self) -> float:
        """Worst-case |x - decoded| as a fraction of 2**E of the element's block (finite, not side)."""
        if self.levels == "uniform":
            # Rounding to the nearest step costs half a step, but the top value can clamp by a whole
            # one, and sign preservation lifts values below half a step up to one step.
            return 2.0 ** (1 - self.mantissa_bits)
        table = self.level_table()  # ends at 1.0 and |x| < 2**E, so every value lies between two levels
        widest_gap = max(b - a for a, b in zip(table, table[1:], strict=False))
        # Sign preservation lifts values below the smallest level up to it: at most that level away.
        return max(widest_gap if self.rounding == "stochastic" else widest_gap / 2, table[1])


@lru_cache(maxsize=16)
def _log_levels(max_code: int) -> tuple[float, ...]:
    if max_code == 1:
        return (0.0, 1.0)
    octaves = min(LOG_LEVEL_OCTAVES, float(max_code - 1))
    ratio = 2.0 ** (-octaves / (max_code - 1))
    # Level k (1..max_code) is ratio**(max_code-k): the top level is 1 (the block's 2**E).
    # Rounded to float32 here, so the error bound is computed from the very levels the codec uses.
    return (0.0, *(float(np.float32(ratio ** (max_code - k))) for k in range(1, max_code + 1)))


def side_entry_bytes(itemsize: int) -> int:
    """Bytes of one side-storage entry: an int32 flat index plus the value in the tensor's dtype."""
    return 4 + itemsize


def packed_nbytes(numel: int, fmt: BfpFormat, n_side: int, itemsize: int) -> int:
    """The stated storage formula: mantissas, exponents and side entries, each bit-packed.

    nbytes = ceil(n*m/8) + ceil(max(1, ceil(n/B))*e/8) + n_side*(4 + itemsize)
    """
    n_blocks = max(1, math.ceil(numel / fmt.block_size))
    return (
        math.ceil(numel * fmt.mantissa_bits / 8)
        + math.ceil(n_blocks * fmt.exponent_bits / 8)
        + n_side * side_entry_bytes(itemsize)
    )
