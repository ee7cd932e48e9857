"""BFP on float16 near its top, float64 below float32's range, and heavy-tailed data (the bound
table in docs/compression.md; ``python -m tests.numerics.test_dtypes_heavy_tails`` prints it)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.numerics import BfpCodec, BfpFormat, decode, encode, error_stats

torch.set_num_threads(1)

FLOAT16_MAX = 65504.0
formats = st.builds(
    BfpFormat,
    block_size=st.sampled_from([1, 5, 32]),
    mantissa_bits=st.integers(2, 8),
    rounding=st.sampled_from(["nearest", "stochastic"]),
    levels=st.sampled_from(["uniform", "log"]),
    outlier_fraction=st.sampled_from([0.0, 0.1]),
)
# Finite float16 values, weighted towards the top octaves where 2**16 would overflow.
near_top = st.floats(2.0**14, FLOAT16_MAX, width=16)
float16_values = st.one_of(
    near_top, st.floats(-FLOAT16_MAX, FLOAT16_MAX, width=16), near_top.map(lambda v: -v)
)


@settings(max_examples=300, deadline=None)
@given(fmt=formats, data=st.lists(float16_values, min_size=1, max_size=80), preserve=st.booleans())
def test_float16_never_decodes_finite_input_to_inf(fmt: BfpFormat, data: list[float], preserve: bool) -> None:
    x = torch.tensor(data, dtype=torch.float16)
    codec = BfpCodec(fmt, torch.Generator().manual_seed(0), preserve_signs=preserve)
    packed = codec.encode(x)
    y = codec.decode(packed)
    assert y.dtype == torch.float16 and bool(torch.isfinite(y).all()), (x, y)
    # The bound, plus the final rounding to float16 (half an ulp: 2**-11 relative).
    error = (y.double() - x.double()).abs()
    assert bool((error <= codec.error_bound(packed) + y.double().abs() * 2.0**-11).all())
    if preserve:
        assert torch.equal(y > 0, x > 0) and torch.equal(y < 0, x < 0)


def test_float16_top_block_clamps_to_largest_finite() -> None:
    x = torch.tensor([FLOAT16_MAX, -FLOAT16_MAX, 40000.0, 1.0], dtype=torch.float16)
    y = decode(encode(x, BfpFormat(block_size=4, levels="log")))
    assert y[0].item() == FLOAT16_MAX and y[1].item() == -FLOAT16_MAX


def test_float64_beyond_float32_range() -> None:
    tiny = [1e-50, -1e-300, 5e-46, -2e-45, 1e-40]  # below float32's smallest subnormal, then within it
    x = torch.tensor([*tiny, 0.0, 1e40, -1e300, 3.0], dtype=torch.float64)
    fmt = BfpFormat(block_size=32)
    codec = BfpCodec(fmt)
    packed = codec.encode(x)
    y = codec.decode(packed)
    assert y.dtype == torch.float64
    # Beyond float32's max: side storage, exact.
    assert y[6].item() == 1e40 and y[7].item() == -1e300 and packed.n_side == 2
    # Below its range: signs kept (the smallest code), absolute error within the floor's bound.
    assert torch.equal(torch.sign(y[:5]), torch.sign(x[:5])) and y[5].item() == 0.0
    assert bool(((y - x).abs() <= codec.error_bound(packed)).all())
    # Without sign preservation they flush to zero instead, also within the bound.
    flushed = decode(encode(x, fmt, preserve_signs=False))
    assert bool((flushed[:4] == 0).all()) and flushed[6].item() == 1e40


# --- heavy-tailed data --------------------------------------------------------------------------

HEAVY_N = 1 << 16


def heavy_tailed(kind: str, seed: int = 0) -> torch.Tensor:
    """``student_t``: Student-t with 2 degrees of freedom (infinite variance); ``lognormal``:
    exp(2 N(0,1)) with random signs. float32, HEAVY_N elements."""
    generator = torch.Generator().manual_seed(seed)
    normal = torch.randn(HEAVY_N, generator=generator, dtype=torch.float64)
    if kind == "student_t":
        chi2 = (torch.randn(HEAVY_N, 2, generator=generator, dtype=torch.float64) ** 2).sum(1)
        return (normal / torch.sqrt(chi2 / 2)).float()
    signs = torch.where(torch.rand(HEAVY_N, generator=generator) < 0.5, -1.0, 1.0).double()
    return (torch.exp(2.0 * normal) * signs).float()


# Measured L2 relative error (lifted, not lifted), as in docs/compression.md; the test allows 10%.
HEAVY_TABLE: dict[str, dict[str, tuple[float, float]]] = {
    "bfp(b=32,m=8,e=8,r=nearest,l=uniform,o=0.0)": {
        "student_t": (0.0224, 0.0154),
        "lognormal": (0.0609, 0.0113),
    },
    "bfp(b=32,m=6,e=8,r=nearest,l=uniform,o=0.0)": {
        "student_t": (0.1294, 0.0579),
        "lognormal": (0.2599, 0.0328),
    },
    "bfp(b=32,m=4,e=8,r=nearest,l=uniform,o=0.0)": {
        "student_t": (0.6781, 0.1783),
        "lognormal": (1.0724, 0.0831),
    },
    "bfp(b=32,m=3,e=8,r=nearest,l=uniform,o=0.0)": {
        "student_t": (1.4743, 0.2916),
        "lognormal": (2.1645, 0.1481),
    },
    "bfp(b=32,m=4,e=8,r=nearest,l=log,o=0.0)": {"student_t": (0.3274, 0.1646), "lognormal": (0.5497, 0.1564)},
    "bfp(b=32,m=4,e=8,r=nearest,l=uniform,o=0.01)": {
        "student_t": (0.2264, 0.1109),
        "lognormal": (0.186, 0.039),
    },
    "bfp(b=32,m=3,e=8,r=nearest,l=uniform,o=0.01)": {
        "student_t": (0.5487, 0.2058),
        "lognormal": (0.3917, 0.0666),
    },
    "bfp(b=32,m=4,e=8,r=stochastic,l=uniform,o=0.0)": {
        "student_t": (0.6827, 0.2858),
        "lognormal": (1.0732, 0.132),
    },
}


def measure(fmt: BfpFormat, x: torch.Tensor, preserve_signs: bool) -> tuple[float, float, float]:
    """(L2 relative error, max |error| / 2**E of its block, mean per-element relative error)."""
    codec = BfpCodec(fmt, torch.Generator().manual_seed(0), preserve_signs=preserve_signs)
    packed = codec.encode(x)
    y = codec.decode(packed)
    error = (y.double() - x.double()).abs()
    bound = codec.error_bound(packed)
    assert bool((error <= bound).all()), f"{fmt}: an element outside the bound"
    power = bound / fmt.max_error_fraction()  # 2**E per element (0 at side entries)
    inside = power > 0
    fraction = float((error[inside] / power[inside]).max())
    return error_stats(x, y).relative_error, fraction, float((error / x.double().abs()).mean())


@pytest.mark.parametrize("text", list(HEAVY_TABLE))
def test_heavy_tailed_inputs_hold_the_documented_bounds(text: str) -> None:
    fmt = BfpFormat.parse(text)
    for kind, documented in HEAVY_TABLE[text].items():
        x = heavy_tailed(kind)
        for preserve, figure in zip((True, False), documented, strict=True):
            relative, fraction, _ = measure(fmt, x, preserve)
            assert fraction <= fmt.max_error_fraction()
            assert relative <= 1.1 * figure, (kind, preserve, relative, figure)
        # Rounding small values to zero is never worse in L2 than lifting them to the smallest code.
        assert documented[1] <= documented[0]


def main() -> None:
    """Print the table rows of docs/compression.md."""
    for text in HEAVY_TABLE:
        fmt = BfpFormat.parse(text)
        cells, worst = [], 0.0
        for kind in ("student_t", "lognormal"):
            x = heavy_tailed(kind)
            lifted, not_lifted = measure(fmt, x, True), measure(fmt, x, False)
            cells.append(f"{lifted[0]:.4f} / {not_lifted[0]:.4f} | {lifted[2]:.3g} / {not_lifted[2]:.3g}")
            worst = max(worst, lifted[1], not_lifted[1])
        print(f"| `{text}` | {' | '.join(cells)} | {worst:.4f} | {fmt.max_error_fraction():.3g} |")


if __name__ == "__main__":
    main()
