"""BFP codec: round trips within the stated bound, exact byte counts, special values, wire form."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.numerics import (
    BfpCodec,
    BfpFormat,
    WireFormatError,
    decode,
    encode,
    error_stats,
    from_bytes,
    pack_bits,
    pack_for_wire,
    packed_length,
    packed_nbytes,
    to_bytes,
    unpack_bits,
    unpack_from_wire,
)

torch.set_num_threads(1)

formats = st.builds(
    BfpFormat,
    block_size=st.sampled_from([1, 5, 8, 32]),
    mantissa_bits=st.integers(2, 8),
    exponent_bits=st.just(8),
    rounding=st.sampled_from(["nearest", "stochastic"]),
    levels=st.sampled_from(["uniform", "log"]),
    outlier_fraction=st.sampled_from([0.0, 0.01, 0.1]),
)
values = st.floats(allow_nan=True, allow_infinity=True, width=32)


def check_round_trip(x: torch.Tensor, fmt: BfpFormat) -> torch.Tensor:
    codec = BfpCodec(fmt, torch.Generator().manual_seed(0))
    packed = codec.encode(x)
    y = codec.decode(packed)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert (
        packed.nbytes
        == packed.formula_nbytes
        == packed_nbytes(x.numel(), fmt, packed.n_side, x.element_size())
    )
    finite = torch.isfinite(x)
    # Non-finite values are exact (side storage); NaN stays NaN.
    assert torch.equal(torch.isnan(y), torch.isnan(x))
    assert torch.equal(y[torch.isinf(x)], x[torch.isinf(x)])
    bound = codec.error_bound(packed)
    assert bool(((y.double() - x.double()).abs()[finite] <= bound[finite]).all())
    # Signs survive: ReLU's backward reads ``result > 0``.
    assert torch.equal(y[finite] > 0, x[finite] > 0) and torch.equal(y[finite] < 0, x[finite] < 0)
    return y


@settings(max_examples=100, deadline=None)
@given(fmt=formats, data=st.lists(values, min_size=0, max_size=300))
def test_round_trip_adversarial_values_within_bound(fmt: BfpFormat, data: list[float]) -> None:
    check_round_trip(torch.tensor(data, dtype=torch.float32), fmt)


@settings(max_examples=25, deadline=None)
@given(fmt=formats, scale=st.floats(-60, 60), n=st.integers(1, 2000), seed=st.integers(0, 2**16))
def test_round_trip_random_tensors(fmt: BfpFormat, scale: float, n: int, seed: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2.0**scale
    check_round_trip(x, fmt)


def test_zeros_and_all_equal_blocks_and_huge_range() -> None:
    fmt = BfpFormat(mantissa_bits=4)
    zeros = torch.zeros(100)
    assert torch.equal(decode(encode(zeros, fmt)), zeros)
    equal = torch.full((64,), 1.0)  # a power of two: exactly representable
    assert torch.equal(decode(encode(equal, fmt)), equal)
    check_round_trip(torch.full((64,), -3.3e-20), fmt)
    huge = torch.tensor([3.0e38, 1.0e-38, -2.5e30, 1.0e-45, 7.0] * 13)
    check_round_trip(huge, fmt)
    check_round_trip(torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0]), fmt)


def test_other_dtypes_keep_dtype_and_exact_side_values() -> None:
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(200, dtype=torch.float64).to(dtype)
        x[3] = float("nan")
        packed = encode(x, BfpFormat(mantissa_bits=6))
        y = decode(packed)
        assert y.dtype == dtype and torch.isnan(y[3])
        assert packed.nbytes == packed.formula_nbytes


def test_outliers_lower_error_and_byte_formula() -> None:
    x = torch.randn(32 * 100, generator=torch.Generator().manual_seed(1))
    x[::97] *= 1000.0  # one spike in most blocks
    plain = encode(x, BfpFormat(mantissa_bits=4))
    with_outliers = encode(x, BfpFormat(mantissa_bits=4, outlier_fraction=0.02))
    assert with_outliers.n_side == int(0.02 * x.numel())
    assert with_outliers.nbytes == math.ceil(x.numel() * 4 / 8) + 100 + with_outliers.n_side * 8
    assert error_stats(x, decode(with_outliers)).relative_error < error_stats(x, decode(plain)).relative_error
    # Small values next to a spike are what outliers rescue.
    small = x.abs() < 3
    assert (decode(with_outliers) - x)[small].abs().mean() < (decode(plain) - x)[small].abs().mean() / 4


def test_stochastic_rounding_is_unbiased_on_average() -> None:
    x = torch.full((32 * 400,), 0.3)
    x[::32] = 1.0  # block top: the step is 1/4 at 4 bits, so 0.3 sits between levels
    codec = BfpCodec(BfpFormat(mantissa_bits=4, rounding="stochastic"), torch.Generator().manual_seed(0))
    y = codec.decode(codec.encode(x))
    assert abs(float(y[x == 0.3].mean()) - 0.3) < 0.01


def test_error_shrinks_with_mantissa_bits() -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    errors = [
        error_stats(x, decode(encode(x, BfpFormat(mantissa_bits=m)))).relative_error for m in (3, 4, 6, 8)
    ]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 0.01


def test_format_text_round_trip_and_validation() -> None:
    fmt = BfpFormat(16, 3, 6, "stochastic", "log", 0.01)
    assert BfpFormat.parse(str(fmt)) == fmt
    for bad in (
        dict(mantissa_bits=1),
        dict(exponent_bits=9),
        dict(rounding="up"),
        dict(block_size=0),
        dict(outlier_fraction=1.0),
        dict(levels="cubic"),
    ):
        with pytest.raises(ValueError):
            BfpFormat(**bad)
    with pytest.raises(ValueError):
        BfpFormat.parse("fp32")


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 8), codes=st.lists(st.integers(0, 255), max_size=100))
def test_bit_packing_round_trip(width: int, codes: list[int]) -> None:
    c = torch.tensor(codes, dtype=torch.int64) % (1 << width)
    packed = pack_bits(c, width)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_length(len(codes), width)
    assert torch.equal(unpack_bits(packed, width, len(codes)).long(), c)


def test_wire_round_trip_and_rejects_damage() -> None:
    x = torch.randn(3, 50)
    x[1, 7] = float("inf")
    packed = encode(x, BfpFormat(mantissa_bits=3, outlier_fraction=0.05))
    wire = pack_for_wire(packed)
    assert wire.dtype == torch.uint8 and wire.dim() == 1
    expected = decode(packed)
    assert torch.equal(decode(unpack_from_wire(wire)), expected)
    data = to_bytes(packed)
    assert torch.equal(decode(from_bytes(data)), expected)
    with pytest.raises(WireFormatError):
        from_bytes(data[:-1])
    with pytest.raises(WireFormatError):
        from_bytes(b"XXXX" + data[4:])
    with pytest.raises(WireFormatError):
        from_bytes(data[:5])


def test_error_stats_values() -> None:
    r = torch.tensor([1.0, 2.0, float("nan")])
    exact = error_stats(r, r.clone())
    assert exact.relative_error == 0.0 and exact.snr_db == math.inf and exact.nonfinite_mismatches == 0
    off = error_stats(r, torch.tensor([1.0, 3.0, 0.0]))
    assert off.relative_error == pytest.approx(1 / math.sqrt(5)) and off.nonfinite_mismatches == 1
