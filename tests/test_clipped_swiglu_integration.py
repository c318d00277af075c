"""The clipped SwiGLU in PyTorch: custom ops (opcheck, fake kernels, torch.compile), the autograd module
(against torch autograd of the float64 formulas), backend resolution, and the GPT-OSS parameters of the
dual-axis MX backward (stage 1 equals clipped_swiglu_grad, then quantised as before)."""

from __future__ import annotations

import pytest
import torch
from _compare import assert_bitwise_equal, assert_mx_matches
from _oracles import expected_mx
from torch._subclasses.fake_tensor import FakeTensorMode

import swiglu_ops
from swiglu_ops.ops import api as _api
from swiglu_ops.ops import validate as V

ops = torch.ops.swiglu_ops
CLIPPED = ops.clipped_swiglu.default
CLIPPED_GRAD = ops.clipped_swiglu_grad.default
CLIPPED_GRAD_MODE1 = ops._clipped_swiglu_grad_mode1.default
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
INF = float("inf")


def randn(*shape, dtype=F32, seed=0, scale=4.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


# ------------------------------------------------------------------------------------------ custom ops


def test_schemas_carry_the_attributes():
    fwd, grad, mode1 = str(CLIPPED._schema), str(CLIPPED_GRAD._schema), str(CLIPPED_GRAD_MODE1._schema)
    for fragment in ("Tensor x", "Tensor? group_index", "int dim=-1", "float alpha=1.702", "float limit=7.",
                     "float bias=1.", "bool interleaved=True", "str backend", "-> Tensor"):  # fmt: skip
        assert fragment in fwd and fragment in grad
    assert "int clamp_mode=0" in fwd and "clamp_mode" not in grad
    assert "Tensor grad_y" in grad and "alpha" not in mode1 and "bias" not in mode1
    for schema in (CLIPPED._schema, CLIPPED_GRAD._schema, CLIPPED_GRAD_MODE1._schema):
        assert not schema.is_mutable
    mx = str(ops.swiglu_backward_mx_quant_dual_axis.default._schema)
    for fragment in ("int? scale_alg=1", "float? limit=None", "float? alpha=None", "float? bias=None",
                     "bool interleaved=False"):  # fmt: skip
        assert fragment in mx


def clipped_cases():
    yield "gpt-oss-bf16", (randn(6, 32, dtype=BF16),), {}
    yield "groups-int32-fp16", (randn(6, 32, dtype=F16), torch.tensor([2, 3], dtype=torch.int32)), {}
    yield "chunked-dim1-fp32", (randn(2, 4, 6),), {"dim": 1, "interleaved": False, "limit": INF}
    yield "mode1", (randn(5, 16),), {"clamp_mode": 1, "alpha": 3.0}
    yield "empty", (torch.empty(0, 8),), {}


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize(
    ("name", "args", "kwargs"), list(clipped_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_opcheck(name, args, kwargs, backend):
    x, *rest = args
    torch.library.opcheck(CLIPPED, args, {**kwargs, "backend": backend})
    d = kwargs.get("dim", -1) % x.dim()
    dy = randn(*V.clipped_half_shape(x.shape, d), dtype=x.dtype, seed=1)
    grad_kwargs = {k: v for k, v in kwargs.items() if k != "clamp_mode"}
    torch.library.opcheck(CLIPPED_GRAD, (dy, x, *rest), {**grad_kwargs, "backend": backend})
    mode1_kwargs = {k: v for k, v in grad_kwargs.items() if k in ("dim", "limit", "interleaved")}
    torch.library.opcheck(CLIPPED_GRAD_MODE1, (dy, x, *rest), {**mode1_kwargs, "backend": backend})


@pytest.mark.parametrize(
    ("name", "args", "kwargs"), list(clipped_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_ops_equal_the_public_functions(name, args, kwargs):
    x, *rest = args
    y = CLIPPED(*args, **kwargs, backend="reference")
    assert_bitwise_equal(y, swiglu_ops.clipped_swiglu(*args, **kwargs, backend="reference"), "y")
    dy = randn(*y.shape, dtype=x.dtype, seed=2)
    grad_kwargs = {k: v for k, v in kwargs.items() if k != "clamp_mode"}
    grad = CLIPPED_GRAD(dy, x, *rest, **grad_kwargs, backend="reference")
    assert_bitwise_equal(
        grad, swiglu_ops.clipped_swiglu_grad(dy, x, *rest, **grad_kwargs, backend="reference"), "g"
    )


def test_fake_kernels_validate_at_trace_time():
    with FakeTensorMode():
        x = torch.empty(4, 8)
        assert CLIPPED(x, backend="reference").shape == (4, 4)
        assert CLIPPED(torch.empty(2, 4, 3), dim=1).shape == (2, 2, 3)
        assert CLIPPED_GRAD(torch.empty(4, 4), x).shape == (4, 8)
        with pytest.raises(ValueError, match="limit"):
            CLIPPED(x, limit=0.0)
        with pytest.raises(ValueError, match="even"):
            CLIPPED(torch.empty(4, 7))
        with pytest.raises(TypeError, match="grad_y must have the dtype"):
            CLIPPED_GRAD(torch.empty(4, 4, dtype=BF16), x)
        with pytest.raises(ValueError, match="at most 8192"):
            CLIPPED(x, torch.empty(8193, dtype=torch.int64))
        with pytest.raises(ValueError, match="clamp_mode"):
            CLIPPED(x, clamp_mode=2)


def test_public_functions_compile_fullgraph_dynamic_and_match_eager():
    """The public functions trace as their custom ops (also with out= and dynamic shapes); compiled before any
    eager call, eager calls still work afterwards (README 6.3)."""

    def chain(x, dy, counts, out):
        y = swiglu_ops.clipped_swiglu(x, counts, backend="reference")
        y1 = swiglu_ops.clipped_swiglu(
            x, counts, clamp_mode=1, interleaved=False, backend="reference", out=out
        )
        grad = swiglu_ops.clipped_swiglu_grad(dy, x, counts, backend="reference")
        return y, y1, grad

    for shape in ((8, 32), (5, 16)):
        x, dy, counts = randn(*shape, seed=3), randn(shape[0], shape[1] // 2, seed=4), torch.tensor([3, 1])
        torch._dynamo.reset()
        compiled = torch.compile(chain, fullgraph=True, dynamic=True)
        out_c, out_e = torch.empty_like(dy), torch.empty_like(dy)
        got = compiled(x, dy, counts, out_c)
        want = chain(x, dy, counts, out_e)
        for g, w, name in zip(got, want, ("y", "y mode 1 (out=)", "grad"), strict=True):
            assert_bitwise_equal(g, w, name)
        assert_bitwise_equal(out_c, out_e, "out")


# --------------------------------------------------------------------------------- autograd and module


def _float64_autograd(x, dy, *, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, clamp_mode=0):
    """torch autograd of the formulas in float64 (Hugging Face's form for clamp_mode 0: closed clamps)."""
    x64 = x.detach().double().requires_grad_()
    a, b = (x64[..., ::2], x64[..., 1::2]) if interleaved else x64.chunk(2, dim=-1)
    b = b.clamp(-limit, limit)
    if clamp_mode == 0:
        a = a.clamp(max=limit)
        y = a * torch.sigmoid(a * float(torch.tensor(alpha, dtype=F32))) * (b + bias)
    else:
        y = torch.nn.functional.silu(a).clamp(max=limit) * b
    y.backward(dy.double())
    return y.detach(), x64.grad


def _away_from_the_kinks(x, limit, clamp_mode, margin=0.05):
    """Values near the clamp boundaries (A or silu(A) near L, B near +-L) moved to 0: autograd of the fp32
    formula and the fp32 operator may round to different sides there."""
    x = x.clone()
    a, b = x[..., ::2], x[..., 1::2]
    gate = a if clamp_mode == 0 else torch.nn.functional.silu(a)
    a[(gate - limit).abs() < margin] = 0.0
    b[(b.abs() - limit).abs() < margin] = 0.0
    return x


@pytest.mark.parametrize("clamp_mode", [0, 1])
@pytest.mark.parametrize("shape", [(12, 32), (3, 4, 20)])
def test_module_matches_float64_autograd(clamp_mode, shape):
    """ClippedSwiGLU's forward and backward (through the operators; clamp_mode 1 through the library's
    extension) against torch autograd of the formula in float64: fp32 rounding only."""
    limit = 2.5 if clamp_mode == 1 else 7.0
    x = _away_from_the_kinks(randn(*shape, seed=5), limit, clamp_mode)
    dy = randn(*shape[:-1], shape[-1] // 2, seed=6, scale=1.0)
    module = swiglu_ops.ClippedSwiGLU(limit=limit, clamp_mode=clamp_mode, backend="reference")
    xr = x.clone().requires_grad_()
    y = module(xr)
    y.backward(dy)
    y64, grad64 = _float64_autograd(x, dy, limit=limit, clamp_mode=clamp_mode)
    torch.testing.assert_close(y.double(), y64, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(xr.grad.double(), grad64, rtol=1e-5, atol=1e-5)
    op_grad = swiglu_ops.clipped_swiglu_grad if clamp_mode == 0 else _api.clipped_swiglu_grad_mode1
    kwargs = {"limit": limit, "backend": "reference"}
    assert_bitwise_equal(xr.grad, op_grad(dy, x, **kwargs), "x.grad (the operator's gradient)")


def test_gradcheck_of_the_fp32_computation():
    """torch.autograd.gradcheck on a float64 wrapper around the fp32 computation (central differences with
    eps = 1e-3, so the fp32 rounding of the function values sets the tolerance), both clamp modes."""
    for clamp_mode, limit in ((0, 7.0), (1, 2.5)):
        x = _away_from_the_kinks(randn(4, 16, seed=7), limit, clamp_mode, margin=0.01)
        gi = torch.tensor([3])

        def fn(x64, clamp_mode=clamp_mode, limit=limit, gi=gi):
            y = swiglu_ops.clipped_swiglu(
                x64.float(), gi, limit=limit, clamp_mode=clamp_mode, backend="reference"
            )
            return y.double()

        assert torch.autograd.gradcheck(fn, (x.double().requires_grad_(),), eps=1e-3, atol=2e-3, rtol=2e-3)


def test_masked_rows_and_dims_in_autograd():
    x = randn(3, 4, 10, seed=8).requires_grad_()
    dy = randn(3, 2, 10, seed=9)
    y = swiglu_ops.clipped_swiglu(x, torch.tensor([2]), dim=1, backend="reference")
    assert y.grad_fn is not None and torch.equal(y[2], torch.zeros(2, 10))
    y.backward(dy)
    assert torch.equal(x.grad[2], torch.zeros(4, 10)) and bool((x.grad[:2] != 0).any())
    assert_bitwise_equal(
        x.grad,
        swiglu_ops.clipped_swiglu_grad(dy, x.detach(), torch.tensor([2]), dim=1, backend="reference"),
        "g",
    )


def test_module_and_function_api():
    module = swiglu_ops.ClippedSwiGLU(backend="reference")
    assert list(module.parameters()) == []
    assert repr(module) == (
        "ClippedSwiGLU(dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, clamp_mode=0, "
        "backend='reference')"
    )
    assert swiglu_ops.ClippedSwiGLU is swiglu_ops.training.nn.ClippedSwiGLU
    for obj in (swiglu_ops.ClippedSwiGLU, swiglu_ops.clipped_swiglu, swiglu_ops.clipped_swiglu_grad):
        assert "limit" in obj.__doc__ and "interleaved" in obj.__doc__
    x = randn(4, 16, seed=10)
    assert_bitwise_equal(module(x), swiglu_ops.clipped_swiglu(x, backend="reference"), "y")
    with pytest.raises(ValueError, match="limit"):
        swiglu_ops.ClippedSwiGLU(limit=-1.0)
    with pytest.raises(ValueError, match="clamp_mode"):
        swiglu_ops.ClippedSwiGLU(clamp_mode=3)
    with pytest.raises(ValueError, match="out="):
        swiglu_ops.clipped_swiglu(x.requires_grad_(), out=torch.empty(4, 8))
    with torch.no_grad():  # no autograd needed: out= is fine
        swiglu_ops.clipped_swiglu(x, out=torch.empty(4, 8), backend="reference")
    xr = randn(4, 16, seed=11).requires_grad_()
    dyr = torch.ones(4, 8, requires_grad=True)
    (g,) = torch.autograd.grad(module(xr), xr, grad_outputs=dyr, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):  # no double backward (section 10)
        g.sum().backward()


def test_module_compiles_fullgraph():
    x, dy = randn(8, 32, seed=12), randn(8, 16, seed=13, scale=1.0)
    counts = torch.tensor([6])
    modules = [swiglu_ops.ClippedSwiGLU(backend="reference"),
               swiglu_ops.ClippedSwiGLU(clamp_mode=1, interleaved=False, backend="reference")]  # fmt: skip

    def fn(x):
        return modules[0](x, counts) * modules[1](x)

    def grads(f):
        xr = x.clone().requires_grad_()
        out = f(xr)
        out.backward(dy)
        return out, xr.grad

    for compile_backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        got = grads(torch.compile(fn, fullgraph=True, backend=compile_backend))
        for g, w in zip(got, grads(fn), strict=True):
            assert_bitwise_equal(g, w, f"compiled ({compile_backend})")


# ------------------------------------------------------------------- MX backward with GPT-OSS arguments


def _swap_pairs(t):
    return torch.stack([t[..., 1::2], t[..., 0::2]], dim=-1).flatten(-2)


MX_GLU = [
    ("interleaved", {"interleaved": True}, {}),
    ("chunked", {"interleaved": False}, {}),
    ("interleaved, B first", {"interleaved": True, "activate_left": False}, {}),
    ("chunked, right half activated", {"interleaved": False, "activate_left": False}, {}),
    (
        "inf limit, e5m2, OCP",
        {"interleaved": True, "limit": INF},
        {"dst_dtype": torch.float8_e5m2, "scale_alg": 0},
    ),
]


@pytest.mark.parametrize(("name", "glu", "options"), MX_GLU, ids=[c[0] for c in MX_GLU])
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("groups", [None, [16, 16, 40]])
def test_mx_stage1_is_clipped_swiglu_grad(backend, name, glu, options, dtype, groups):
    """With limit/alpha/bias, the MX backward quantises exactly clipped_swiglu_grad's rounded gradient (in
    x's columns), whatever the split; checked against the independent quantiser of _oracles."""
    glu = {"limit": 7.0, "alpha": 1.702, "bias": 1.0, **glu}
    x = randn(40, 64, dtype=dtype, seed=14)
    dy = randn(40, 32, dtype=dtype, seed=15, scale=1.0)
    gi = None if groups is None else torch.tensor(groups)
    activate_left = glu.pop("activate_left", True)
    interleaved = glu["interleaved"]
    attrs = {k: glu[k] for k in ("limit", "alpha", "bias")}
    if activate_left:
        grad = swiglu_ops.clipped_swiglu_grad(dy, x, interleaved=interleaved, backend="reference", **attrs)
    elif interleaved:  # A = odd columns: the operator on the swapped pairs, swapped back
        grad = _swap_pairs(swiglu_ops.clipped_swiglu_grad(dy, _swap_pairs(x), backend="reference", **attrs))
    else:
        swapped = torch.cat([x[:, 32:], x[:, :32]], dim=1)
        g = swiglu_ops.clipped_swiglu_grad(dy, swapped, interleaved=False, backend="reference", **attrs)
        grad = torch.cat([g[:, 32:], g[:, :32]], dim=1)
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, dy, gi, activate_left=activate_left, backend=backend, **glu, **options
    )
    assert_mx_matches(got, expected_mx(grad, gi, **options), backend)


def test_mx_defaults_stay_plain_swiglu_and_scale_alg_none_is_rcel():
    x, dy = randn(40, 64, dtype=BF16, seed=16), randn(40, 32, dtype=BF16, seed=17, scale=1.0)
    plain = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="reference")
    for kwargs in ({"scale_alg": None}, {"limit": None, "alpha": None, "bias": None, "interleaved": False}):
        got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="reference", **kwargs)
        for g, w in zip(got, plain, strict=True):
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
    op = ops.swiglu_backward_mx_quant_dual_axis(x, dy, scale_alg=None, backend="reference")
    assert all(
        torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(op[:4], plain, strict=True)
    )
    torch.library.opcheck(
        ops.swiglu_backward_mx_quant_dual_axis.default,
        (x, dy, torch.tensor([10, 40])),
        {
            "limit": 7.0,
            "alpha": 1.702,
            "bias": 1.0,
            "interleaved": True,
            "scale_alg": None,
            "backend": "reference",
        },
    )


@pytest.mark.parametrize("interleaved", [True, False])
def test_swiglu_mx_backward_with_gpt_oss_arguments(interleaved):
    """The autograd wrapper's forward is the clipped SwiGLU (bitwise clipped_swiglu) and its backward the
    dequantised MX gradient of the operator with the same arguments."""
    x = randn(64, 128, dtype=BF16, seed=18).requires_grad_()
    dy = randn(64, 64, dtype=BF16, seed=19, scale=1.0)
    attrs = {"limit": 7.0, "alpha": 1.702, "bias": 1.0, "interleaved": interleaved}
    capture = swiglu_ops.MXGradient()
    y = swiglu_ops.swiglu_mx_backward(x, backend="reference", capture=capture, **attrs)
    with torch.no_grad():
        assert_bitwise_equal(y, swiglu_ops.clipped_swiglu(x, backend="reference", **attrs), "y")
    y.backward(dy)
    y1, s1, *_ = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x.detach(), dy, backend="reference", **attrs)
    assert torch.equal(capture.y1.view(torch.uint8), y1.view(torch.uint8))
    assert torch.equal(x.grad, swiglu_ops.mx_dequantize(y1, s1, axis=-1, dtype=BF16))
