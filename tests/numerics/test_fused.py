"""The fused kernels (models/numerics/fused.py) give the torch codec's bytes and values, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.numerics import BfpCodec, BfpFormat
from models.numerics.fused import covers

torch.set_num_threads(1)


def assert_same_as_torch_ops(x: torch.Tensor, fmt: BfpFormat) -> None:
    kernels, ops = BfpCodec(fmt, use_kernels=True), BfpCodec(fmt)
    fast, reference = kernels.encode(x), ops.encode(x)
    for field in ("mantissas", "exponents", "side_index", "side_value"):
        as_bytes = [getattr(packed, field).view(torch.uint8) for packed in (fast, reference)]
        assert torch.equal(*as_bytes), field  # bytes: NaN payloads compare too
    # Each decoder reads the other's bytes: the float32 values are identical, NaN included.
    for packed in (fast, reference):
        assert torch.equal(kernels.decode(packed).view(torch.int32), ops.decode(packed).view(torch.int32))


@pytest.mark.parametrize("mantissa_bits", range(2, 9))
@pytest.mark.parametrize("numel", [1, 7, 31, 32, 33, 1000, 4096, 4100])
def test_every_width_and_ragged_length_matches(mantissa_bits: int, numel: int) -> None:
    fmt = BfpFormat(mantissa_bits=mantissa_bits)
    assert covers(fmt)
    generator = torch.Generator().manual_seed(numel * 10 + mantissa_bits)
    # Block tops from subnormal to near overflow; many values flush to zero in their block.
    exponents = torch.randint(-150, 120, (numel,), generator=generator)
    x = torch.randn(numel, generator=generator) * torch.exp2(exponents)
    assert_same_as_torch_ops(x, fmt)


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(64),
        -torch.zeros(64),
        torch.full((64,), 3.0),
        torch.full((64,), 2.0**127),
        torch.full((64,), 1e-45),
        torch.relu(torch.randn(4, 16, 8, 8, generator=torch.Generator().manual_seed(1))),
        torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 1e-40, -1e-40, 0.0] * 8),  # ties round half to even
    ],
)
@pytest.mark.parametrize("mantissa_bits", [2, 4, 8])
def test_adversarial_values_match(x: torch.Tensor, mantissa_bits: int) -> None:
    assert_same_as_torch_ops(x, BfpFormat(mantissa_bits=mantissa_bits))


@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_take_the_torch_path(special: float) -> None:
    x = torch.randn(100, generator=torch.Generator().manual_seed(2))
    x[37] = special
    codec = BfpCodec(BfpFormat(mantissa_bits=4), use_kernels=True)
    packed = codec.encode(x)
    assert packed.side_index.tolist() == [37]
    assert_same_as_torch_ops(x, BfpFormat(mantissa_bits=4))


def test_formats_the_kernels_do_not_cover_are_named() -> None:
    assert not covers(BfpFormat(levels="log"))
    assert not covers(BfpFormat(rounding="stochastic"))
    assert not covers(BfpFormat(outlier_fraction=0.01))
    assert not covers(BfpFormat(exponent_bits=5))
    assert not covers(BfpFormat(block_size=16))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=200),
    st.integers(2, 8),
)
def test_any_finite_values_match(values: list[float], mantissa_bits: int) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    assert_same_as_torch_ops(x, BfpFormat(mantissa_bits=mantissa_bits))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1000, 4099])
def test_mask_kernels_match_packbits_and_round_trip(n: int) -> None:
    """A dropout mask (0 or one scale) as bits: numpy's little-endian packbits layout, its maximum,
    and back to the same float32 values bit for bit (+0.0 where the mask was 0)."""
    from models.numerics import fused_kernels, pack_bits

    g = torch.Generator().manual_seed(n)
    scale = float(torch.tensor(1 / 0.7, dtype=torch.float32))
    mask = (torch.rand(n, generator=g) > 0.3).float() * scale
    bits = torch.empty(math.ceil(n / 8), dtype=torch.uint8)
    top = fused_kernels().pack_mask(mask.numpy(), bits.numpy())
    assert torch.equal(bits, pack_bits((mask != 0).view(torch.uint8), 1))
    assert top == mask.max().item()
    out = torch.empty(n)
    fused_kernels().unpack_mask(bits.numpy(), top, out.numpy())
    assert torch.equal(out.view(torch.int32), mask.view(torch.int32))
    mask[n // 2] = float("nan")
    assert math.isnan(fused_kernels().pack_mask(mask.numpy(), bits.numpy()))
