"""The BFP codec: encode a float tensor into bit-packed block floating point, and decode it back.

Storage (``Packed``) is real: uint8 tensors of bit-packed mantissa codes and shared exponents, plus
side storage (int32 flat indices and values in the tensor's own dtype) for outliers and for every
non-finite element. Behaviour by value:
- NaN, +inf, -inf: always kept exactly in side storage (they never touch a block's exponent);
- zeros and all-zero blocks: decode to exactly zero (a -0.0 decodes to +0.0);
- signs are preserved: a non-zero value never decodes to zero (it rounds up to the smallest
  code), so ``x > 0`` survives the round trip, which ReLU's backward (``result > 0``) relies on;
- all-equal blocks: |x| < 2**E holds for the shared E, so they get the full mantissa width;
- huge dynamic range: each block has its own exponent; values far below their block's top flush
  to zero, within the bound below. Blocks whose top is below 2**exponent_floor use that floor.

Invariant (error bound): for every finite element not in side storage,
|x - decode(encode(x))| <= fmt.max_error_fraction() * 2**E_block, with E_block the stored shared
exponent (2**E_block <= 2 * max|block| unless the exponent floor applies). Formats with fewer than 8
exponent bits saturate blocks whose top reaches 2**exponent_range[1]; the bound excludes those.
``packed.nbytes == packed_nbytes(numel, fmt, n_side, itemsize)`` always.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models.numerics.bitpack import pack_bits, pack_float_codes, unpack_bits, unpack_float_codes
from models.numerics.format import BfpFormat, packed_nbytes

_TINY = 1e-30


@dataclass(frozen=True, eq=False)
class Packed:
    """One encoded tensor. All storage tensors are contiguous and on the CPU or the source device."""

    fmt: BfpFormat
    shape: tuple[int, ...]
    dtype: torch.dtype
    mantissas: torch.Tensor   # uint8, ceil(n/8) * mantissa_bits bytes
    exponents: torch.Tensor   # uint8, ceil(n_blocks/8) * exponent_bits bytes
    side_index: torch.Tensor  # int32, flat indices (sorted, unique)
    side_value: torch.Tensor  # dtype, the exact values at side_index

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def n_side(self) -> int:
        return int(self.side_index.numel())

    @property
    def nbytes(self) -> int:
        return sum(int(t.numel() * t.element_size())
                   for t in (self.mantissas, self.exponents, self.side_index, self.side_value))

    @property
    def formula_nbytes(self) -> int:
        return packed_nbytes(self.numel, self.fmt, self.n_side, self.side_value.element_size())


class BfpCodec:
    """Encodes/decodes with one format. Pure apart from the optional random generator used by
    stochastic rounding (inject a seeded ``torch.Generator`` for determinism)."""

    def __init__(self, fmt: BfpFormat, generator: torch.Generator | None = None) -> None:
        self.fmt = fmt
        self.generator = generator
        self._levels = torch.tensor(fmt.level_table(), dtype=torch.float32) if fmt.levels == "log" else None

    def encode(self, tensor: torch.Tensor) -> Packed:
        if not tensor.is_floating_point():
            raise TypeError(f"BFP encodes floating-point tensors, got {tensor.dtype}")
        fmt = self.fmt
        flat = tensor.detach().reshape(-1)
        n = flat.numel()
        if n >= 2 ** 31:
            raise ValueError("tensors of 2**31 elements or more do not fit int32 side indices")
        n_blocks = max(1, math.ceil(n / fmt.block_size))
        if flat.dtype == torch.float32 and n == n_blocks * fmt.block_size:
            blocks, owned = flat.view(n_blocks, fmt.block_size), False  # read-only view, no copy
        else:
            owned = True
            blocks = torch.zeros(n_blocks * fmt.block_size, dtype=torch.float32, device=flat.device)
            blocks[:n] = flat
            blocks = blocks.view(n_blocks, fmt.block_size)
        block_max = blocks.abs().amax(dim=1)  # NaN propagates: one cheap finiteness check per block
        if fmt.outlier_fraction > 0 or not bool(torch.isfinite(block_max).all()):
            side = self._side_indices(blocks.reshape(-1), n)
            blocks = blocks if owned else blocks.clone()
            # Outliers and non-finite values must not set their block's exponent.
            blocks.view(-1)[side] = 0.0
            block_max = blocks.abs().amax(dim=1)
        else:
            side = torch.zeros(0, dtype=torch.int64, device=flat.device)
        exponent = torch.frexp(block_max).exponent  # |x| < 2**exponent
        exponent = exponent.clamp_(fmt.exponent_floor, fmt.exponent_range[1])
        codes = self._mantissa_codes(blocks, exponent).view(-1)[:n]
        mantissas = pack_float_codes(codes, fmt.mantissa_bits)
        return Packed(
            fmt=fmt, shape=tuple(tensor.shape), dtype=tensor.dtype,
            mantissas=mantissas,
            exponents=pack_bits(exponent - fmt.exponent_range[0], fmt.exponent_bits),
            side_index=side.to(torch.int32), side_value=flat[side].clone())

    def decode(self, packed: Packed) -> torch.Tensor:
        fmt = packed.fmt
        n = packed.numel
        n_blocks = max(1, math.ceil(n / fmt.block_size))
        exponent = _exponents(packed, n_blocks)
        codes = unpack_float_codes(packed.mantissas, fmt.mantissa_bits, n)
        if codes.numel() != n_blocks * fmt.block_size:
            codes = torch.cat([codes, codes.new_full((n_blocks * fmt.block_size - n,), fmt.max_code)])
        codes = codes.view(n_blocks, fmt.block_size)  # padding holds the zero code
        if fmt.levels == "uniform":
            values = codes.sub_(fmt.max_code)
            values.mul_(torch.exp2((exponent - fmt.mantissa_bits + 1).float())[:, None])
        else:
            values = self._signed_levels_on(codes.device, fmt)[codes.to(torch.int64)]
            values.mul_(torch.exp2(exponent.float())[:, None])
        out = values.reshape(-1)[:n].to(packed.dtype)
        if packed.n_side:
            out[packed.side_index.long()] = packed.side_value
        return out.view(packed.shape)

    def error_bound(self, packed: Packed) -> torch.Tensor:
        """Per-element bound on |x - decoded| (0 at side entries), in float64."""
        fmt = packed.fmt
        n = packed.numel
        n_blocks = max(1, math.ceil(n / fmt.block_size))
        exponent = _exponents(packed, n_blocks)
        per_block = fmt.max_error_fraction() * torch.exp2(exponent.double())
        bound = per_block.repeat_interleave(fmt.block_size)[:n].clone()
        bound[packed.side_index.long()] = 0.0
        return bound.view(packed.shape)

    # ------------------------------------------------------------------------------------------

    def _side_indices(self, padded: torch.Tensor, n: int) -> torch.Tensor:
        """Non-finite elements plus the outlier budget: the k = floor(fraction * n) elements that
        are largest relative to the mean magnitude of their block (so one spike cannot flatten
        the rest of its block). Sorted and unique."""
        nonfinite = ~torch.isfinite(padded)
        parts = []
        if bool(nonfinite.any()):
            parts.append(nonfinite.nonzero().view(-1))
            padded = padded.masked_fill(nonfinite, 0.0)
        k = int(self.fmt.outlier_fraction * n)
        if k > 0:
            magnitude = padded.abs().view(-1, self.fmt.block_size)
            score = (magnitude / (magnitude.mean(dim=1, keepdim=True) + _TINY)).view(-1)[:n]
            parts.append(torch.topk(score, k, sorted=False).indices)
        if not parts:
            return torch.zeros(0, dtype=torch.int64, device=padded.device)
        return torch.unique(torch.cat(parts))

    def _mantissa_codes(self, blocks: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
        """Integral float32 codes in [0, 2*max_code]: code - max_code is the signed mantissa or level."""
        fmt = self.fmt
        stochastic = fmt.rounding == "stochastic"
        if fmt.levels == "uniform":
            scaled = blocks * torch.exp2((fmt.mantissa_bits - 1 - exponent).float())[:, None]
            magnitude = scaled.abs()
            if stochastic:
                magnitude.add_(self._uniform_noise(magnitude)).floor_()
            else:
                magnitude.round_()
            # Sign-preserving: a non-zero value never decodes to zero (sign(0) == 0 keeps zeros).
            return magnitude.clamp_(1, fmt.max_code).mul_(blocks.sign()).add_(fmt.max_code)
        levels = self._levels_on(blocks.device, fmt)
        relative = blocks.abs().mul_(torch.exp2(-exponent.float())[:, None])  # in [0, 1)
        if stochastic:
            upper = torch.bucketize(relative, levels).clamp_(1, fmt.max_code)
            low, high = levels[upper - 1], levels[upper]
            take_upper = self._uniform_noise(relative) < (relative - low) / (high - low)
            index = upper - 1 + take_upper.to(torch.int64)
        else:
            index = torch.bucketize(relative, (levels[1:] + levels[:-1]) / 2)
        return index.clamp_(min=1).to(torch.float32).mul_(blocks.sign()).add_(fmt.max_code)

    def _signed_levels_on(self, device: torch.device, fmt: BfpFormat) -> torch.Tensor:
        """Decode table indexed by code: code c means sign(c - max_code) * levels[|c - max_code|]."""
        levels = self._levels_on(device, fmt)
        return torch.cat([-levels.flip(0)[:-1], levels])

    def _uniform_noise(self, like: torch.Tensor) -> torch.Tensor:
        return torch.rand(like.shape, generator=self.generator, device=like.device)

    def _levels_on(self, device: torch.device, fmt: BfpFormat) -> torch.Tensor:
        if fmt != self.fmt:
            return torch.tensor(fmt.level_table(), dtype=torch.float32, device=device)
        if self._levels.device != device:
            self._levels = self._levels.to(device)
        return self._levels


def encode(tensor: torch.Tensor, fmt: BfpFormat, generator: torch.Generator | None = None) -> Packed:
    return BfpCodec(fmt, generator).encode(tensor)


def decode(packed: Packed) -> torch.Tensor:
    """Decoding needs only what the Packed carries (its format included)."""
    return BfpCodec(packed.fmt).decode(packed)


def _exponents(packed: Packed, n_blocks: int) -> torch.Tensor:
    fmt = packed.fmt
    return unpack_bits(packed.exponents, fmt.exponent_bits, n_blocks).to(torch.int32) + fmt.exponent_range[0]
