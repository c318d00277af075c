"""Argument validation: one row per rejection rule of both operator documents (group_grad 2.1 / 2.4 / 7.3,
mx 1.5 and section 7 cases 5-7) and of the contract (spec README section 2), then the accepted cases."""

from __future__ import annotations

import pytest
import torch

import swiglu_ops
from swiglu_ops import _api

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
INF, NAN = float("inf"), float("nan")


def ones(*shape, dtype=F32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def group_grad(**over):
    """swiglu_group_grad with valid fp32 (4, 16) arguments, ``over`` replacing some of them."""
    kwargs = {
        "grad_y": ones(4, 16),
        "x": ones(4, 32),
        "weight": None,
        "y_origin": None,
        "group_index": None,
        "clamp_limit": 0.0,
        "backend": "reference",
    }
    kwargs.update(over)
    return lambda: swiglu_ops.swiglu_group_grad(**kwargs)


def with_weight(**over):
    return group_grad(weight=ones(4), y_origin=ones(4, 16), **over)


def mx_quant(**over):
    """swiglu_backward_mx_quant_dual_axis with valid bf16 (4, 64) arguments, ``over`` replacing some."""
    kwargs = {
        "x": ones(4, 64, dtype=BF16),
        "y_grad": ones(4, 32, dtype=BF16),
        "group_index": None,
        "backend": "reference",
    }
    kwargs.update(over)
    return lambda: swiglu_ops.swiglu_backward_mx_quant_dual_axis(**kwargs)


def mx_out(index=None, tensor=None):
    """A valid ``out`` tuple for mx_quant()'s default arguments, entry ``index`` replaced by ``tensor``."""
    out = [
        torch.empty(4, 64, dtype=torch.float8_e4m3fn),
        torch.empty(4, 1, 2, dtype=torch.float8_e8m0fnu),
        torch.empty(4, 64, dtype=torch.float8_e4m3fn),
        torch.empty(1, 64, 2, dtype=torch.float8_e8m0fnu),
    ]
    if index is not None:
        out[index] = tensor
    return tuple(out)


def dequant(data=None, scale=None, **kwargs):
    data = torch.zeros(4, 64, dtype=torch.float8_e4m3fn) if data is None else data
    scale = torch.zeros(4, 1, 2, dtype=torch.uint8) if scale is None else scale
    return lambda: swiglu_ops.mx_dequantize(data, scale, **kwargs)


REJECTED = [
    # --- swiglu_group_grad: aclnn 2.1 / UT 7.3 / torch 2.4
    ("gg: grad_y missing", group_grad(grad_y=None), TypeError, "grad_y"),
    ("gg: x missing", group_grad(x=None), TypeError, "x must be a torch.Tensor"),
    ("gg: x not a tensor", group_grad(x=[[1.0] * 32] * 4), TypeError, "x must be a torch.Tensor"),
    (
        "gg: int8 dtype",
        group_grad(grad_y=ones(4, 16, dtype=torch.int8), x=ones(4, 32, dtype=torch.int8)),
        TypeError,
        "grad_y",
    ),
    (
        "gg: double dtype",
        group_grad(grad_y=ones(4, 16, dtype=torch.float64), x=ones(4, 32, dtype=torch.float64)),
        TypeError,
        "grad_y",
    ),
    ("gg: fp32 grad_y with fp16 x", group_grad(x=ones(4, 32, dtype=F16)), TypeError, "x must have the dtype"),
    ("gg: x last dim 33 for H=16", group_grad(x=ones(4, 33)), ValueError, "x last dim"),
    ("gg: 1-D grad_y", group_grad(grad_y=ones(16), x=ones(32)), ValueError, "grad_y must have rank"),
    ("gg: rank mismatch", group_grad(x=ones(1, 4, 32)), ValueError, "x must have the rank"),
    ("gg: leading dims mismatch", group_grad(x=ones(5, 32)), ValueError, "x leading dims"),
    ("gg: H = 0", group_grad(grad_y=ones(4, 0), x=ones(4, 0)), ValueError, r"\(H\) must be greater than 0"),
    (
        "gg: weight int32",
        group_grad(weight=ones(4, dtype=torch.int32), y_origin=ones(4, 16)),
        TypeError,
        "weight must be float32",
    ),
    ("gg: weight numel != rows", group_grad(weight=ones(5), y_origin=ones(4, 16)), ValueError, "weight must"),
    ("gg: weight not a tensor", group_grad(weight=[1.0] * 4, y_origin=ones(4, 16)), TypeError, "weight"),
    ("gg: weight without y_origin", group_grad(weight=ones(4)), ValueError, "weight and y_origin"),
    ("gg: y_origin without weight", group_grad(y_origin=ones(4, 16)), ValueError, "weight and y_origin"),
    (
        "gg: y_origin dtype",
        group_grad(weight=ones(4), y_origin=ones(4, 16, dtype=BF16)),
        TypeError,
        "y_origin",
    ),
    ("gg: y_origin shape", group_grad(weight=ones(4), y_origin=ones(4, 17)), ValueError, "y_origin"),
    ("gg: group_index fp32", group_grad(group_index=ones(1)), TypeError, "group_index"),
    ("gg: group_index int16", group_grad(group_index=ones(1, dtype=torch.int16)), TypeError, "group_index"),
    (
        "gg: group_index empty",
        group_grad(group_index=torch.zeros(0, dtype=torch.int64)),
        ValueError,
        "group_index",
    ),
    (
        "gg: group_index 2-D",
        group_grad(group_index=torch.ones(1, 1, dtype=torch.int64)),
        ValueError,
        "group_index",
    ),
    (
        "gg: group_index on another device",
        group_grad(group_index=torch.ones(1, dtype=torch.int64, device="meta")),
        ValueError,
        "group_index must be on the same device",
    ),
    ("gg: clamp -1", group_grad(clamp_limit=-1.0), ValueError, "clamp_limit"),
    ("gg: clamp NaN", group_grad(clamp_limit=NAN), ValueError, "clamp_limit"),
    ("gg: clamp -inf", group_grad(clamp_limit=-INF), ValueError, "clamp_limit"),
    ("gg: clamp string", group_grad(clamp_limit="3"), TypeError, "clamp_limit"),
    ("gg: clamp bool", group_grad(clamp_limit=True), TypeError, "clamp_limit"),
    (
        "gg: weight given, out grad_weight missing",
        with_weight(out=(ones(4, 32), None)),
        TypeError,
        r"out\[1\] \(grad_weight\)",
    ),
    ("gg: out grad_weight without weight", group_grad(out=(ones(4, 32), ones(4))), ValueError, r"out\[1\]"),
    ("gg: out not a pair", group_grad(out=ones(4, 32)), TypeError, "out must be"),
    (
        "gg: out grad_x dtype",
        group_grad(out=(ones(4, 32, dtype=BF16), None)),
        TypeError,
        r"out\[0\] \(grad_x\)",
    ),
    ("gg: out grad_x shape", group_grad(out=(ones(4, 16), None)), ValueError, r"out\[0\] \(grad_x\)"),
    ("gg: out grad_x strided", group_grad(out=(ones(32, 4).t(), None)), ValueError, r"out\[0\].*contiguous"),
    ("gg: out grad_weight shape", with_weight(out=(ones(4, 32), ones(4, 1))), ValueError, r"out\[1\]"),
    ("gg: unknown backend", group_grad(backend="numpy"), ValueError, "backend must be one of"),
    ("gg: backend not a string", group_grad(backend=None), TypeError, "backend must be a string"),
    # --- swiglu_backward_mx_quant_dual_axis: tiling 1.5 / UT section 7 / contract
    ("mx: x missing", mx_quant(x=None), TypeError, "x must be a torch.Tensor"),
    ("mx: y_grad missing", mx_quant(y_grad=None), TypeError, "y_grad must be a torch.Tensor"),
    ("mx: x int8", mx_quant(x=ones(4, 64, dtype=torch.int8)), TypeError, "x must be"),
    ("mx: x double", mx_quant(x=ones(4, 64, dtype=torch.float64)), TypeError, "x must be"),
    (
        "mx: y_grad dtype != x",
        mx_quant(y_grad=ones(4, 32, dtype=F16)),
        TypeError,
        "y_grad must have the dtype",
    ),
    ("mx: group_index fp32", mx_quant(group_index=ones(1)), TypeError, "group_index"),
    ("mx: dst_dtype fp16", mx_quant(dst_dtype=F16), TypeError, "dst_dtype"),
    ("mx: dst_dtype e4m3fnuz", mx_quant(dst_dtype=torch.float8_e4m3fnuz), TypeError, "dst_dtype"),
    ("mx: dst_dtype as ge number (36)", mx_quant(dst_dtype=36), TypeError, "dst_dtype"),
    ("mx: UT case 7, dst_dtype 99", mx_quant(activate_left=False, dst_dtype=99), TypeError, "dst_dtype"),
    (
        "mx: UT case 5, round_mode floor",
        mx_quant(activate_left=False, round_mode="floor"),
        ValueError,
        "round_mode",
    ),
    ("mx: round_mode round", mx_quant(round_mode="round"), ValueError, "round_mode"),
    ("mx: round_mode None", mx_quant(round_mode=None), ValueError, "round_mode"),
    ("mx: scale_alg 2", mx_quant(scale_alg=2), ValueError, "scale_alg"),
    ("mx: scale_alg -1", mx_quant(scale_alg=-1), ValueError, "scale_alg"),
    ("mx: scale_alg float", mx_quant(scale_alg=1.0), TypeError, "scale_alg"),
    ("mx: scale_alg bool", mx_quant(scale_alg=True), TypeError, "scale_alg"),
    ("mx: activate_left int", mx_quant(activate_left=1), TypeError, "activate_left"),
    ("mx: max_dtype_value 448", mx_quant(max_dtype_value=448.0), ValueError, "max_dtype_value"),
    ("mx: max_dtype_value string", mx_quant(max_dtype_value="0"), TypeError, "max_dtype_value"),
    (
        "mx: x rank 1",
        mx_quant(x=ones(64, dtype=BF16), y_grad=ones(32, dtype=BF16)),
        ValueError,
        "x must have rank",
    ),
    (
        "mx: x rank 7",
        mx_quant(x=ones(1, 1, 1, 1, 1, 4, 64, dtype=BF16), y_grad=ones(1, 1, 1, 1, 1, 4, 32, dtype=BF16)),
        ValueError,
        "x must have rank",
    ),
    (
        "mx: 2N = 32",
        mx_quant(x=ones(4, 32, dtype=BF16), y_grad=ones(4, 16, dtype=BF16)),
        ValueError,
        "x last dim",
    ),
    (
        "mx: 2N = 96",
        mx_quant(x=ones(4, 96, dtype=BF16), y_grad=ones(4, 48, dtype=BF16)),
        ValueError,
        "x last dim",
    ),
    (
        "mx: 2N = 0",
        mx_quant(x=ones(4, 0, dtype=BF16), y_grad=ones(4, 0, dtype=BF16)),
        ValueError,
        "x last dim",
    ),
    ("mx: y_grad last dim", mx_quant(y_grad=ones(4, 64, dtype=BF16)), ValueError, "y_grad must have shape"),
    ("mx: y_grad rows", mx_quant(y_grad=ones(3, 32, dtype=BF16)), ValueError, "y_grad must have shape"),
    (
        "mx: y_grad batch dims",
        mx_quant(x=ones(2, 4, 64, dtype=BF16), y_grad=ones(3, 4, 32, dtype=BF16)),
        ValueError,
        "y_grad must have shape",
    ),
    ("mx: y_grad rank", mx_quant(y_grad=ones(1, 4, 32, dtype=BF16)), ValueError, "y_grad must have shape"),
    (
        "mx: y_grad on another device",
        mx_quant(y_grad=ones(4, 32, dtype=BF16, device="meta")),
        ValueError,
        "y_grad must be on the same device",
    ),
    ("mx: group_index 2-D", mx_quant(group_index=torch.tensor([[4]])), ValueError, "group_index"),
    (
        "mx: group_index empty",
        mx_quant(group_index=torch.zeros(0, dtype=torch.int64)),
        ValueError,
        "group_index",
    ),
    (
        "mx: group_index with 3-D x",
        mx_quant(
            x=ones(1, 4, 64, dtype=BF16), y_grad=ones(1, 4, 32, dtype=BF16), group_index=torch.tensor([4])
        ),
        ValueError,
        "group_index",
    ),
    (
        "mx: group_index negative",
        mx_quant(group_index=torch.tensor([-1, 4])),
        ValueError,
        "group_index.*>= 0",
    ),
    (
        "mx: group_index decreasing",
        mx_quant(group_index=torch.tensor([3, 2, 4])),
        ValueError,
        "group_index.*non-decreasing",
    ),
    (
        "mx: group_index last < M (TORCH case a)",
        mx_quant(
            x=ones(128, 128, dtype=BF16), y_grad=ones(128, 64, dtype=BF16), group_index=torch.tensor([2, 4])
        ),
        ValueError,
        "group_index last value",
    ),
    (
        "mx: group_index last > M",
        mx_quant(group_index=torch.tensor([5])),
        ValueError,
        "group_index last value",
    ),
    (
        "mx: group_index on another device",
        mx_quant(group_index=torch.tensor([4], device="meta")),
        ValueError,
        "group_index must be on the same device",
    ),
    ("mx: out not a 4-tuple", mx_quant(out=mx_out()[:3]), TypeError, "out must be"),
    (
        "mx: out y1 dtype",
        mx_quant(out=mx_out(0, torch.empty(4, 64, dtype=torch.uint8))),
        TypeError,
        r"out\[0\] \(y1\)",
    ),
    (
        "mx: out y1 e5m2 for e4m3 output",
        mx_quant(out=mx_out(0, torch.empty(4, 64, dtype=torch.float8_e5m2))),
        TypeError,
        r"out\[0\] \(y1\)",
    ),
    (
        "mx: out mxscale1 uint8",
        mx_quant(out=mx_out(1, torch.empty(4, 1, 2, dtype=torch.uint8))),
        TypeError,
        r"out\[1\] \(mxscale1\)",
    ),
    (
        "mx: out mxscale2 shape",
        mx_quant(out=mx_out(3, torch.empty(2, 64, 2, dtype=torch.float8_e8m0fnu))),
        ValueError,
        r"out\[3\] \(mxscale2\)",
    ),
    (
        "mx: out y2 strided",
        mx_quant(out=mx_out(2, torch.empty(64, 4, dtype=torch.float8_e4m3fn).t())),
        ValueError,
        r"out\[2\] \(y2\).*contiguous",
    ),
    ("mx: unknown backend", mx_quant(backend="cuda"), ValueError, "backend must be one of"),
    # --- mx_dequantize
    ("dequant: data not a tensor", dequant(data=[0] * 64), TypeError, "data and scale must be tensors"),
    ("dequant: data not fp8", dequant(data=torch.zeros(4, 64)), TypeError, "data"),
    ("dequant: scale float", dequant(scale=torch.zeros(4, 1, 2)), TypeError, "scale"),
    (
        "dequant: scale shape",
        dequant(scale=torch.zeros(4, 2, 2, dtype=torch.uint8)),
        ValueError,
        "scale must have shape",
    ),
    (
        "dequant: mxscale2 shape",
        dequant(scale=torch.zeros(1, 64, 2, dtype=torch.uint8), axis=-2, group_index=torch.tensor([2, 4])),
        ValueError,
        "scale must have shape",
    ),
    ("dequant: axis 0", dequant(axis=0), ValueError, "axis"),
    ("dequant: data rank 1", dequant(data=torch.zeros(64, dtype=torch.float8_e4m3fn)), ValueError, "data"),
    (
        "dequant: group_index with 3-D data",
        dequant(
            data=torch.zeros(1, 4, 64, dtype=torch.float8_e4m3fn),
            scale=torch.zeros(1, 1, 64, 2, dtype=torch.uint8),
            axis=-2,
            group_index=torch.tensor([4]),
        ),
        ValueError,
        "group_index",
    ),
    # --- settings read from the environment at import
    (
        "env: cpu cache size not a number",
        lambda: _cpu_cache_bytes("1GB"),
        ValueError,
        "SWIGLU_OPS_CPU_CACHE_MB",
    ),
    ("env: cpu cache size negative", lambda: _cpu_cache_bytes("-1"), ValueError, "SWIGLU_OPS_CPU_CACHE_MB"),
    ("env: cpu simd not 0/1", lambda: _cpu_simd("on"), ValueError, "SWIGLU_OPS_CPU_SIMD"),
    (
        "env: triton hw conversions not 0/1",
        lambda: _triton_hw_cvt("yes"),
        ValueError,
        "SWIGLU_OPS_TRITON_HW_CVT",
    ),
]


def _cpu_simd(value):
    from swiglu_ops.cpu._native import simd_from_env

    return simd_from_env(value)


def _cpu_cache_bytes(value):
    from swiglu_ops.cpu._memory import cache_bytes_from_env

    return cache_bytes_from_env(value)


def _triton_hw_cvt(value):
    triton_backend = pytest.importorskip("swiglu_ops.triton")
    return triton_backend.hw_conversions_from_env(value)


def test_environment_settings_accepted():
    assert _cpu_cache_bytes(None) == _cpu_cache_bytes("") == 1024 << 20
    assert _cpu_cache_bytes("0") == 0 and _cpu_cache_bytes(" 64 ") == 64 << 20
    assert [_triton_hw_cvt(v) for v in (None, "", "0", "1")] == [False, False, False, True]


@pytest.mark.parametrize(("call", "error", "match"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED])
def test_rejected(call, error, match):
    """Each rule raises its ValueError / TypeError, and the message names the offending argument."""
    with pytest.raises(error, match=match):
        call()


def test_unavailable_backend_is_an_error(monkeypatch):
    """An unavailable backend raises instead of falling back (e.g. "triton" on CPU tensors without
    TRITON_INTERPRET); when every backend is available here, one is made unavailable."""
    available = swiglu_ops.available_backends("cpu")
    missing = [b for b in _api.BACKENDS if b not in available]
    if missing:
        name = missing[0]
    else:
        name = "reference"
        monkeypatch.setattr(
            _api._load("reference"), "is_available", lambda device: (False, "disabled by test")
        )
    with pytest.raises(ValueError, match=f"backend '{name}' is not available"):
        group_grad(backend=name)()
    with pytest.raises(ValueError, match=f"backend '{name}' is not available"):
        mx_quant(backend=name)()


# ------------------------------------------------------------------------------------------ accepted


def _gg_case(dtype, lead, hidden, weight_shape=None, group_index=None, clamp=0.0):
    def make():
        dy = ones(*lead, hidden, dtype=dtype)
        x = ones(*lead, 2 * hidden, dtype=dtype)
        weight = None if weight_shape is None else ones(*weight_shape)
        y_origin = None if weight_shape is None else ones(*lead, hidden, dtype=dtype)
        return (dy, x, weight, y_origin, group_index, clamp), (tuple(x.shape), dtype, weight_shape)

    return make


GROUP_GRAD_ACCEPTED = [
    ("fp32 (4,16)", _gg_case(F32, (4,), 16)),
    ("fp16 (4,16)", _gg_case(F16, (4,), 16)),
    ("bf16 (4,16)", _gg_case(BF16, (4,), 16)),
    ("clamp 3", _gg_case(F32, (4,), 16, clamp=3.0)),
    ("weight (4,)", _gg_case(F32, (4,), 16, weight_shape=(4,))),
    ("all options", _gg_case(F32, (4,), 16, (4, 1), torch.tensor([4]), 3.0)),
    ("3-D", _gg_case(BF16, (2, 4), 16)),
    ("3-D all options", _gg_case(BF16, (2, 4), 16, (2, 4, 1), torch.tensor([8]), 3.0)),
    ("3-D weight (8,)", _gg_case(F32, (2, 4), 16, (8,), None, 3.0)),
    ("fp16 (64,1024)", _gg_case(F16, (64,), 512)),
    ("empty (0,16)", _gg_case(F32, (0,), 16)),
    ("H=17", _gg_case(F16, (4,), 17)),
    ("H=8", _gg_case(BF16, (4,), 8)),
    ("clamp +inf", _gg_case(F32, (4,), 16, clamp=INF)),
    ("clamp -0.0", _gg_case(F32, (4,), 16, clamp=-0.0)),
    ("clamp int", _gg_case(F32, (4,), 16, clamp=3)),
    ("clamp 1e39 (fp32 inf)", _gg_case(F32, (4,), 16, clamp=1e39)),
    ("4-D (contract: rank >= 2)", _gg_case(F16, (2, 1, 3), 16, (2, 1, 3, 1), torch.tensor([5]), 1.0)),
    ("int32 group_index", _gg_case(F32, (4,), 16, group_index=torch.tensor([2, 2], dtype=torch.int32))),
    ("group_index values never checked", _gg_case(F32, (4,), 16, group_index=torch.tensor([-7, 2**40]))),
]


@pytest.mark.parametrize("make", [c[1] for c in GROUP_GRAD_ACCEPTED], ids=[c[0] for c in GROUP_GRAD_ACCEPTED])
def test_group_grad_accepted(backend, make):
    """Doc 7.3's accepted list plus the contract's extensions: outputs of the right shapes and dtypes."""
    args, (x_shape, dtype, weight_shape) = make()
    grad_x, grad_weight = swiglu_ops.swiglu_group_grad(*args, backend=backend)
    assert (tuple(grad_x.shape), grad_x.dtype) == (x_shape, dtype)
    if weight_shape is None:
        assert grad_weight is None
    else:
        assert (tuple(grad_weight.shape), grad_weight.dtype) == (weight_shape, F32)


MX_ACCEPTED = [
    # (id, x shape, dtype, group_index, options)
    ("UT 1 fp16 [8,8192]", (8, 8192), F16, None, {}),
    ("UT 2 bf16 [4,2048]", (4, 2048), BF16, None, {}),
    ("UT 3 fp16 [4,4096]", (4, 4096), F16, None, {}),
    ("UT 4 bf16 batch [2,128,1024]", (2, 128, 1024), BF16, None, {}),
    ("UT 6 scale_alg 0 (OCP)", (4, 64), F16, None, {"scale_alg": 0}),
    ("activate_left False", (4, 64), F16, None, {"activate_left": False}),
    ("e5m2", (4, 64), BF16, torch.tensor([4]), {"dst_dtype": torch.float8_e5m2}),
    ("fp32 x", (4, 64), F32, None, {}),
    ("M = 0", (0, 64), BF16, None, {}),
    ("M = 0 with groups", (0, 64), BF16, torch.tensor([0, 0]), {}),
    ("rank 6", (1, 2, 1, 1, 3, 64), BF16, None, {}),
    (
        "int32 group_index with empty groups",
        (70, 64),
        BF16,
        torch.tensor([0, 5, 5, 70], dtype=torch.int32),
        {},
    ),
    ("max_dtype_value int 0", (4, 64), BF16, None, {"max_dtype_value": 0}),
]


@pytest.mark.parametrize(
    ("x_shape", "dtype", "group_index", "options"),
    [c[1:] for c in MX_ACCEPTED],
    ids=[c[0] for c in MX_ACCEPTED],
)
def test_mx_quant_accepted(backend, x_shape, dtype, group_index, options):
    """The tiling UT's accepted cases and the contract's extensions: outputs of the right shapes/dtypes."""
    x = torch.ones(x_shape, dtype=dtype)
    y_grad = torch.ones(*x_shape[:-1], x_shape[-1] // 2, dtype=dtype)
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, y_grad, group_index, backend=backend, **options)
    *lead, m, c = x_shape
    rows = -(-m // 64) if group_index is None else m // 64 + group_index.numel()
    fp8 = options.get("dst_dtype", torch.float8_e4m3fn)
    expected = [
        (x_shape, fp8),
        ((*lead, m, c // 64, 2), torch.float8_e8m0fnu),
        (x_shape, fp8),
        ((*lead, rows, c, 2), torch.float8_e8m0fnu),
    ]
    assert [(tuple(t.shape), t.dtype) for t in got] == expected
