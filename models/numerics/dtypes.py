"""How tensors of other float dtypes pass through the float32 codec (float16, bfloat16, float64).

The codec's blocks, exponents and codes are float32. On the way in, a float64 value that float32
flushes to zero (|x| < 2**-150) would lose its sign; on the way out, a float32 decode can exceed
a narrower dtype's range (log levels put a block's top level at 2**E: 2**16 for a float16 block
topped in [2**15, 65504], inf in float16).

Invariant: ``keep_flushed_signs`` leaves every element float32 already represents unchanged;
``narrow`` turns a finite float32 decode into a finite value of ``dtype``, and clamping only moves
a decoded value towards its (finite, in-range) input, so the codec's error bound still holds.
"""

from __future__ import annotations

import torch

SMALLEST_FLOAT32 = 2.0**-149  # the smallest positive (subnormal) float32
_FLOAT32_MAX = torch.finfo(torch.float32).max


def keep_flushed_signs(source: torch.Tensor, copy: torch.Tensor) -> None:
    """Where a non-zero ``source`` value became 0 in its float32 ``copy``, put the smallest
    float32 of its sign instead (it then takes the smallest code, so its sign survives)."""
    flushed = (copy == 0) & (source != 0)
    if bool(flushed.any()):
        copy[flushed] = torch.copysign(torch.tensor(SMALLEST_FLOAT32), source[flushed]).float()


def narrow(decoded: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``decoded`` (owned by the caller, clamped in place) as ``dtype``."""
    largest = torch.finfo(dtype).max
    if largest < _FLOAT32_MAX:
        decoded.clamp_(-largest, largest)
    return decoded.to(dtype)
