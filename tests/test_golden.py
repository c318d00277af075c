"""The published golden cases of both operator documents, with their exact expected values.

group_grad: ``shared/spec/swiglu_group_grad.md`` 7.1 (kernel UT), 7.2 (aclnn and GE examples), 7.6 (edge cases
of the generated ST matrix). mx: ``shared/spec/swiglu_backward_mx_quant.md`` 5.1, 5.2 and 5.3.
Expected values are written out (hex where the document gives hex); they are compared exactly on the
reference backend and with the contract's tolerances on the fast backends.
"""

from __future__ import annotations

import pytest
import torch
from _compare import assert_exact, assert_group_grad_matches, assert_mx_matches

import swiglu_ops

E4M3 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu


def from_bits(bits, dtype: torch.dtype, shape=()) -> torch.Tensor:
    """A tensor of ``shape`` filled with the float whose IEEE bit pattern is ``bits``."""
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    width = 32 if dtype == torch.float32 else 16
    signed = bits - (1 << width) if bits >= 1 << (width - 1) else bits
    return torch.full(shape, signed, dtype=int_dtype).view(dtype)


def codes(values, dtype, shape) -> torch.Tensor:
    """Raw uint8 codes viewed as ``dtype`` (fp8 elements or E8M0 scales), broadcast to ``shape``."""
    return torch.tensor(values, dtype=torch.uint8).expand(shape).contiguous().view(dtype)


# ------------------------------------------------------------------------------- swiglu_group_grad 7.1


def test_kernel_ut_1_no_options(backend):
    """7.1 case 1: fp32 (1,16), dy=1, g=0, u=1 -> dg = 0.5, du = 0."""
    dy = torch.ones(1, 16)
    x = torch.cat([torch.zeros(1, 16), torch.ones(1, 16)], dim=1)
    got = swiglu_ops.swiglu_group_grad(dy, x, backend=backend)
    expected = torch.cat([torch.full((1, 16), 0.5), torch.zeros(1, 16)], dim=1)
    assert_group_grad_matches(got, (expected, None), backend)


def test_kernel_ut_2_open_clamp_intervals(backend):
    """7.1 case 2: c=1, g[0]=c (gate masked, du = f(1) = sigma(1)), u[1]=c (up masked, clipped to 1)."""
    dy = torch.ones(1, 16)
    g = torch.zeros(1, 16)
    g[0, 0] = 1.0
    u = torch.full((1, 16), 0.5)
    u[0, 1] = 1.0
    got = swiglu_ops.swiglu_group_grad(dy, torch.cat([g, u], dim=1), clamp_limit=1.0, backend=backend)
    dg = torch.full((1, 16), 0.25)
    dg[0, 0] = 0.0
    dg[0, 1] = 0.5
    du = torch.zeros(1, 16)
    du[0, 0] = from_bits(0x3F3B26A8, torch.float32)  # sigma(1) = 0.7310586
    assert_group_grad_matches(got, (torch.cat([dg, du], dim=1), None), backend)


@pytest.mark.parametrize("hidden", [16, 128])
def test_kernel_ut_3_group_index_masks_grad_x_not_grad_weight(backend, hidden):
    """7.1 case 3: group_index [2] keeps rows 0-1; grad_weight = 2H on all 4 rows."""
    dy = torch.ones(4, hidden)
    x = torch.cat([torch.zeros(4, hidden), torch.ones(4, hidden)], dim=1)
    got = swiglu_ops.swiglu_group_grad(
        dy, x, torch.ones(4, 1), torch.full((4, hidden), 2.0), torch.tensor([2]), backend=backend
    )
    dg = torch.zeros(4, hidden)
    dg[:2] = 0.5
    expected = (torch.cat([dg, torch.zeros(4, hidden)], dim=1), torch.full((4, 1), 2.0 * hidden))
    assert_group_grad_matches(got, expected, backend)


# ------------------------------------------------------------------------------- swiglu_group_grad 7.2


def test_aclnn_example(backend):
    """7.2 aclnn example: fp32 T=4 H=16 c=3, x=0.5, y_origin=0.3 -> dg 0x3ebd6e18, du 0x3e9f597f, dW 4.8."""
    t, h = 4, 16
    got = swiglu_ops.swiglu_group_grad(
        torch.ones(t, h),
        torch.full((t, 2 * h), 0.5),
        torch.ones(t, 1),
        torch.full((t, h), 0.3),
        torch.tensor([4]),
        3.0,
        backend=backend,
    )
    grad_x = torch.cat(
        [from_bits(0x3EBD6E18, torch.float32, (t, h)), from_bits(0x3E9F597F, torch.float32, (t, h))], dim=1
    )
    assert_group_grad_matches(got, (grad_x, from_bits(0x4099999A, torch.float32, (t, 1))), backend)


@pytest.mark.parametrize(
    ("dtype", "y_origin_bits", "dg_bits", "du_bits", "grad_weight"),
    [(torch.bfloat16, 0x3E99, 0x3EBD, 0x3E9F, 38.25), (torch.float16, 0x34CC, 0x35EB, 0x34FB, 38.375)],
)
def test_ge_example(backend, dtype, y_origin_bits, dg_bits, du_bits, grad_weight):
    """7.2 GE example: T=8 H=128 c=7, x=0.5, group_index [2,2,2,2] (all rows valid)."""
    t, h = 8, 128
    got = swiglu_ops.swiglu_group_grad(
        torch.ones(t, h, dtype=dtype),
        torch.full((t, 2 * h), 0.5, dtype=dtype),
        torch.ones(t, 1),
        from_bits(y_origin_bits, dtype, (t, h)),
        torch.tensor([2, 2, 2, 2]),
        7.0,
        backend=backend,
    )
    grad_x = torch.cat([from_bits(dg_bits, dtype, (t, h)), from_bits(du_bits, dtype, (t, h))], dim=1)
    assert_group_grad_matches(got, (grad_x, torch.full((t, 1), grad_weight)), backend)


# ------------------------------------------------------------------------------- swiglu_group_grad 7.6


def _uniform(gen, shape, lo, hi, dtype=torch.float32):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _signed_zeros_like(sign_source: torch.Tensor) -> torch.Tensor:
    """+0.0 / -0.0 with the sign bit of ``sign_source``, in its dtype."""
    zero = torch.zeros_like(sign_source)
    return torch.where(torch.signbit(sign_source), -zero, zero)


def test_edge_zero_grad_y(backend):
    """7.6 dy == 0 with clamp 3, weight, y_origin: grad_x all zeros (sign = product of the factors' signs),
    grad_weight +0.0."""
    gen = torch.Generator().manual_seed(42)
    dtype = torch.bfloat16
    x = _uniform(gen, (8, 64), -5, 5, dtype)
    w = _uniform(gen, (8, 1), 0.5, 2)
    y_origin = _uniform(gen, (8, 32), -1, 1, dtype)
    grad_x, grad_weight = swiglu_ops.swiglu_group_grad(
        torch.zeros(8, 32, dtype=dtype), x, w, y_origin, torch.tensor([8]), 3.0, backend=backend
    )
    assert_exact(grad_weight, torch.zeros(8, 1), "grad_weight")
    assert bool((grad_x == 0).all()), "grad_x must be all zeros"
    # dg = (((+0 * sp) * u~) * w) * m_g has the sign of sp * u; du = ((+0 * f) * w) * m_u has the sign of g~.
    g, u = x.double().chunk(2, dim=1)
    g_t = g.clamp(max=3.0)
    s = torch.sigmoid(g_t)
    sp = s + g_t * s * (1 - s)
    clear = sp.abs() > 1e-3  # the fp32 sign of silu' is certain away from its zero near g = -1.28
    dg_sign = torch.signbit(sp) ^ torch.signbit(u)
    assert torch.equal(torch.signbit(grad_x[:, :32])[clear], dg_sign[clear])
    assert torch.equal(torch.signbit(grad_x[:, 32:]), torch.signbit(g_t))


def test_edge_tiny_clamp(backend):
    """7.6 tiny clamp 0.001 with x ~ U(1, 5): every gate and up is masked, grad_x = +-0 (sign of dy)."""
    gen = torch.Generator().manual_seed(7)
    dy = _uniform(gen, (8, 32), -1, 1)
    x = _uniform(gen, (8, 64), 1, 5)
    got = swiglu_ops.swiglu_group_grad(dy, x, clamp_limit=0.001, backend=backend)
    expected = _signed_zeros_like(torch.cat([dy, dy], dim=1))
    assert_exact(got[0], expected, "grad_x")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_edge_large_gates(backend, dtype):
    """7.6 large gates U(50, 100), no clamp: s = 1, f = g, du = dy*g, dg = dy*(fl(1+g) - g)*u exactly."""
    gen = torch.Generator().manual_seed(3)
    dy = _uniform(gen, (4, 32), -1, 1, dtype)
    g = _uniform(gen, (4, 32), 50, 100, dtype)
    u = _uniform(gen, (4, 32), -5, 5, dtype)
    got = swiglu_ops.swiglu_group_grad(dy, torch.cat([g, u], dim=1), backend=backend)
    dyf, gf, uf = dy.float(), g.float(), u.float()
    sp = (1.0 + gf) - gf  # 1, or 1 +- 1 ulp where 1 + g crosses a power of two
    expected = torch.cat([(dyf * sp) * uf, dyf * gf], dim=1).to(dtype)
    assert_group_grad_matches(got, (expected, None), backend)


def test_edge_exact_clamp_boundary(backend):
    """7.6 c = 5 with rows 4-7 at g = u = 5 exactly: both halves masked there (+-0 with the sign of dy)."""
    gen = torch.Generator().manual_seed(5)
    dy = _uniform(gen, (8, 32), -1, 1)
    x = _uniform(gen, (8, 64), -4.5, 4.5)
    x[4:] = 5.0
    grad_x, _ = swiglu_ops.swiglu_group_grad(dy, x, clamp_limit=5.0, backend=backend)
    assert_exact(grad_x[4:], _signed_zeros_like(torch.cat([dy[4:], dy[4:]], dim=1)), "grad_x rows 4-7")
    assert bool((grad_x[:4] != 0).all()), "rows 0-3 are inside the clamp interval"


def test_edge_all_negative_gates(backend):
    """7.6 gates U(-10, -0.1): silu' < 0 below g = -1.28, so dg changes sign; f < 0 gives du = -dy * |f|."""
    gen = torch.Generator().manual_seed(11)
    dy = _uniform(gen, (4, 32), 0.1, 1)
    g = _uniform(gen, (4, 32), -10, -0.1)
    u = torch.ones(4, 32)
    grad_x, _ = swiglu_ops.swiglu_group_grad(dy, torch.cat([g, u], dim=1), backend=backend)
    assert bool((grad_x[:, 32:] < 0).all())
    g64 = g.double()
    s = torch.sigmoid(g64)
    sp = s + g64 * s * (1 - s)
    clear = sp.abs() > 1e-3
    assert torch.equal((grad_x[:, :32] < 0)[clear], (sp < 0)[clear])
    torch.testing.assert_close(
        grad_x.double(), torch.cat([dy * sp, dy * g64 * s], dim=1), rtol=1e-5, atol=1e-6
    )


# -------------------------------------------------------------------------- mx quant 5.1, 5.2, 5.3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_golden_5_1(backend, dtype):
    """5.1: ones[4,64], y_grad ones[4,32], group_index [2,4] -> codes 0x77/0x7C, scales 119/118."""
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        torch.ones(4, 64, dtype=dtype), torch.ones(4, 32, dtype=dtype), torch.tensor([2, 4]), backend=backend
    )
    y = codes([0x77] * 32 + [0x7C] * 32, E4M3, (4, 64))
    mxscale1 = codes([[119, 118]], E8M0, (4, 1, 2))
    mxscale2 = codes([[119, 0]] * 32 + [[118, 0]] * 32, E8M0, (2, 64, 2))
    assert_mx_matches(got, (y, mxscale1, y, mxscale2), backend)


def test_round_before_quantize_discriminator_5_2(backend):
    """5.2: gB = 0.53256 rounds to bf16 0.53125 -> 272 = tie -> 256 (0x78), not 288; gA -> 448 (0x7E)."""
    x = torch.cat(
        [from_bits(0x3F47, torch.bfloat16, (1, 32)), torch.ones(1, 32, dtype=torch.bfloat16)], dim=1
    )
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, torch.ones(1, 32, dtype=torch.bfloat16), backend=backend
    )
    y = codes([0x7E] * 32 + [0x78] * 32, E4M3, (1, 64))
    mxscale1 = codes([[118, 118]], E8M0, (1, 1, 2))
    mxscale2 = codes([[118, 0]], E8M0, (1, 64, 2))
    assert_mx_matches(got, (y, mxscale1, y, mxscale2), backend)


def test_ones_128_5_3(backend):
    """5.3: ones[128,128], no groups: scales [[119,119],[118,118]] per row, mxscale2 [119,119] / [118,118]."""
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        torch.ones(128, 128, dtype=torch.bfloat16), torch.ones(128, 64, dtype=torch.bfloat16), backend=backend
    )
    y = codes([0x77] * 64 + [0x7C] * 64, E4M3, (128, 128))
    mxscale1 = codes([[119, 119], [118, 118]], E8M0, (128, 2, 2))
    mxscale2 = codes([[119, 119]] * 64 + [[118, 118]] * 64, E8M0, (2, 128, 2))
    assert_mx_matches(got, (y, mxscale1, y, mxscale2), backend)


def test_negative_gradient_and_zero_block_5_3(backend):
    """5.3: A = 0, B = -1, g = 1 -> gA = -0.5 (scale 118, code 0xF8); gB = +0 (scale 0, code 0x00)."""
    x = torch.cat([torch.zeros(4, 32), -torch.ones(4, 32)], dim=1).bfloat16()
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, torch.ones(4, 32, dtype=torch.bfloat16), backend=backend
    )
    y = codes([0xF8] * 32 + [0x00] * 32, E4M3, (4, 64))
    mxscale1 = codes([[118, 0]], E8M0, (4, 1, 2))
    mxscale2 = codes([[118, 0]] * 32 + [[0, 0]] * 32, E8M0, (1, 64, 2))
    assert_mx_matches(got, (y, mxscale1, y, mxscale2), backend)


def test_nan_in_activated_half_5_3(backend):
    """5.3: x[m, 0] = NaN poisons columns 0 and N of row m: those row blocks and column blocks get scale
    0xFF and codes 0x00; everything else is the ones result."""
    m = 1
    x = torch.ones(4, 64, dtype=torch.bfloat16)
    x[m, 0] = torch.nan
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, torch.ones(4, 32, dtype=torch.bfloat16), backend=backend
    )
    y1 = codes([0x77] * 32 + [0x7C] * 32, E4M3, (4, 64)).clone()
    y1.view(torch.uint8)[m] = 0
    mxscale1 = codes([[119, 118]], E8M0, (4, 1, 2)).clone()
    mxscale1.view(torch.uint8)[m] = 255
    y2 = codes([0x77] * 32 + [0x7C] * 32, E4M3, (4, 64)).clone()
    y2.view(torch.uint8)[:, [0, 32]] = 0
    mxscale2 = codes([[119, 0]] * 32 + [[118, 0]] * 32, E8M0, (1, 64, 2)).clone()
    mxscale2.view(torch.uint8)[0, [0, 32], 0] = 255
    assert_mx_matches(got, (y1, mxscale1, y2, mxscale2), backend)


def test_aclnn_example_subnormal_inputs_5_3(backend):
    """5.3 / 7 EX: x bits i%100, y_grad bits i%50 (bf16 subnormals), group_index [256]: all zero, mxscale2
    [5,1024,2] all zero (its unused row 4 zero-filled)."""
    x = (torch.arange(256 * 1024) % 100).to(torch.int16).view(torch.bfloat16).reshape(256, 1024)
    y_grad = (torch.arange(256 * 512) % 50).to(torch.int16).view(torch.bfloat16).reshape(256, 512)
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, y_grad, torch.tensor([256]), backend=backend)
    y = codes([0], E4M3, (256, 1024))
    expected = (y, codes([0], E8M0, (256, 16, 2)), y, codes([0], E8M0, (5, 1024, 2)))
    assert_mx_matches(got, expected, backend)
