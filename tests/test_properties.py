"""Properties (hypothesis): RCEIL scale minimality, dequantisation error, grad_x against float64 autograd,
grad_weight against NumPy's pairwise float32 sum."""

from __future__ import annotations

import numpy as np
import torch
from _compare import assert_group_grad_matches, assert_matches_reference, sum_magnitude
from _oracles import assert_close_to_autograd, known_gradient_inputs
from hypothesis import given, settings
from hypothesis import strategies as st

import swiglu_ops
from swiglu_ops.numerics import mx

PROPERTY = settings(deadline=None, max_examples=30)
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Largest binade such that 32 * value stays finite (the B half of known_gradient_inputs), smallest binade.
EXPONENTS = {torch.bfloat16: (-133, 121), torch.float16: (-24, 9), torch.float32: (-149, 121)}


def random_gradient(seed: int, m: int, n: int, dtype: torch.dtype, lo: int, hi: int) -> torch.Tensor:
    """Values with random signs, mantissas and binade in [lo, hi]; some exact zeros and -0.0."""
    rng = np.random.default_rng(seed)
    exp = rng.integers(lo, hi + 1, size=(m, n)).astype(np.float64)
    val = np.ldexp(rng.uniform(1.0, 2.0, size=(m, n)), exp.astype(np.int64)) * rng.choice([-1.0, 1.0], (m, n))
    val[rng.random((m, n)) < 0.05] = 0.0
    val[rng.random((m, n)) < 0.02] = -0.0
    return torch.from_numpy(val).to(dtype)


def exponent_window(dtype):
    lo, hi = EXPONENTS[dtype]
    return st.integers(lo, hi).flatmap(lambda a: st.tuples(st.just(a), st.integers(a, min(a + 12, hi))))


@PROPERTY
@given(
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
    m=st.integers(1, 70),
    seed=st.integers(0, 2**32 - 1),
    dst=st.sampled_from([torch.float8_e4m3fn, torch.float8_e5m2]),
)
def test_rceil_scale_is_the_smallest_power_of_two_that_fits(backend, dtype, data, m, seed, dst):
    """For every block (both axes): amax * 2**(127 - E) <= max, and for E > 0 with a normal amax,
    amax * 2**(128 - E) > max, i.e. one power of two less would overflow the FP8 range."""
    lo, hi = data.draw(exponent_window(dtype))
    x, y_grad, grad = known_gradient_inputs(random_gradient(seed, m, 32, dtype, lo, hi))
    _, s1, _, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, y_grad, dst_dtype=dst, backend=backend)
    fmax = mx.fp8_format(dst).max_value
    g = grad.double().abs()
    amax1 = g.reshape(m, 2, 32).amax(-1)
    rows = -(-m // 32) * 32
    padded = torch.cat([g, torch.zeros(rows - m, 64, dtype=torch.float64)])
    amax2 = padded.reshape(-1, 32, 64).amax(1)  # [blocks, C]
    e1 = s1.view(torch.uint8).reshape(m, 2).double()
    e2 = s2.view(torch.uint8).permute(0, 2, 1).reshape(-1, 64)[: amax2.shape[0]].double()
    for amax, e in ((amax1, e1), (amax2, e2)):
        assert bool((e[amax == 0] == 0).all())
        assert bool((amax * torch.exp2(127 - e) <= fmax).all())
        tight = (e > 0) & (amax >= 2.0**-126)
        assert bool((amax * torch.exp2(128 - e) > fmax)[tight].all())


def fp8_half_step(y: torch.Tensor, fmt: mx.FP8Format) -> torch.Tensor:
    """Half the FP8 spacing at the scaled value ``y`` (float64, finite, |y| <= max)."""
    binade = torch.floor(torch.log2(y.abs().clamp(min=2.0**-200)))
    return torch.exp2(binade.clamp(min=fmt.min_normal_exp) - fmt.mbits - 1)


@PROPERTY
@given(
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
    m=st.integers(1, 100),
    seed=st.integers(0, 2**32 - 1),
    dst=st.sampled_from([torch.float8_e4m3fn, torch.float8_e5m2]),
    cuts=st.lists(st.integers(0, 100)),
)
def test_dequantized_values_within_half_a_step(backend, dtype, data, m, seed, dst, cuts):
    """mx_dequantize(y, scale) differs from the 16-bit gradient by at most half an FP8 step times the
    scale, on both axes, with random group boundaries."""
    lo, hi = data.draw(exponent_window(dtype))
    x, y_grad, grad = known_gradient_inputs(random_gradient(seed, m, 32, dtype, lo, hi))
    ends = sorted({min(c, m) for c in cuts} | {m})
    group_index = torch.tensor(ends)
    y1, s1, y2, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, y_grad, group_index, dst_dtype=dst, backend=backend
    )
    fmt = mx.fp8_format(dst)
    g = grad.double()
    for data_, scale, axis in ((y1, s1, -1), (y2, s2, -2)):
        deq = swiglu_ops.mx_dequantize(data_, scale, axis=axis, group_index=group_index, dtype=torch.float64)
        # the factor 2**(E - 127) of each element, recovered from a dequantised all-ones code tensor
        ones = torch.full_like(data_.view(torch.uint8), 0x38 if fmt is mx.E4M3FN else 0x3C).view(dst)
        factor = swiglu_ops.mx_dequantize(
            ones, scale, axis=axis, group_index=group_index, dtype=torch.float64
        )
        assert torch.equal(torch.isnan(factor), torch.isnan(deq))
        ok = ~torch.isnan(factor)
        err = (deq - g).abs()[ok]
        assert bool((err <= fp8_half_step(g[ok] / factor[ok], fmt) * factor[ok]).all())


@PROPERTY
@given(
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 8),
    hidden=st.integers(1, 80),
    clamp=st.sampled_from([0.0, 0.25, 1.0, 3.0, 7.0, float("inf")]),
    weighted=st.booleans(),
    valid=st.one_of(st.none(), st.integers(-2, 10)),
    seed=st.integers(0, 2**32 - 1),
)
def test_grad_x_matches_float64_autograd(backend, dtype, rows, hidden, clamp, weighted, valid, seed):
    """grad_x = d/dx sum(dy * silu(min(g, c)) * clip(u, -c, c) * w) in float64, away from the clamp
    boundaries, within the dtype's rounding; rows past the group count are +-0."""
    gen = torch.Generator().manual_seed(seed)
    dy = (torch.randn(rows, hidden, generator=gen, dtype=torch.float64) * 2).to(dtype)
    x = (torch.randn(rows, 2 * hidden, generator=gen, dtype=torch.float64) * 4).to(dtype)
    if 0 < clamp < float("inf"):
        near = (x.double().abs() - clamp).abs() < 0.05 * clamp
        x = torch.where(near, torch.zeros_like(x), x)
    w = torch.rand(rows, 1, generator=gen) * 4 - 2 if weighted else None
    y_origin = torch.randn(rows, hidden, generator=gen).to(dtype) if weighted else None
    group_index = None if valid is None else torch.tensor([valid])
    got = swiglu_ops.swiglu_group_grad(dy, x, w, y_origin, group_index, clamp, backend=backend)
    assert_close_to_autograd(got[0], dy, x, w, clamp, None if valid is None else min(max(valid, 0), rows))
    if backend != "reference":
        want = swiglu_ops.swiglu_group_grad(dy, x, w, y_origin, group_index, clamp, backend="reference")
        assert_group_grad_matches(got, want, backend, (dy, x, w, y_origin, clamp))


def numpy_grad_weight(dy: torch.Tensor, y_origin: torch.Tensor) -> torch.Tensor:
    products = dy.float().numpy() * y_origin.float().numpy()
    return torch.from_numpy(np.sum(products, axis=-1))


def grad_weight_of(dy, y_origin, backend):
    rows, hidden = dy.shape
    x = torch.zeros(rows, 2 * hidden, dtype=dy.dtype)
    return swiglu_ops.swiglu_group_grad(dy, x, torch.ones(rows), y_origin, backend=backend)[1]


def test_grad_weight_is_numpy_pairwise_sum_for_every_small_hidden(backend):
    """H = 1 .. 300 (every leaf size and split of NumPy's pairwise tree) and 1000, 4097, 8200."""
    gen = torch.Generator().manual_seed(0)
    for hidden in [*range(1, 301), 1000, 4097, 8200]:
        dtype = DTYPES[hidden % 3]
        dy = torch.randn(3, hidden, generator=gen).to(dtype)
        y_origin = (torch.randn(3, hidden, generator=gen) * 100).to(dtype)
        assert_matches_reference(
            grad_weight_of(dy, y_origin, backend),
            numpy_grad_weight(dy, y_origin),
            backend,
            f"grad_weight (H={hidden})",
            grad_weight=True,
            magnitude=sum_magnitude(dy, y_origin),
        )


@PROPERTY
@given(
    hidden=st.one_of(st.integers(1, 300), st.sampled_from([1000, 4097])),
    dtype=st.sampled_from(DTYPES),
    decades=st.sampled_from([-30, -3, 0, 2, 15]),
    seed=st.integers(0, 2**32 - 1),
)
def test_grad_weight_matches_numpy(backend, hidden, dtype, decades, seed):
    """Random magnitudes (including products that underflow or grow large) against numpy.sum."""
    if dtype == torch.float16:
        decades = min(max(decades, -3), 2)  # keep fp16 inputs finite and mostly normal
    scale = 10.0**decades
    gen = torch.Generator().manual_seed(seed)
    dy = (torch.randn(2, hidden, generator=gen, dtype=torch.float64) * scale).to(dtype)
    y_origin = (torch.randn(2, hidden, generator=gen, dtype=torch.float64) * scale).to(dtype)
    assert_matches_reference(
        grad_weight_of(dy, y_origin, backend),
        numpy_grad_weight(dy, y_origin),
        backend,
        "grad_weight",
        grad_weight=True,
        magnitude=sum_magnitude(dy, y_origin),
    )
