"""Autograd wrappers: ClampedSwiGLU against float64 autograd of the plain forward composition, boundaries,
row mask, and the MXFP8 backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import swiglu_ops

BACKEND = "reference"
C = 1.5  # clamp limit, exact in fp32


def reference_forward(x, weight=None, valid_rows=None, clamp=0.0):
    """The plain forward composition, differentiated by autograd (used in float64)."""
    hidden = x.shape[-1] // 2
    g, u = x[..., :hidden], x[..., hidden:]
    if clamp > 0:
        g, u = torch.clamp(g, max=clamp), torch.clamp(u, -clamp, clamp)
    y = F.silu(g) * u
    if weight is not None:
        y = y * weight.reshape(*x.shape[:-1], 1)
    if valid_rows is not None:
        rows = torch.arange(math.prod(x.shape[:-1])).reshape(*x.shape[:-1], 1)
        y = y * (rows < valid_rows)
    return y


def away_from_boundaries(x, clamp, margin=0.05):
    """Moves values within ``margin`` of +-clamp away from it (autograd and the op differ only there)."""
    near = (x.abs() - clamp).abs() < margin
    return torch.where(near, x + 2 * margin * torch.sign(x), x)


def make_inputs(shape, clamp, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 2.5
    if clamp > 0:
        x = away_from_boundaries(x, clamp)
    rows = math.prod(shape[:-1])
    weight = torch.rand(rows, generator=gen) + 0.5
    dy = torch.randn(*shape[:-1], shape[-1] // 2, generator=gen)
    return x.to(dtype), weight, dy.to(dtype)


def custom_grads(x, weight, group_index, clamp, dy):
    x = x.clone().requires_grad_()
    weight = None if weight is None else weight.clone().requires_grad_()
    y = swiglu_ops.clamped_swiglu(x, weight, group_index, clamp, backend=BACKEND)
    y.backward(dy)
    return y, x.grad, None if weight is None else weight.grad


def float64_grads(x, weight, valid_rows, clamp, dy):
    x64 = x.double().requires_grad_()
    w64 = None if weight is None else weight.double().requires_grad_()
    y = reference_forward(x64, w64, valid_rows, clamp)
    y.backward(dy.double())
    return y, x64.grad, None if weight is None else w64.grad


@pytest.mark.parametrize("clamp", [0.0, C])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize(("counts", "valid_rows"), [(None, None), ([3, 4], 7), ([-1], 0), ([100], 12)])
@pytest.mark.parametrize("shape", [(12, 64), (3, 4, 40)])
def test_backward_matches_float64_autograd(shape, counts, valid_rows, with_weight, clamp):
    x, weight, dy = make_inputs(shape, clamp, seed=len(shape) + int(clamp))
    weight = weight if with_weight else None
    gi = None if counts is None else torch.tensor(counts)
    y, grad_x, grad_w = custom_grads(x, weight, gi, clamp, dy)
    y64, grad_x64, grad_w64 = float64_grads(x, weight, valid_rows, clamp, dy)
    torch.testing.assert_close(y.double(), y64, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_x.double(), grad_x64, rtol=1e-5, atol=1e-6)
    if with_weight:
        assert grad_w.shape == weight.shape
        torch.testing.assert_close(grad_w.double(), grad_w64, rtol=1e-5, atol=1e-5)


def test_gradcheck_fp32_computation():
    """torch.autograd.gradcheck on a float64 wrapper around the fp32 computation (central differences with
    eps = 1e-3, so the fp32 rounding of the function values sets the tolerance)."""
    x, weight, _ = make_inputs((4, 16), C, seed=7)
    gi = torch.tensor([3])

    def fn(x64, w64):
        return swiglu_ops.clamped_swiglu(x64.float(), w64.float(), gi, C, backend=BACKEND).double()

    inputs = (x.double().requires_grad_(), weight.double().requires_grad_())
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-3, atol=2e-3, rtol=2e-3)


def test_bf16_backward_close_to_float64():
    x, weight, dy = make_inputs((16, 64), C, seed=3, dtype=torch.bfloat16)
    _, grad_x, grad_w = custom_grads(x, weight, torch.tensor([10]), C, dy)
    _, grad_x64, grad_w64 = float64_grads(x, weight, 10, C, dy)
    assert grad_x.dtype == torch.bfloat16
    torch.testing.assert_close(grad_x.double(), grad_x64, rtol=2**-7, atol=1e-6)
    # grad_weight sums dy * bf16(y_origin): the bf16 rounding of each term (relative 2^-9) bounds the error.
    bound = 2**-8 * (dy.double() * reference_forward(x.double(), None, 10, C)).abs().sum(-1) + 1e-6
    assert ((grad_w.double() - grad_w64).abs() <= bound).all()


def test_clamp_boundaries_follow_the_operator():
    """Open intervals: g == c gives dg = 0 (du stays dy * silu(c) * w); u == +-c gives du = 0."""
    g = torch.tensor([C, C + 1, 0.5, -C])
    u = torch.tensor([0.5, C, -C, C + 1])
    x = torch.cat([g, u]).reshape(1, 8).requires_grad_()
    w = torch.tensor([0.5], requires_grad=True)
    y = swiglu_ops.clamped_swiglu(x, w, None, C, backend=BACKEND)
    y.backward(torch.ones_like(y))

    def silu(v):
        return v / (1 + math.exp(-v))

    def dsilu(v):
        s = 1 / (1 + math.exp(-v))
        return s * (1 + v * (1 - s))

    dg = [0.0, 0.0, dsilu(0.5) * -C * 0.5, dsilu(-C) * C * 0.5]  # gate uses the clipped up value
    du = [silu(C) * 0.5, 0.0, 0.0, 0.0]
    torch.testing.assert_close(
        x.grad.double(), torch.tensor([dg + du], dtype=torch.float64), rtol=1e-6, atol=0
    )
    # weight.grad = silu(g~) * u~ summed: clipped values enter, including the boundary columns.
    expected_w = silu(C) * 0.5 + silu(C) * C + silu(0.5) * -C + silu(-C) * C
    assert w.grad.item() == pytest.approx(expected_w, rel=1e-6)


def test_masked_rows_output_zero_and_get_zero_gradients():
    x, weight, dy = make_inputs((6, 32), C, seed=5)
    gi = torch.tensor([2, 1])  # counts: rows 0..2 valid
    y, grad_x, grad_w = custom_grads(x, weight, gi, C, dy)
    assert torch.equal(y[3:], torch.zeros_like(y[3:]))
    assert torch.equal(grad_x[3:], torch.zeros_like(grad_x[3:]))
    assert torch.equal(grad_w[3:], torch.zeros(3))
    assert (grad_w[:3] != 0).all()
    # The operator itself never masks grad_weight, and with the *weighted* output as y_origin it returns
    # w times the true gradient: the wrapper's choice of y_origin is what makes weight.grad correct.
    weighted = reference_forward(x, weight, None, C)
    _, raw = swiglu_ops.swiglu_group_grad(dy, x, weight, weighted, gi, C, backend=BACKEND)
    assert (raw[3:] != 0).all()
    torch.testing.assert_close(raw[:3], weight[:3] * grad_w[:3], rtol=1e-5, atol=1e-6)


def test_module_wraps_the_function():
    module = swiglu_ops.ClampedSwiGLU(C, backend=BACKEND)
    assert list(module.parameters()) == [] and "clamp_limit=1.5" in repr(module)
    x, weight, _ = make_inputs((4, 32), C, seed=9)
    assert torch.equal(module(x, weight), swiglu_ops.clamped_swiglu(x, weight, None, C, backend=BACKEND))


def test_forward_rejects_bad_input():
    x = torch.randn(4, 32)
    with pytest.raises(TypeError, match="weight must be float32"):
        swiglu_ops.clamped_swiglu(x, torch.ones(4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        swiglu_ops.clamped_swiglu([[0.0] * 32] * 4)
    with pytest.raises(ValueError, match="x must have rank >= 2"):
        swiglu_ops.clamped_swiglu(torch.randn(32))
    with pytest.raises(ValueError, match="even"):
        swiglu_ops.clamped_swiglu(torch.randn(4, 33))
    with pytest.raises(ValueError, match="numel == rows"):
        swiglu_ops.clamped_swiglu(x, torch.ones(5))
    with pytest.raises(ValueError, match="clamp_limit must be >= 0"):
        swiglu_ops.clamped_swiglu(x, clamp_limit=-1.0)
    with pytest.raises(TypeError, match="x must be bfloat16, float16 or float32"):
        swiglu_ops.clamped_swiglu(x.double())
    with pytest.raises(ValueError, match="multiple of 64"):
        swiglu_ops.swiglu_mx_backward(x)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: swiglu_ops.ClampedSwiGLU(-1.0), ValueError, "clamp_limit must be >= 0"),
        (lambda: swiglu_ops.ClampedSwiGLU("7"), TypeError, "clamp_limit must be a real number"),
        (lambda: swiglu_ops.ClampedSwiGLU(7.0, backend="gpu"), ValueError, "backend must be one of"),
        (lambda: swiglu_ops.ClippedSwiGLU(backend=3), TypeError, "backend must be a string"),
    ],
)
def test_modules_check_their_arguments_at_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


# ------------------------------------------------------------------------------------------ MX backward


@pytest.mark.parametrize("activate_left", [True, False])
@pytest.mark.parametrize("ends", [None, [40, 40, 100]])
def test_mx_backward_returns_the_dequantised_operator_gradient(ends, activate_left):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(100, 128, generator=gen).bfloat16().requires_grad_()
    dy = torch.randn(100, 64, generator=gen).bfloat16()
    gi = None if ends is None else torch.tensor(ends)
    capture = swiglu_ops.MXGradient()
    y = swiglu_ops.swiglu_mx_backward(x, gi, activate_left=activate_left, backend=BACKEND, capture=capture)
    a, b = (x[:, :64], x[:, 64:]) if activate_left else (x[:, 64:], x[:, :64])
    assert torch.equal(y, (F.silu(a.float()) * b.float()).bfloat16())
    y.backward(dy)

    y1, s1, y2, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x.detach(), dy, gi, activate_left=activate_left, backend=BACKEND
    )
    for got, want in zip(
        (capture.y1, capture.mxscale1, capture.y2, capture.mxscale2), (y1, s1, y2, s2), strict=True
    ):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert capture.group_index is gi
    assert torch.equal(x.grad, swiglu_ops.mx_dequantize(y1, s1, axis=-1, dtype=torch.bfloat16))

    # Close to the exact gradient: E4M3 rounding (relative 2^-4, plus the subnormal step 2^-9 of the block
    # scale) on top of the 16-bit gradient (which may differ from the group_grad operator's by 1 bf16 ulp).
    x64 = x.detach().double().requires_grad_()
    a64, b64 = (x64[:, :64], x64[:, 64:]) if activate_left else (x64[:, 64:], x64[:, :64])
    (F.silu(a64) * b64).backward(dy.double())
    block_scale = torch.pow(2.0, swiglu_ops.layouts.mxscale1_to_plain(s1).view(torch.uint8).double() - 127)
    step = block_scale.repeat_interleave(32, dim=-1) * 2**-9
    assert ((x.grad.double() - x64.grad).abs() <= (2**-4 + 2**-7) * x64.grad.abs() + step).all()


def test_autograd_wrappers_compile_fullgraph():
    """Forward and backward through both autograd functions under torch.compile(fullgraph=True) (aot_eager:
    the custom ops' fake kernels are what tracing needs; Inductor codegen is exercised in test_torch_ops)."""
    x, weight, dy = make_inputs((8, 64), C, seed=13)
    counts, ends = torch.tensor([6]), torch.tensor([3, 8])

    def fn(x, weight):
        y = swiglu_ops.clamped_swiglu(x, weight, counts, C, backend=BACKEND)
        return y + swiglu_ops.swiglu_mx_backward(x, ends, backend=BACKEND)

    def grads(f):
        xr, wr = x.clone().requires_grad_(), weight.clone().requires_grad_()
        out = f(xr, wr)
        out.backward(dy)
        return out, xr.grad, wr.grad

    torch._dynamo.reset()
    compiled = grads(torch.compile(fn, fullgraph=True, backend="aot_eager"))
    for got, want in zip(compiled, grads(fn), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_mx_backward_forward_under_inductor_is_eager_bit_for_bit(dtype):
    """The wrapper's forward is plain-torch math (the exact SwiGLU rounded to x's dtype): Inductor recompiled
    it with its own exp, and in fp32 nothing rounded the difference away (about 10,000 of 262,144 values up
    to 3 ulp off). It is one opaque op under torch.compile now."""
    x = (torch.randn(2048, 128, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: swiglu_ops.swiglu_mx_backward(t, backend="reference"), fullgraph=True)
    assert torch.equal(fn(x), swiglu_ops.swiglu_mx_backward(x, backend="reference"))
    # a transposed x too (the opaque op's result is contiguous, as its fake kernel says: a review found the
    # compiled call failing on the strides), and every opaque op under opcheck on such inputs
    xt = (torch.randn(128, 64, generator=torch.Generator().manual_seed(6)) * 4).to(dtype).t()
    assert torch.equal(fn(xt), swiglu_ops.swiglu_mx_backward(xt, backend="reference"))
    glu = (False, True, False, 1.0, float("inf"), 0.0, 0)
    dy = torch.randn(64, 64, dtype=dtype).t()
    ops = torch.ops.swiglu_ops
    torch.library.opcheck(ops._glu_forward_rounded, (xt, None, *glu))
    torch.library.opcheck(ops._glu_backward_rounded, (xt, dy, None, *glu))
    torch.library.opcheck(ops._glu_act16_sums, (dy, xt, *glu))
    torch.library.opcheck(
        ops._mx_e4m3_blocks, (torch.randn(4, 32, 8).to(torch.bfloat16).permute(0, 2, 1), -1)
    )


_WRAPPERS = {
    "clamped_swiglu": lambda x: swiglu_ops.clamped_swiglu(x, backend="reference"),
    "ClampedSwiGLU": lambda x: swiglu_ops.ClampedSwiGLU(backend="reference")(x),
    "swiglu_mx_backward": lambda x: swiglu_ops.swiglu_mx_backward(x, backend="reference"),
    "ClippedSwiGLU": lambda x: swiglu_ops.ClippedSwiGLU(backend="reference")(x),
    "MXFP8ExpertMLP": lambda x: swiglu_ops.MXFP8ExpertMLP(2, 64, 32, backend="reference")(
        x.bfloat16(), torch.tensor([3, 8])
    ),
}


@pytest.mark.parametrize("wrapper", list(_WRAPPERS))
@pytest.mark.parametrize("loss", ["sum", "square"])
def test_no_double_backward_is_an_error_not_a_dropped_term(wrapper, loss):
    """A second-order term (a gradient penalty through create_graph=True) raises: the backward operators
    have no derivative of their own. With a loss like y.sum() (incoming gradients that do not require grad)
    it used to be dropped silently: the first-order gradient came back detached."""
    x = torch.randn(8, 64, requires_grad=True)
    y = _WRAPPERS[wrapper](x).float()
    (g,) = torch.autograd.grad(y.sum() if loss == "sum" else y.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        (y.sum() + g.square().sum()).backward()
