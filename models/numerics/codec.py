"""The BFP codec: encode a float tensor into bit-packed block floating point, and decode it back.

Storage (``Packed``) is real: uint8 tensors of bit-packed mantissa codes and shared exponents, plus
side storage (int32 flat indices and values in the tensor's own dtype) for outliers and for every
non-finite element. Behaviour by value:
- NaN, +inf, -inf: always kept exactly in side storage (they never touch a block's exponent);
  with log levels so are |x| >= 2**127 (the top level times 2**128 would overflow float32);
- zeros and all-zero blocks: decode to exactly zero (a -0.0 decodes to +0.0);
- signs are preserved: a non-zero value never decodes to zero (it rounds up to the smallest
  code), so ``x > 0`` survives the round trip, which ReLU's backward (``result > 0``) relies on;
  ``preserve_signs=False`` (model update deltas) rounds such values to zero instead;
- dtypes (``dtypes.py``): float16, bfloat16 and float64 are encoded through float32. Decodes
  are clamped to the dtype's largest finite value (+-65504 for float16: a log-level block topped
  in [2**15, 65504] has its top level at 2**16, inf in float16). float64 magnitudes of float32's
  max or more go to side storage (exact); non-zero ones below 2**-149 keep their sign (the
  smallest code, within the bound below) where float32 would flush them to zero; everything in
  between loses float64's extra precision;
- all-equal blocks: |x| < 2**E holds for the shared E, so they get the full mantissa width;
- huge dynamic range: each block has its own exponent; values far below their block's top flush
  to zero, within the bound below. Blocks whose top is below 2**exponent_floor use that floor.

Speed (why the code looks the way it does): on a loaded CPU every torch op costs 10-25 us of
dispatch, about as much as an elementwise pass over an activation, and a fresh output tensor
costs page faults; so the cost is the number of ops. The encoder makes ~10 passes, all into
per-thread scratch buffers and their cached views (``out=``): |x| once, block maxima by ``amax``
on a (blocks, B) view, ``frexp`` once per block, the scale by one gather from a per-format table,
scale + round + clamp + sign in place; the signed float codes go straight to ``pack_signed``.
Outliers touch only the k chosen blocks (``outliers.py``); the exponent scale tables and the
kernels' loader are in ``scales.py``. Non-uniform levels use a 32768-entry table indexed by
the top 16 bits of the float (no ``log2``/``bucketize`` per element). With ``use_kernels=True``
(the trainer's hooks and wire codec) the common case (float32 on the CPU, blocks of 32, uniform
levels, nearest rounding, no outliers) skips all that: compiled kernels (``fused.py``) make the
same bytes in two passes, 2.5-3x faster to encode and to decode.

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

from models.numerics.bitpack import (
    code_capacity,
    pack_bits,
    pack_signed,
    packed_length,
    unpack_signed,
    unpack_u8,
)
from models.numerics.dtypes import keep_flushed_signs, narrow
from models.numerics.format import BfpFormat, packed_nbytes
from models.numerics.levels import LevelTables, level_tables
from models.numerics.outliers import side_indices
from models.numerics.scales import fused_kernels, power_of_two, scale_table, stored_exponents
from models.numerics.scratch import scratch

_EMPTY_INDEX = torch.zeros(0, dtype=torch.int32)


@dataclass(frozen=True, eq=False)
class Packed:
    """One encoded tensor. All storage tensors are contiguous and on the CPU or the source device."""

    fmt: BfpFormat
    shape: tuple[int, ...]
    dtype: torch.dtype
    mantissas: torch.Tensor  # uint8, ceil(n * mantissa_bits / 8) bytes
    exponents: torch.Tensor  # uint8, ceil(n_blocks * exponent_bits / 8) bytes
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
        return sum(
            int(t.numel() * t.element_size())
            for t in (self.mantissas, self.exponents, self.side_index, self.side_value)
        )

    @property
    def formula_nbytes(self) -> int:
        return packed_nbytes(self.numel, self.fmt, self.n_side, self.side_value.element_size())


class BfpCodec:
    """Encodes/decodes with one format. Pure apart from the optional random generator used by
    stochastic rounding (inject a seeded ``torch.Generator`` for determinism). Thread-safe: the
    scratch buffers are per thread."""

    def __init__(
        self,
        fmt: BfpFormat,
        generator: torch.Generator | None = None,
        *,
        use_kernels: bool = False,
        preserve_signs: bool = True,
    ) -> None:
        """``use_kernels``: encode and decode the formats the fused kernels cover with them (2.5-3x
        faster; the same bytes). Off by default: loading numba and the kernels costs a process
        ~145 MB of RSS once, worth it in a trainer, not on a gateway that encodes one update.

        ``preserve_signs=False``: values below half the smallest code round to zero instead of
        being lifted to it. For data whose signs nothing reads (model update deltas): on
        heavy-tailed blocks the lifting dominates the error (docs/compression.md). The bound
        holds either way; the kernels implement the lifting only, so this takes the torch path."""
        self.fmt = fmt
        self.generator = generator
        self.preserve_signs = preserve_signs
        self._tables: dict[torch.device, LevelTables] = {}
        # Log levels: the top level at E = 128 would be 2**128 (inf in float32), so magnitudes of
        # 2**127 and more go to side storage like non-finite values; then E <= 127 always.
        self._special_at = 2.0**127 if fmt.levels == "log" else math.inf
        # The fused kernels, if asked for and they cover this format (float32 CPU tensors; fused.py).
        kernels = use_kernels and preserve_signs
        self._fused = fused_kernels() if kernels and fused_kernels().covers(fmt) else None
        if self._fused:
            self._encode_scales = scale_table(fmt, "encode", torch.device("cpu")).numpy()
            self._decode_scales = scale_table(fmt, "decode", torch.device("cpu")).numpy()

    def encode(self, tensor: torch.Tensor) -> Packed:
        if not tensor.is_floating_point():
            raise TypeError(f"BFP encodes floating-point tensors, got {tensor.dtype}")
        fmt = self.fmt
        flat = tensor.detach().reshape(-1)
        n = flat.numel()
        if n >= 2**31:
            raise ValueError("tensors of 2**31 elements or more do not fit int32 side indices")
        n_blocks = max(1, -(-n // fmt.block_size))
        n_pad = n_blocks * fmt.block_size
        if self._fused:
            packed = self._encode_fused(flat, tensor, n_blocks)
            if packed is not None:
                return packed
        work = scratch(flat.device)
        if flat.dtype == torch.float32 and n == n_pad:
            blocks, owned = flat.view(n_blocks, fmt.block_size), False  # read-only view, no copy
        else:
            blocks, owned = self._padded_copy(flat, n_pad, work).view(n_blocks, fmt.block_size), True
            if flat.dtype == torch.float64 and self.preserve_signs:
                keep_flushed_signs(flat, blocks.view(-1)[:n])
        magnitude = torch.abs(blocks, out=work.get2d("magnitude", n_blocks, fmt.block_size, torch.float32))
        block_max = magnitude.amax(dim=1)
        side = None
        # NaN and inf propagate through the maxima: one reduction over the blocks checks them all.
        top = block_max.max().item()
        special = not math.isfinite(top) or top >= self._special_at
        if special or fmt.outlier_fraction > 0:
            if special and not owned:  # non-finite values must leave the blocks the codes are made of
                blocks = self._padded_copy(flat, n_pad, work).view_as(blocks)
            side, block_max = side_indices(fmt, self._special_at, blocks, magnitude, block_max, n, special)
        exponent = torch.frexp(block_max).exponent.clamp_(fmt.exponent_floor, fmt.exponent_range[1])
        q = self._mantissa_codes(blocks, magnitude, exponent, n, work)
        mantissas = pack_signed(
            q, fmt.mantissa_bits, n, fmt.max_code, work.get("codes", q.numel(), torch.uint8)
        )
        biased = exponent if fmt.levels == "uniform" else exponent.sub_(fmt.exponent_range[0])
        if fmt.exponent_bits == 8:
            exponents = biased.to(torch.uint8)
        else:
            exponents = pack_bits(biased, fmt.exponent_bits)
        if side is None:
            side_index, side_value = (
                _EMPTY_INDEX
                if flat.device.type == "cpu"
                else torch.zeros(0, dtype=torch.int32, device=flat.device),
                flat.new_empty(0),
            )
        else:
            side_index, side_value = side.to(torch.int32), flat.index_select(0, side)
        return Packed(fmt, tuple(tensor.shape), tensor.dtype, mantissas, exponents, side_index, side_value)

    def decode(self, packed: Packed) -> torch.Tensor:
        fmt = packed.fmt
        n = packed.numel
        n_blocks = max(1, -(-n // fmt.block_size))
        n_pad = n_blocks * fmt.block_size
        device = packed.mantissas.device
        if fmt == self.fmt and self._fused and packed.dtype == torch.float32 and device.type == "cpu" and n:
            out = torch.empty(n_pad, dtype=torch.float32)
            self._fused.decode_into(
                packed.mantissas.numpy(),
                packed.exponents.numpy(),
                n,
                fmt.mantissa_bits,
                fmt.max_code,
                self._decode_scales,
                out.numpy(),
            )
            result = out[:n]
            if packed.side_index.numel():
                result[packed.side_index.long()] = packed.side_value
            return result.view(packed.shape)
        work = scratch(device)
        capacity = max(n_pad, code_capacity(n))
        codes = work.get("codes", capacity, torch.uint8)
        out = torch.empty(capacity, dtype=torch.float32, device=device)
        blocks = out[:n_pad].view(n_blocks, fmt.block_size)
        if fmt.levels == "uniform":
            unpack_signed(packed.mantissas, fmt.mantissa_bits, n, fmt.max_code, out, codes)
            if n_pad != n:
                out[n:n_pad].zero_()  # padding decodes to zero
        else:
            unpack_u8(packed.mantissas, fmt.mantissa_bits, n, codes)
            if n_pad != n:
                codes[n:n_pad].fill_(fmt.max_code)  # padding decodes to zero
            index = work.get("index", n_pad, torch.int32)
            index.copy_(codes[:n_pad])
            torch.index_select(self._tables_on(device, fmt).signed_levels, 0, index, out=out[:n_pad])
        blocks.mul_(power_of_two(packed).unsqueeze(1))
        result = out[:n]
        if packed.dtype != torch.float32:
            result = narrow(result, packed.dtype)
        if packed.side_index.numel():
            result[packed.side_index.long()] = packed.side_value
        return result.view(packed.shape)

    def error_bound(self, packed: Packed) -> torch.Tensor:
        """Per-element bound on |x - decoded| (0 at side entries), in float64."""
        fmt = packed.fmt
        n = packed.numel
        n_blocks = max(1, math.ceil(n / fmt.block_size))
        exponent = stored_exponents(packed, n_blocks)
        per_block = fmt.max_error_fraction() * torch.exp2(exponent.double())
        bound = per_block.repeat_interleave(fmt.block_size)[:n].clone()
        bound[packed.side_index.long()] = 0.0
        return bound.view(packed.shape)

    # ------------------------------------------------------------------------------------------

    def _encode_fused(self, flat: torch.Tensor, tensor: torch.Tensor, n_blocks: int) -> Packed | None:
        """The compiled kernels (fused.py) for a float32 CPU tensor; None if it holds a non-finite value."""
        n = flat.numel()
        fused = self._fused
        if fused is None or flat.dtype != torch.float32 or flat.device.type != "cpu" or n == 0:
            return None
        fmt = self.fmt
        n_pad = n_blocks * fmt.block_size
        source = flat.contiguous() if n == n_pad else self._padded_copy(flat, n_pad, scratch(flat.device))
        exponents = torch.empty(n_blocks, dtype=torch.uint8)
        mantissas = torch.empty(packed_length(n, fmt.mantissa_bits), dtype=torch.uint8)
        low, high = fmt.exponent_range
        if not fused.encode_into(
            source.numpy(),
            n,
            fmt.mantissa_bits,
            fmt.max_code,
            fmt.exponent_floor,
            high,
            low,
            self._encode_scales,
            exponents.numpy(),
            mantissas.numpy(),
        ):
            return None
        return Packed(
            fmt, tuple(tensor.shape), tensor.dtype, mantissas, exponents, _EMPTY_INDEX, flat.new_empty(0)
        )

    @staticmethod
    def _padded_copy(flat: torch.Tensor, n_pad: int, work) -> torch.Tensor:
        buffer = work.get("blocks", n_pad, torch.float32)
        buffer[: flat.numel()].copy_(flat)
        buffer[flat.numel() :].zero_()
        return buffer

    def _mantissa_codes(
        self, blocks: torch.Tensor, magnitude: torch.Tensor, exponent: torch.Tensor, n: int, work
    ) -> torch.Tensor:
        """Signed codes as float32 in [-max_code, max_code] (a 1-D scratch buffer of
        ``max(n_pad, code_capacity(n))`` values; what ``pack_signed`` reads). ``magnitude`` is
        consumed (reused as scratch)."""
        fmt = self.fmt
        rows, columns = blocks.shape
        codes = work.get("q", max(rows * columns, code_capacity(n)), torch.float32)
        q = codes[: rows * columns].view(rows, columns)
        if fmt.levels == "uniform":
            # In place: the caller stores the biased exponent codes this leaves behind.
            biased = exponent.sub_(fmt.exponent_range[0])
            scale = scale_table(fmt, "encode", q.device).index_select(0, biased)
            torch.mul(magnitude, scale.unsqueeze(1), out=q)
            if fmt.rounding == "stochastic":
                q.add_(self._uniform_noise(q, work)).floor_()
            else:
                q.round_()
        else:
            # exp2, not from_exponent: 2**-128 (E = 128) is subnormal.
            relative = torch.mul(magnitude, torch.exp2(-exponent.float()).unsqueeze(1), out=q)  # in [0, 1)
            self._level_index(relative, magnitude, work)
        # Sign-preserving (by default): a non-zero value never decodes to zero (sign(0) == 0 keeps zeros).
        q.clamp_(1 if self.preserve_signs else 0, fmt.max_code).mul_(torch.sign(blocks, out=magnitude))
        return codes

    def _level_index(self, relative: torch.Tensor, spare: torch.Tensor, work) -> None:
        """Replace ``relative`` (|x| / 2**E) by the index of its level, in place, as float."""
        fmt = self.fmt
        tables = self._tables_on(relative.device, fmt)
        if fmt.rounding == "stochastic":
            levels = tables.levels
            upper = torch.bucketize(relative, levels).clamp_(1, fmt.max_code)
            low, high = levels[upper - 1], levels[upper]
            take_upper = self._uniform_noise(relative, work) < (relative - low) / (high - low)
            relative.copy_(upper - 1 + take_upper.to(torch.int64))
            return
        # Nearest level = number of midpoints below r: the table gives that count at the bottom of
        # r's 16-bit bucket and the one midpoint (if any) inside the bucket.
        key = work.get("key", relative.numel(), torch.int32).view_as(relative)
        torch.bitwise_right_shift(relative.view(torch.int32), 16, out=key)
        flat_key = key.view(-1)
        base = torch.index_select(tables.base, 0, flat_key, out=spare.view(-1)).view_as(relative)
        threshold = torch.index_select(
            tables.threshold, 0, flat_key, out=work.get("threshold", relative.numel(), torch.float32)
        )
        relative.sub_(threshold.view_as(relative)).sign_().clamp_(0, 1).add_(base)

    def _uniform_noise(self, like: torch.Tensor, work) -> torch.Tensor:
        noise = work.get("noise", like.numel(), torch.float32).view_as(like)
        return torch.rand(like.shape, generator=self.generator, out=noise)

    def _tables_on(self, device: torch.device, fmt: BfpFormat) -> LevelTables:
        if fmt != self.fmt:
            return level_tables(fmt.max_code, device)
        tables = self._tables.get(device)
        if tables is None:
            tables = self._tables[device] = level_tables(fmt.max_code, device)
        return tables


def encode(
    tensor: torch.Tensor,
    fmt: BfpFormat,
    generator: torch.Generator | None = None,
    *,
    preserve_signs: bool = True,
) -> Packed:
    return BfpCodec(fmt, generator, preserve_signs=preserve_signs).encode(tensor)


def decode(packed: Packed) -> torch.Tensor:
    """Decoding needs only what the Packed carries (its format included)."""
    return BfpCodec(packed.fmt).decode(packed)
