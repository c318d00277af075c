"""clipped_swiglu / clipped_swiglu_grad (shared/spec/clipped_swiglu.md with README 6.1), every backend.

Oracles, none of which calls a backend:

- ``spec12_forward`` / ``spec12_backward``: section 12's pseudocode (and section 10's for the clamp_mode-1
  extension) transcribed literally: host-side valid count, row slicing, strided A/B columns, one fp32 torch op
  per step. The reference must equal it bit for bit; fast backends within the contract's tolerances
  (``_compare.assert_matches_reference``).
- ``float64_forward`` / ``float64_backward``: the formulas in float64 from the same inputs (only the exp
  argument ``t`` rounded to fp32, as the spec says tests must), within rounding bounds stated below.
- the published cases of section 8.1-8.3; exact special values (``exp`` cannot move them); Hugging Face's
  formula differentiated by torch autograd for the gradient's boundary behaviour (section 9).
- relations that must hold bitwise for one backend: clamped inputs equal the boundary, interleaved equals
  chunked on permuted columns, any ``dim`` equals the 2-D ``[pre, cut]`` view, rows past the valid count,
  non-contiguous inputs, ``out=``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _compare import _bits, assert_bitwise_equal, assert_exact, assert_matches_reference, assert_within_ulp

import swiglu_ops

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = [BF16, F16, F32]
INF, NAN = float("inf"), float("nan")
GPT_OSS = {"alpha": 1.702, "limit": 7.0, "bias": 1.0}


def fp32(value: float) -> float:
    return float(np.float32(value))


def fwd(x, group_index=None, *, backend, **kwargs):
    return swiglu_ops.clipped_swiglu(x, group_index, backend=backend, **kwargs)


def bwd(dy, x, group_index=None, *, backend, **kwargs):
    return swiglu_ops.clipped_swiglu_grad(dy, x, group_index, backend=backend, **kwargs)


def bwd_mode1(dy, x, group_index=None, *, backend, dim=-1, limit=7.0, interleaved=True, **_ignored):
    """The library's clamp_mode-1 backward (section 10), through its private custom op."""
    return torch.ops.swiglu_ops._clipped_swiglu_grad_mode1(
        dy, x, group_index, dim=dim, limit=limit, interleaved=interleaved, backend=backend
    )


def gradient(mode: int):
    return bwd if mode == 0 else bwd_mode1


def zeros_bits(t: torch.Tensor) -> bool:
    """Every element is +0.0 (all bits zero)."""
    return bool((_bits(t) == 0).all())


# ------------------------------------------------------------------------------------------ the oracles


def wrapping_sum(group_index: torch.Tensor) -> int:
    """int64 sum with two's-complement wraparound, computed in Python (int32 entries widened first)."""
    total = sum(int(v) for v in group_index.tolist())
    return (total + 2**63) % 2**64 - 2**63


def _view(x, dim):
    d = dim % x.dim()
    pre, cut = math.prod(x.shape[:d]), math.prod(x.shape[d:])
    half_shape = (*x.shape[:d], x.shape[d] // 2, *x.shape[d + 1 :])
    return d, pre, cut, half_shape


def _valid(group_index, pre):
    return pre if group_index is None else min(max(wrapping_sum(group_index), 0), pre)


def _columns(cut, interleaved):
    return (slice(0, cut, 2), slice(1, cut, 2)) if interleaved else (slice(0, cut // 2), slice(cut // 2, cut))


def _consts(alpha, limit, bias):
    return tuple(torch.tensor(v, dtype=F32) for v in (limit, alpha, bias))


def spec12_forward(
    x, group_index=None, *, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, clamp_mode=0
):
    """clipped_swiglu.md section 12, forward, line by line."""
    _, pre, cut, half_shape = _view(x, dim)
    if pre * cut == 0:
        return torch.empty(half_shape, dtype=x.dtype)
    X = x.contiguous().view(pre, cut).float()
    L, al, bi = _consts(alpha, limit, bias)
    v = _valid(group_index, pre)
    a_cols, b_cols = _columns(cut, interleaved)
    A, B = X[:v, a_cols], X[:v, b_cols]
    if clamp_mode == 0:
        At = torch.minimum(A, L)
        y = (At / (torch.exp(At * -al) + 1)) * (torch.maximum(torch.minimum(B, L), -L) + bi)
    else:
        y = torch.minimum(A / (torch.exp(A * -1) + 1), L) * torch.maximum(torch.minimum(B, L), -L)
    Y = torch.zeros(pre, cut // 2)
    Y[:v] = y
    return Y.to(x.dtype).view(half_shape)


def spec12_backward(
    grad_y, x, group_index=None, *, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, clamp_mode=0
):
    """clipped_swiglu.md section 12, backward (clamp_mode 0), and section 10's proposal (clamp_mode 1)."""
    _, pre, cut, _ = _view(x, dim)
    if pre * cut == 0:
        return torch.empty(x.shape, dtype=x.dtype)
    X = x.contiguous().view(pre, cut).float()
    L, al, bi = _consts(alpha, limit, bias)
    v = _valid(group_index, pre)
    a_cols, b_cols = _columns(cut, interleaved)
    a, b = X[:v, a_cols], X[:v, b_cols]
    DY = grad_y.contiguous().view(pre, cut // 2)[:v].float()
    if clamp_mode == 0:
        At = torch.minimum(a, L)
        s = (At * 0 + 1) / (torch.exp(At * -al) + 1)
        Bp = torch.maximum(torch.minimum(b, L), -L) + bi
        db = (DY * At) * s
        da = ((((((1 - s) * At) * al) + 1) * s) * Bp) * DY
        a_ok = a <= L
    else:
        den = torch.exp(a * -1) + 1
        silu = a / den
        s = 1 / den
        db = DY * torch.minimum(silu, L)
        t = 1 - s
        t = t * a
        t = t + 1
        t = t * s
        t = t * torch.maximum(torch.minimum(b, L), -L)
        da = t * DY
        a_ok = silu <= L
    da = torch.where(a_ok, da, 0.0)
    db = torch.where((b <= L) & (b >= -L), db, 0.0)
    GX = torch.zeros(pre, cut)
    GX[:v, a_cols] = da
    GX[:v, b_cols] = db
    return GX.to(x.dtype).view(x.shape)


def _halves64(x, interleaved):
    x64 = x.double()
    if interleaved:
        return x64[..., 0::2], x64[..., 1::2]
    return x64.chunk(2, dim=-1)


def float64_forward(x, *, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, clamp_mode=0):
    """The forward in float64 (2-D x, dim=-1, no groups); only ``t = A~ * -alpha`` rounded to fp32."""
    A, B = _halves64(x, interleaved)
    L, al, bi = fp32(limit), fp32(alpha), fp32(bias)
    Bt = B.clamp(-L, L)
    if clamp_mode == 0:
        At = A.clamp(max=L)
        t = (At.float() * torch.tensor(-al, dtype=F32)).double()
        return At / (torch.exp(t) + 1) * (Bt + bi)
    return (A / (torch.exp(-A) + 1)).clamp(max=L) * Bt


def float64_backward(dy, x, *, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, clamp_mode=0):
    """``(grad_x, magnitude, masked)`` in float64 in x's column layout: the derivative with closed masks
    (selects); per element the size of the terms the gate gradient sums (``1 + alpha A~ (1 - s)`` cancels);
    where a mask applies (the operator must give +0.0 there)."""
    A, B = _halves64(x, interleaved)
    dy = dy.double()
    L, al, bi = fp32(limit), fp32(alpha), fp32(bias)
    Bt = B.clamp(-L, L)
    if clamp_mode == 0:
        At = A.clamp(max=L)
        t = (At.float() * torch.tensor(-al, dtype=F32)).double()
        s = 1 / (torch.exp(t) + 1)
        inner = al * At * (1 - s)
        da, db = dy * (Bt + bi) * s * (1 + inner), dy * At * s
        mag_a, mag_b = (dy * (Bt + bi) * s).abs() * (1 + inner.abs()), db.abs()
        a_ok = A <= L
    else:
        s = 1 / (torch.exp(-A) + 1)
        silu = A * s
        inner = A * (1 - s)
        da, db = dy * Bt * s * (1 + inner), dy * silu.clamp(max=L)
        mag_a, mag_b = (dy * Bt * s).abs() * (1 + inner.abs()), db.abs()
        a_ok = silu <= L
    b_ok = (B <= L) & (B >= -L)
    da, db = torch.where(a_ok, da, 0.0), torch.where(b_ok, db, 0.0)

    def merge(ta, tb):
        return torch.stack([ta, tb], dim=-1).flatten(-2) if interleaved else torch.cat([ta, tb], dim=-1)

    return merge(da, db), torch.nan_to_num(merge(mag_a, mag_b), nan=0.0, posinf=0.0), merge(~a_ok, ~b_ok)


#: Relative bound against float64: one unit of the output format (its rounding, plus fp32 intermediates
#: that may push a near-tie over), and 8 fp32 ulp for fp32 outputs (exp, division and three roundings).
_REL = {BF16: 2.0**-7, F16: 2.0**-10, F32: 2.0**-20}
#: Results that underflow into the format's subnormals.
_TINY = {BF16: 2.0**-133, F16: 2.0**-24, F32: 2.0**-149}


def assert_close_to_float64(got, expected, magnitude=None, name="tensor"):
    """Elementwise: NaN positions equal, infinities equal, ``|got - expected| <= rel * max(|expected|,
    magnitude) + tiny``."""
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    nan_g, nan_e = torch.isnan(got.double()), torch.isnan(expected)
    assert torch.equal(nan_g, nan_e), (
        f"{name}: NaN positions differ at {(nan_g != nan_e).nonzero()[:5].tolist()}"
    )
    g, e = got.double(), expected
    scale = e.abs() if magnitude is None else torch.maximum(e.abs(), magnitude)
    tol = _REL[got.dtype] * scale + _TINY[got.dtype]
    inf = torch.isinf(e) | torch.isinf(g)
    ok = torch.where(inf, g == e, (g - e).abs() <= tol) | nan_e
    bad = ~ok
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} element(s) off float64, first {bad.nonzero()[0].tolist()}: "
        f"{g[bad][0].item()!r} vs {e[bad][0].item()!r}"
    )


# ------------------------------------------------------------------------------------------ shared data


def random_x(shape, dtype, seed, scale=4.0):
    """x ~ N(0, scale^2) (about 8 % of the values beyond +-7 at scale 4) with every 7th element set exactly to
    +-7 (the limit) and a few beyond it."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    flat = x.view(-1)
    flat[::7] = torch.tensor([7.0, -7.0, 7.0, 8.5, -7.0, -30.0])[torch.arange(flat[::7].numel()) % 6]
    return x.to(dtype)


def random_dy(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed + 1000)
    return torch.randn(shape, generator=gen).to(dtype)


#: (attrs, label): the operator's parameter sets used across the conformance tests.
ATTRS = [
    ({}, "gpt-oss"),
    ({"alpha": 1.0, "limit": 3.0, "bias": 1.702}, "example-swapped"),
    ({"alpha": -0.75, "limit": INF, "bias": -2.5}, "inf-limit"),
    ({"interleaved": False, "alpha": 2.5, "limit": 5.5, "bias": 0.0}, "chunked"),
]
ATTR_IDS = [label for _, label in ATTRS]


def _attrs(attrs, interleaved=True):
    return {**GPT_OSS, "interleaved": interleaved, **attrs}


# ------------------------------------------------------------------------- published cases (section 8)


def _bits_of(values, dtype):
    view = torch.int32 if dtype == F32 else torch.int16
    return torch.tensor(values, dtype=torch.int64).to(view).view(dtype)


EXAMPLE_X = torch.arange(64, dtype=F32).reshape(2, 32)
# Section 8.1 (aclnnClippedSwiglu example: alpha 1.0, limit 7.0, bias 1.702, group_index [1]): per dtype the
# codes of y[0, 0:5]; y[0, 4:16] all equal y[0, 4]; row 1 is past the valid count.
EXAMPLE_81 = {
    F32: [0x00000000, 0x4104873B, 0x41D29B4A, 0x425054E4, 0x42736F1B],
    BF16: [0x0000, 0x4105, 0x41D3, 0x4250, 0x4273],
    F16: [0x0000, 0x4824, 0x4E95, 0x5283, 0x539B],
}
# Section 8.2 (the same inputs with clamp_mode 1; alpha and bias have no effect), fp32.
EXAMPLE_82 = [0x00000000, 0x40A91CF0, 0x419D1F49, 0x422795A9, 0x42440000]


def _expand_example(codes, dtype):
    row = _bits_of(codes + [codes[-1]] * 11, dtype)
    return torch.stack([row, torch.zeros(16, dtype=dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_published_forward_example_81(backend, dtype):
    y = fwd(EXAMPLE_X.to(dtype), torch.tensor([1]), alpha=1.0, limit=7.0, bias=1.702, backend=backend)
    assert_matches_reference(y, _expand_example(EXAMPLE_81[dtype], dtype), backend, "y")
    assert zeros_bits(y[1]), "row 1 (past the valid count) must be +0.0"


@pytest.mark.parametrize(("alpha", "bias"), [(1.0, 1.702), (1.702, 1.0), (-3.0, 0.0)])
def test_published_forward_example_82_clamp_mode_1(backend, alpha, bias):
    y = fwd(EXAMPLE_X, torch.tensor([1]), alpha=alpha, limit=7.0, bias=bias, clamp_mode=1, backend=backend)
    assert_matches_reference(y, _expand_example(EXAMPLE_82, F32), backend, "y")
    assert y[0, 4:].eq(49.0).all()  # silu(A >= 8) > 7, so g = 7, and B~ = 7


def _correctly_rounded_example_83():
    """Section 4 in numpy float32 with a correctly rounded ``exp(fp32(-1.702))``: da, db for A = B = 1."""
    f = np.float32
    t = f(f(1) * f(-f(1.702)))
    e = f(math.exp(float(t)))  # float64 exp rounded once: the correctly rounded fp32 exp here
    s = f(f(f(f(1) * f(0)) + f(1)) / f(e + f(1)))
    db = f(f(f(1) * f(1)) * s)
    u = f(f(f(f(f(f(s * f(-1)) + f(1)) * f(1)) * f(1.702)) + f(1)) * s)
    da = f(f(u * f(f(1) + f(1))) * f(1))
    return int(da.view(np.int32)), int(db.view(np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_published_gradient_example_83(backend, dtype):
    """x = ones(2, 32), grad_y = ones(2, 16), GPT-OSS attributes: every A position da, every B position db.

    The spec's fp32 codes (0x4008ad00 / 0x3f588613) were computed with numpy's exp, which is one ulp below the
    correctly rounded ``exp(-1.702f)`` (0x3e3ab1b5, what torch's exp returns): with it s is 0x3f588612, the
    correctly rounded sigmoid(1.702f), and da 0x4008ad01. The fp32 check is therefore exact against that
    recomputation and within one ulp of the published codes; bf16 and fp16 are exact as published."""
    published = {F32: (0x4008AD00, 0x3F588613), BF16: (0x4009, 0x3F59), F16: (0x4045, 0x3AC4)}
    grad = bwd(torch.ones(2, 16, dtype=dtype), torch.ones(2, 32, dtype=dtype), backend=backend, **GPT_OSS)
    codes = _correctly_rounded_example_83() if dtype == F32 else published[dtype]
    expected = _bits_of(list(codes) * 16, dtype).expand(2, 32)
    assert_matches_reference(grad, expected, backend, "grad_x")
    if dtype == F32:
        assert _correctly_rounded_example_83() == (0x4008AD01, 0x3F588612)
        assert_within_ulp(grad, _bits_of(list(published[F32]) * 16, F32).expand(2, 32), ulps=1, name="grad_x")


# -------------------------------------------------------------------------- exact special values


# (A, B, y) with alpha 1.702, limit 7, bias 1 (clamp_mode 0). Each y is exact whatever exp returns:
# A = +-0 gives glu = +-0; A <= -100 makes exp overflow, glu = A~ / inf = -0; B = -1 gives B' = 0.
SPECIAL_FORWARD = [
    (0.0, 2.0, 0.0),
    (-0.0, 2.0, -0.0),
    (-0.0, -3.0, 0.0),  # -0 * (-2)
    (-100.0, 2.0, -0.0),
    (-100.0, -5.0, 0.0),  # B' = -4
    (-INF, 2.0, NAN),  # A~ = -inf: -inf / inf
    (NAN, 2.0, NAN),
    (0.0, NAN, NAN),
    (0.0, INF, 0.0),  # B~ = 7
    (-100.0, INF, -0.0),
    (INF, -1.0, 0.0),  # A~ = 7 > 0, B' = 0
    (3.0, -1.0, 0.0),
    (-3.0, -1.0, -0.0),
    (NAN, -1.0, NAN),
]
# clamp_mode 1 (limit 7; alpha/bias unused): silu(+inf) = inf -> g = 7; silu(20) = 20 (exp(-20) < 2^-25).
SPECIAL_FORWARD_MODE1 = [
    (0.0, 2.0, 0.0),
    (-100.0, 2.0, -0.0),
    (INF, 2.0, 14.0),
    (INF, INF, 49.0),
    (INF, -INF, -49.0),
    (20.0, 3.0, 21.0),
    (-INF, 2.0, NAN),
    (NAN, 2.0, NAN),
    (0.0, NAN, NAN),
]


def _pairs(rows, dtype):
    a = torch.tensor([r[0] for r in rows], dtype=dtype)
    b = torch.tensor([r[1] for r in rows], dtype=dtype)
    return torch.stack([a, b], dim=-1).reshape(1, -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("mode", "table"), [(0, SPECIAL_FORWARD), (1, SPECIAL_FORWARD_MODE1)])
def test_forward_special_values(backend, dtype, mode, table):
    y = fwd(_pairs(table, dtype), clamp_mode=mode, backend=backend, **GPT_OSS)
    assert_exact(y, torch.tensor([[r[2] for r in table]], dtype=dtype), "y")


# (A, B, da, db) for dy = -1.5, alpha 1.702, limit 7, bias 1 (clamp_mode 0). A = +-0 gives s = 0.5 and
# da = 0.5 * B' * dy exactly; A = -100 gives s = 0 (exp overflows), so both gradients are +0.
SPECIAL_BACKWARD = [
    (0.0, 2.0, -2.25, -0.0),
    (0.0, 7.0, -6.0, -0.0),  # B == +L: closed interval, db passes (its value is -0)
    (0.0, -7.0, 4.5, -0.0),  # B == -L passes
    (0.0, 7.5, -6.0, 0.0),  # B beyond L: db masked to +0 by the select, da uses B~ = 7
    (0.0, INF, -6.0, 0.0),
    (0.0, -INF, 4.5, 0.0),
    (0.0, NAN, NAN, 0.0),  # B' NaN; db masked (NaN compares false) -> +0
    (NAN, 2.0, 0.0, NAN),  # da masked -> +0; db = (dy * NaN) * s
    (-INF, 2.0, NAN, NAN),  # one = -inf * 0 + 1 = NaN
    (-0.0, 2.0, -2.25, 0.0),  # db = (dy * -0) * 0.5 = +0
    (-100.0, 2.0, 0.0, 0.0),
    (NAN, NAN, 0.0, 0.0),  # both masked
    (8.0, NAN, 0.0, 0.0),  # A beyond L masked, B NaN masked
]
# limit = +inf: the masks keep every finite value and +-inf (closed), the clamps do nothing.
SPECIAL_BACKWARD_INF = [
    (INF, 2.0, NAN, NAN),  # one = inf * 0 + 1 = NaN (950 form, sections 4 and 6)
    (0.0, INF, -INF, -0.0),
    (0.0, -INF, INF, -0.0),
    (0.0, 2.0, -2.25, -0.0),
]
# clamp_mode 1 extension: A = 0 gives s = 0.5, silu = 0, da = ((0.5 * 0 + 1) * 0.5) * B~ * dy.
SPECIAL_BACKWARD_MODE1 = [
    (0.0, 2.0, -1.5, -0.0),
    (0.0, 9.0, -5.25, 0.0),  # B~ = 7, db masked
    (NAN, 2.0, 0.0, NAN),  # silu NaN: da masked; db = dy * NaN
    (INF, 2.0, 0.0, -10.5),  # silu = inf > L: da masked; db = dy * min(inf, 7)
    (-100.0, 2.0, 0.0, 0.0),  # s = 0 -> da = ((1 * -100 + 1) * 0) * 2 * dy = +0; db = dy * -0
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("mode", "limit", "table"),
    [(0, 7.0, SPECIAL_BACKWARD), (0, INF, SPECIAL_BACKWARD_INF), (1, 7.0, SPECIAL_BACKWARD_MODE1)],
    ids=["mode0", "mode0-inf-limit", "mode1"],
)
def test_backward_special_values(backend, dtype, mode, limit, table):
    x = _pairs(table, dtype)
    dy = torch.full((1, len(table)), -1.5, dtype=dtype)
    expected = torch.tensor([[v for r in table for v in r[2:]]], dtype=dtype)
    grad = gradient(mode)(dy, x, backend=backend, alpha=1.702, limit=limit, bias=1.0)
    assert_exact(grad, expected, "grad_x")


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_inputs_equal_the_boundary(backend, dtype):
    """Any A >= L gives the forward of A == L, any B >= L that of B == L, any B <= -L that of -L. Backward:
    db of A > L equals db of A == L and da is +0 (the gate gradient passes only at A <= L, closed); da of
    |B| > L equals da of B == +-L and db is +0."""
    c = 7.0
    x = random_x((6, 40), dtype, seed=3)
    dy = random_dy((6, 20), dtype, seed=3)
    a, b = x[:, 0::2], x[:, 1::2]
    beyond = torch.tensor([7.5, 100.0, INF, 7.0625], dtype=dtype).repeat(30)[:120].reshape(6, 20)
    at_limit = torch.stack([torch.where(a > 0, c, a), torch.where(b > 0, c, -c)], -1).flatten(1).to(dtype)
    past = torch.stack([torch.where(a > 0, beyond, a), torch.where(b > 0, beyond, -beyond)], -1).flatten(1)
    for mode in (0, 1):
        y_at = fwd(at_limit, clamp_mode=mode, backend=backend, **GPT_OSS)
        y_past = fwd(past, clamp_mode=mode, backend=backend, **GPT_OSS)
        if mode == 0:
            assert_bitwise_equal(y_past, y_at, "y (mode 0)")
        else:  # mode 1 clamps the activation, not A: only the B clamp is an identity here
            b_only = torch.stack([at_limit[:, 0::2], past[:, 1::2]], -1).flatten(1)
            assert_bitwise_equal(fwd(b_only, clamp_mode=1, backend=backend, **GPT_OSS), y_at, "y (mode 1)")
    g_at = bwd(dy, at_limit, backend=backend, **GPT_OSS)
    g_past = bwd(dy, past, backend=backend, **GPT_OSS)
    gate_past = torch.stack([a > 0, torch.zeros_like(a, dtype=torch.bool)], -1).flatten(1)
    up_past = torch.stack([torch.zeros_like(b, dtype=torch.bool), torch.ones_like(b, dtype=torch.bool)], -1)
    up_past = up_past.flatten(1)
    masked = gate_past | up_past  # gate > L positions and every B position (|B| > L everywhere in `past`)
    assert zeros_bits(g_past[masked]), "gradients beyond the limit must be +0.0"
    assert_bitwise_equal(g_past[~masked], g_at[~masked], "unmasked gradients")
    assert not zeros_bits(g_at[up_past]), "at exactly +-L the up gradient passes (closed interval)"
    assert not zeros_bits(g_at[:, 0::2][a > 0]), "at exactly L the gate gradient passes (closed interval)"


def test_gradient_boundaries_match_hf_autograd(backend):
    """Section 9's verification vector: at A == L, |B| == L (passing) and beyond (masked), and with NaN,
    clipped_swiglu_grad equals torch autograd of Hugging Face's GPT-OSS formula (closed clamp_backward):
    the same zeros and NaNs exactly, the other values within 4 fp32 ulp."""
    x = torch.tensor([[7, 7, 7, -7, 7.0001, 1, 3, 7.0001, NAN, 1, 1, NAN]], dtype=F32)
    dy = torch.tensor([[0.5, -1.25, 2.0, 0.75, 1.5, -0.5]], dtype=F32)
    alpha, limit = fp32(1.702), 7.0
    x64 = x.double().requires_grad_()
    gate, up = x64[..., ::2], x64[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    ((up + 1) * glu).backward(dy.double())
    expected = x64.grad.float()
    grad = bwd(dy, x, backend=backend, alpha=1.702, limit=limit, bias=1.0)
    assert_within_ulp(grad, expected, ulps=4, name="grad_x")  # zeros and NaNs must match exactly
    assert torch.isnan(grad).tolist() == [[False] * 9 + [True, True, False]]
    assert zeros_bits(grad[0, [4, 7, 8, 11]])  # 7.0001 masked (gate and up), NaN masked
    assert not zeros_bits(grad[0, [0, 1, 2, 3]])  # exactly at the limit: passes


def test_clamp_mode_1_boundary_is_closed(backend):
    """clamp_mode 1 masks the gate gradient where silu(A) > L: with L set to the fp32 value silu(a0) computed
    by the operator, a0 passes (da equal to the unclamped da) and any larger A is masked."""
    a0 = 3.0
    probe = torch.tensor([[a0, 1.0]])
    silu_a0 = fwd(probe, limit=INF, clamp_mode=1, backend=backend).item()  # silu(a0) * clip(1) = silu(a0)
    x = torch.tensor([[a0, 2.0, a0 + 0.001, 2.0, 1.0, 2.0]])
    dy = torch.tensor([[-1.25, 0.5, 2.0]])
    at = bwd_mode1(dy, x, limit=silu_a0, backend=backend)
    free = bwd_mode1(dy, x, limit=1e30, backend=backend)
    assert_bitwise_equal(at[0, [0, 4]], free[0, [0, 4]], "gate gradient at and below the limit")
    assert zeros_bits(at[0, 2:3]), "silu(A) > L must mask the gate gradient"
    assert not zeros_bits(at[0, 0:1])


# ------------------------------------------------------------------- random data against the oracles


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attrs", [a for a, _ in ATTRS], ids=ATTR_IDS)
@pytest.mark.parametrize("mode", [0, 1])
def test_forward_matches_spec_and_float64(backend, dtype, attrs, mode):
    x = random_x((6, 40), dtype, seed=11)
    kwargs = _attrs(attrs)
    y = fwd(x, clamp_mode=mode, backend=backend, **kwargs)
    assert_matches_reference(y, spec12_forward(x, clamp_mode=mode, **kwargs), backend, "y")
    assert_close_to_float64(y, float64_forward(x, clamp_mode=mode, **kwargs), name="y")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attrs", [a for a, _ in ATTRS], ids=ATTR_IDS)
@pytest.mark.parametrize("mode", [0, 1])
def test_backward_matches_spec_and_float64(backend, dtype, attrs, mode):
    x = random_x((6, 40), dtype, seed=12)
    dy = random_dy((6, 20), dtype, seed=12)
    kwargs = _attrs(attrs)
    grad = gradient(mode)(dy, x, backend=backend, **kwargs)
    expected64, magnitude, masked = float64_backward(dy, x, clamp_mode=mode, **kwargs)
    assert_matches_reference(
        grad,
        spec12_backward(dy, x, clamp_mode=mode, **kwargs),
        backend,
        "grad_x",
        magnitude=magnitude.float(),
    )
    assert_close_to_float64(grad, expected64, magnitude, name="grad_x")
    assert zeros_bits(grad[masked]), "masked positions must be exactly +0.0 (a select)"
    assert masked.any() == math.isfinite(kwargs["limit"])  # the data reach past finite limits


def test_mode1_ignores_alpha_and_bias(backend):
    x = random_x((6, 40), F32, seed=13)
    y = fwd(x, clamp_mode=1, backend=backend)
    for alpha, bias in ((1.0, 0.0), (-5.0, 3.0)):
        assert_bitwise_equal(fwd(x, clamp_mode=1, alpha=alpha, bias=bias, backend=backend), y, "y")


def test_fp16_overflow_becomes_inf(backend):
    """One rounding to the I/O dtype, RNE without saturation: an fp16 result above 65504 is inf."""
    x = torch.tensor([[200.0, 100.0, 0.0, 2.0]], dtype=F16)
    y = fwd(x, limit=1000.0, bias=300.0, backend=backend)  # 200 * 400 = 80000 > 65504
    assert y[0, 0].item() == INF and y[0, 1].item() == 0.0
    dy = torch.tensor([[4000.0, 1.0]], dtype=F16)
    grad = bwd(dy, x, limit=1000.0, bias=300.0, backend=backend)
    assert grad[0, 0].item() == INF  # da = 400 * 4000 * (~1)


# ------------------------------------------------------------------------------ groups (valid rows)

GROUPS = [
    ([2, 0, 3], torch.int64, 5),
    ([7], torch.int64, 7),
    ([8], torch.int64, 8),  # sum == rows
    ([100], torch.int64, 8),  # sum > rows
    ([-3], torch.int64, 0),  # sum < 0
    ([0], torch.int64, 0),
    ([-5, 7], torch.int64, 2),  # negative values accepted, only the sum counts
    ([2**62, 2**62, 2**62, 2**62, 3], torch.int64, 3),  # the int64 sum wraps to 3
    ([2**63 - 1, 2**63 - 1], torch.int64, 0),  # wraps to -2
    ([2**31 - 1, 2**31 - 1], torch.int32, 8),  # int32 widened first: 2^32 - 2, not -2
    ([1, 2, 0, 1], torch.int32, 4),
]


@pytest.mark.parametrize(("counts", "dtype", "valid"), GROUPS, ids=[str(g[0])[:24] for g in GROUPS])
def test_group_index_bounds_the_rows(backend, counts, dtype, valid):
    """Rows < clamp(wrapping int64 sum, 0, rows) equal the ungrouped run bitwise; the rest are +0.0, even
    where the inputs are NaN or inf (not computed); the same for the gradient."""
    x = random_x((8, 12), BF16, seed=21)
    dy = random_dy((8, 6), BF16, seed=21)
    x[5:, :3] = torch.tensor([NAN, INF, -INF], dtype=BF16)
    dy[6:, 0] = NAN
    gi = torch.tensor(counts, dtype=dtype)
    assert _valid(gi, 8) == valid
    for mode in (0, 1):
        y, y_all = fwd(x, gi, clamp_mode=mode, backend=backend), fwd(x, clamp_mode=mode, backend=backend)
        assert_bitwise_equal(y[:valid], y_all[:valid], "y valid rows")
        assert zeros_bits(y[valid:]), "y rows past the valid count must be +0.0"
        grad, grad_all = gradient(mode)(dy, x, gi, backend=backend), gradient(mode)(dy, x, backend=backend)
        assert_bitwise_equal(grad[:valid], grad_all[:valid], "grad_x valid rows")
        assert zeros_bits(grad[valid:]), "grad_x rows past the valid count must be +0.0"
        assert_matches_reference(y, spec12_forward(x, gi, clamp_mode=mode), backend, "y")


def test_group_index_counts_rows_of_the_merged_view(backend):
    """With dim != -1 the counts refer to the ``pre`` rows of the ``[pre, cut]`` view."""
    x = random_x((3, 2, 4, 6), F32, seed=22)  # dim=2: pre = 6, cut = 24
    dy = random_dy((3, 2, 2, 6), F32, seed=22)
    gi = torch.tensor([2, 2])
    y = fwd(x, gi, dim=2, backend=backend)
    assert zeros_bits(y.reshape(6, -1)[4:]) and not zeros_bits(y.reshape(6, -1)[3])
    assert_matches_reference(y, spec12_forward(x, gi, dim=2), backend, "y")
    grad = bwd(dy, x, gi, dim=2, backend=backend)
    assert zeros_bits(grad.reshape(6, -1)[4:])
    assert_matches_reference(grad, spec12_backward(dy, x, gi, dim=2), backend, "grad_x")


def test_max_group_count_accepted(backend):
    x = random_x((4, 8), F32, seed=23)
    gi = torch.zeros(8192, dtype=torch.int32)
    gi[-1] = 3
    assert zeros_bits(fwd(x, gi, backend=backend)[3:])


# ------------------------------------------------------------------------------ layouts and dim


@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("mode", [0, 1])
def test_interleaved_equals_chunked_on_permuted_columns(backend, dtype, mode):
    x = random_x((5, 24), dtype, seed=31)
    dy = random_dy((5, 12), dtype, seed=31)
    chunked_x = torch.cat([x[:, 0::2], x[:, 1::2]], dim=1)
    assert_bitwise_equal(
        fwd(x, clamp_mode=mode, backend=backend),
        fwd(chunked_x, clamp_mode=mode, interleaved=False, backend=backend),
        "y",
    )
    g_int = gradient(mode)(dy, x, backend=backend)
    g_chk = gradient(mode)(dy, chunked_x, interleaved=False, backend=backend)
    assert_bitwise_equal(g_int, torch.stack([g_chk[:, :12], g_chk[:, 12:]], -1).flatten(1), "grad_x")


DIM_CASES = [
    ((2, 6, 5), 1),  # pairs run across the dim boundary: (x[..,0,0], x[..,0,1]), ..., (x[..,0,4], x[..,1,0])
    ((2, 6, 5), -2),
    ((4, 3, 2), 0),  # pre = 1
    ((3, 4, 3), 1),  # the spec's example shape (p, 4, 3)
    ((10,), 0),  # rank 1
    ((1, 2, 1, 2, 2), 3),
]


@pytest.mark.parametrize(("shape", "dim"), DIM_CASES, ids=[f"{s}-dim{d}" for s, d in DIM_CASES])
@pytest.mark.parametrize("interleaved", [True, False])
def test_dim_is_the_merged_2d_view(backend, shape, dim, interleaved):
    """x with any dim equals the same operator on ``x.reshape(pre, cut)`` with dim=-1, reshaped back."""
    _, pre, cut, half_shape = _view(torch.empty(shape), dim)
    x = random_x(shape, F32, seed=32)
    dy = random_dy(half_shape, F32, seed=32)
    kw = {"interleaved": interleaved}
    y = fwd(x, dim=dim, backend=backend, **kw)
    assert y.shape == half_shape
    assert_bitwise_equal(y, fwd(x.reshape(pre, cut), backend=backend, **kw).reshape(half_shape), "y")
    assert_matches_reference(y, spec12_forward(x, dim=dim, **kw), backend, "y")
    grad = bwd(dy, x, dim=dim, backend=backend, **kw)
    flat = bwd(dy.reshape(pre, cut // 2), x.reshape(pre, cut), backend=backend, **kw)
    assert_bitwise_equal(grad, flat.reshape(shape), "grad_x")
    assert_matches_reference(grad, spec12_backward(dy, x, dim=dim, **kw), backend, "grad_x")


def test_interleaved_pairs_with_dim_1_follow_the_spec_example(backend):
    """Section 1.3: x of shape (p, 4, 3), dim=1 pairs (x[..,0,0], x[..,0,1]), then (x[..,0,2], x[..,1,0])."""
    x = random_x((2, 4, 3), F32, seed=33)
    y = fwd(x, dim=1, backend=backend)
    first = fwd(torch.stack([x[:, 0, 0], x[:, 0, 1]], dim=-1), backend=backend)
    second = fwd(torch.stack([x[:, 0, 2], x[:, 1, 0]], dim=-1), backend=backend)
    assert_bitwise_equal(y[:, 0, 0:1], first, "y[:, 0, 0]")
    assert_bitwise_equal(y[:, 0, 1:2], second, "y[:, 0, 1]")


# ---------------------------------------------------------------------- empty, strides, out=, attrs


EMPTY = [((0, 8), -1), ((4, 0), -1), ((2, 0, 6), 1), ((2, 4, 0), 1), ((0,), 0), ((3, 0, 4), -1)]


@pytest.mark.parametrize(("shape", "dim"), EMPTY, ids=[f"{s}-dim{d}" for s, d in EMPTY])
@pytest.mark.parametrize("with_groups", [False, True])
def test_empty_tensors(backend, shape, dim, with_groups):
    _, _, _, half_shape = _view(torch.empty(shape), dim)
    x = torch.empty(shape, dtype=BF16)
    dy = torch.empty(half_shape, dtype=BF16)
    gi = torch.tensor([3]) if with_groups else None
    y = fwd(x, gi, dim=dim, backend=backend)
    assert (y.shape, y.dtype) == (half_shape, BF16)
    grad = bwd(dy, x, gi, dim=dim, backend=backend)
    assert (grad.shape, grad.dtype) == (tuple(shape), BF16)
    out = torch.empty(half_shape, dtype=BF16)
    assert fwd(x, gi, dim=dim, backend=backend, out=out) is out


@pytest.mark.parametrize("mode", [0, 1])
def test_non_contiguous_inputs(backend, mode):
    base = random_x((24, 10), BF16, seed=41)
    x = base.t()  # (10, 24), strides (1, 10)
    dy = random_dy((24, 10), BF16, seed=41)[::2].t()  # (10, 12), non-contiguous
    assert not x.is_contiguous() and not dy.is_contiguous()
    y = fwd(x, clamp_mode=mode, backend=backend)
    assert_bitwise_equal(y, fwd(x.contiguous(), clamp_mode=mode, backend=backend), "y")
    assert_bitwise_equal(
        gradient(mode)(dy, x, backend=backend),
        gradient(mode)(dy.contiguous(), x.contiguous(), backend=backend),
        "grad_x",
    )
    x3 = random_x((4, 6, 8), F16, seed=42)[:, :, ::2]  # dim=1 on a strided view
    assert_bitwise_equal(fwd(x3, dim=1, backend=backend), fwd(x3.contiguous(), dim=1, backend=backend), "y")


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_is_fully_written_and_returned(backend, dtype):
    x = random_x((6, 20), dtype, seed=43)
    dy = random_dy((6, 10), dtype, seed=43)
    gi = torch.tensor([4])
    out = torch.full((6, 10), NAN, dtype=dtype)
    got = fwd(x, gi, backend=backend, out=out)
    assert got is out
    assert_bitwise_equal(out, fwd(x, gi, backend=backend), "out")
    assert zeros_bits(out[4:])
    grad_out = torch.full((6, 20), NAN, dtype=dtype)
    assert bwd(dy, x, gi, backend=backend, out=grad_out) is grad_out
    assert_bitwise_equal(grad_out, bwd(dy, x, gi, backend=backend), "grad out")
    assert zeros_bits(grad_out[4:])
    big = torch.full((2, 6, 10), NAN, dtype=dtype)
    fwd(x, gi, backend=backend, out=big[1])  # a contiguous view of a larger tensor: only it is written
    assert torch.isnan(big[0]).all()


@pytest.mark.parametrize(("limit", "same_as"), [(1e39, INF), (7.0000001, 7.0), (3, 3.0)])
def test_attributes_are_rounded_to_fp32(backend, limit, same_as):
    """CANN stores the attributes as floats: a limit overflowing fp32 is +inf, one rounding to 7.0 is 7.0."""
    x = random_x((4, 16), F32, seed=44)
    dy = random_dy((4, 8), F32, seed=44)
    assert_bitwise_equal(fwd(x, limit=limit, backend=backend), fwd(x, limit=same_as, backend=backend), "y")
    assert_bitwise_equal(
        bwd(dy, x, limit=limit, backend=backend), bwd(dy, x, limit=same_as, backend=backend), "grad_x"
    )
    assert_bitwise_equal(
        fwd(x, alpha=1.702000000001, bias=1.0000000001, backend=backend), fwd(x, backend=backend), "y (alpha)"
    )


def test_defaults_are_gpt_oss(backend):
    x = random_x((4, 16), F32, seed=45)
    assert_bitwise_equal(
        swiglu_ops.clipped_swiglu(x, backend=backend),
        fwd(x, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, clamp_mode=0, backend=backend),
        "y",
    )


ACCEPTED = [
    ("rank 8", {"x": (1, 1, 2, 1, 1, 1, 2, 4)}),
    ("rank 1", {"x": (6,), "dim": 0}),
    ("dim -rank", {"x": (2, 4, 3), "dim": -3}),
    ("limit +inf", {"limit": INF}),
    ("limit int", {"limit": 3}),
    ("alpha negative, bias 0", {"alpha": -2.0, "bias": 0.0}),
    ("alpha int", {"alpha": 2}),
    ("int32 group_index", {"group_index": torch.tensor([1, 2], dtype=torch.int32)}),
    ("group_index values never checked", {"group_index": torch.tensor([-7, 2**40])}),
    ("clamp_mode 1", {"clamp_mode": 1}),
    ("numpy float attributes", {"alpha": np.float64(1.5), "limit": np.float32(6.0)}),
]


@pytest.mark.parametrize("case", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted(backend, case):
    case = dict(case)
    shape = case.pop("x", (4, 8))
    dim = case.get("dim", -1)
    x = random_x(shape, F16, seed=46)
    y = swiglu_ops.clipped_swiglu(x, backend=backend, **case)
    assert (y.shape, y.dtype) == (_view(x, dim)[3], F16)
    case.pop("clamp_mode", None)
    grad = swiglu_ops.clipped_swiglu_grad(torch.ones_like(y), x, backend=backend, **case)
    assert (grad.shape, grad.dtype) == (x.shape, F16)
