"""Argument validation: one row per rejection rule of both operator documents (group_grad 2.1 / 2.4 / 7.3,
mx 1.5 and section 7 cases 5-7) and of the contract (spec README section 2), then the accepted cases."""

from __future__ import annotations

import os

import pytest
import torch

import swiglu_ops
from swiglu_ops.ops import registry

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


E2M1, E1M2, E8M0 = torch.float4_e2m1fn_x2, swiglu_ops.float4_e1m2fn_x2, torch.float8_e8m0fnu


def mx_fwd(**over):
    """swiglu_mx_quant_dual_axis with a valid bf16 (4, 40) x (N = 20), ``over`` replacing some arguments."""
    kwargs = {"x": ones(4, 40, dtype=BF16), "group_index": None, "backend": "reference"}
    kwargs.update(over)
    return lambda: swiglu_ops.swiglu_mx_quant_dual_axis(**kwargs)


def mx_fwd_out(index=None, tensor=None, dst=torch.float8_e4m3fn):
    """A valid ``out`` tuple for mx_fwd()'s x and ``dst``, entry ``index`` replaced by ``tensor``."""
    y_dtype, width = {E2M1: (E2M1, 10), E1M2: (torch.uint8, 10)}.get(dst, (dst, 20))
    out = [
        torch.empty(4, width, dtype=y_dtype),
        torch.empty(4, 1, 2, dtype=E8M0),
        torch.empty(4, width, dtype=y_dtype),
        torch.empty(1, 20, 2, dtype=E8M0),
    ]
    if index is not None:
        out[index] = tensor
    return tuple(out)


def clipped(**over):
    """clipped_swiglu with a valid fp32 (4, 32) x, ``over`` replacing some arguments."""
    kwargs = {"x": ones(4, 32), "group_index": None, "backend": "reference"}
    kwargs.update(over)
    return lambda: swiglu_ops.clipped_swiglu(**kwargs)


def clipped_grad(**over):
    """clipped_swiglu_grad with valid fp32 (4, 16) / (4, 32) arguments, ``over`` replacing some of them."""
    kwargs = {"grad_y": ones(4, 16), "x": ones(4, 32), "group_index": None, "backend": "reference"}
    kwargs.update(over)
    return lambda: swiglu_ops.clipped_swiglu_grad(**kwargs)


def _overlapping_out(x: torch.Tensor, shape) -> torch.Tensor:
    """A contiguous tensor of ``shape`` sharing x's memory."""
    return x.view(-1)[: torch.Size(shape).numel()].view(shape)


_CLIPPED_X = ones(4, 32)
_CLIPPED_DY_BASE = ones(8, 16)  # grad_y is its first half; a (4, 32) view of it overlaps grad_y


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
        r"group_index \(cumulative row ends\) last value",
    ),
    (
        "mx: group_index last > M",
        mx_quant(group_index=torch.tensor([5])),
        ValueError,
        r"group_index \(cumulative row ends\) last value",
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
    # --- swiglu_backward_mx_quant_dual_axis: the GPT-OSS arguments (README 6.1/6.2)
    ("mx: limit without alpha/bias", mx_quant(limit=7.0), ValueError, "limit, alpha and bias"),
    ("mx: alpha without limit/bias", mx_quant(alpha=1.702), ValueError, "limit, alpha and bias"),
    (
        "mx: limit and alpha without bias",
        mx_quant(limit=7.0, alpha=1.702),
        ValueError,
        "limit, alpha and bias",
    ),
    ("mx: gpt-oss limit 0", mx_quant(limit=0.0, alpha=1.702, bias=1.0), ValueError, "limit must be > 0"),
    ("mx: gpt-oss limit NaN", mx_quant(limit=NAN, alpha=1.702, bias=1.0), ValueError, "limit must be > 0"),
    ("mx: gpt-oss alpha string", mx_quant(limit=7.0, alpha="1.7", bias=1.0), TypeError, "alpha"),
    ("mx: gpt-oss bias bool", mx_quant(limit=7.0, alpha=1.702, bias=True), TypeError, "bias"),
    ("mx: interleaved int", mx_quant(interleaved=1), TypeError, "interleaved"),
    ("mx: scale_alg string", mx_quant(scale_alg="1"), TypeError, "scale_alg"),
    # --- clipped_swiglu: clipped_swiglu.md 2.1 / 2.3 / UT 8.5 / README 6.1
    ("cs: x missing", clipped(x=None), TypeError, "x must be a torch.Tensor"),
    ("cs: x not a tensor", clipped(x=[[1.0] * 32] * 4), TypeError, "x must be a torch.Tensor"),
    ("cs: UT int8 x", clipped(x=ones(4, 32, dtype=torch.int8)), TypeError, "x must be bfloat16"),
    ("cs: double x", clipped(x=ones(4, 32, dtype=torch.float64)), TypeError, "x must be bfloat16"),
    ("cs: UT empty shape (rank 0)", clipped(x=torch.tensor(1.0)), ValueError, "x must have rank 1..8"),
    ("cs: rank 9", clipped(x=ones(1, 1, 1, 1, 1, 1, 1, 1, 2)), ValueError, "x must have rank 1..8"),
    ("cs: UT dim = 10", clipped(dim=10), ValueError, r"dim must be in \[-2, 1\]"),
    ("cs: dim = -3 on rank 2", clipped(dim=-3), ValueError, "dim must be in"),
    ("cs: dim float", clipped(dim=1.0), TypeError, "dim must be an int"),
    ("cs: dim bool", clipped(dim=True), TypeError, "dim must be an int"),
    ("cs: UT (1, 3): odd x.shape[dim]", clipped(x=ones(1, 3)), ValueError, r"x.shape\[dim\] must be even"),
    ("cs: odd x.shape[dim], dim 0", clipped(x=ones(3, 4), dim=0), ValueError, r"x.shape\[dim\] must be even"),
    ("cs: UT limit 0", clipped(limit=0.0), ValueError, "limit must be > 0"),
    ("cs: UT limit -1", clipped(limit=-1.0), ValueError, "limit must be > 0"),
    ("cs: limit NaN", clipped(limit=NAN), ValueError, "limit must be > 0"),
    ("cs: limit -inf", clipped(limit=-INF), ValueError, "limit must be > 0"),
    ("cs: limit 1e-50 (0 in fp32)", clipped(limit=1e-50), ValueError, "limit must be > 0"),
    ("cs: limit string", clipped(limit="7"), TypeError, "limit must be a real number"),
    ("cs: limit bool", clipped(limit=True), TypeError, "limit must be a real number"),
    ("cs: alpha None", clipped(alpha=None), TypeError, "alpha must be a real number"),
    ("cs: bias string", clipped(bias="1"), TypeError, "bias must be a real number"),
    ("cs: clamp_mode 2", clipped(clamp_mode=2), ValueError, "clamp_mode must be 0"),
    ("cs: clamp_mode -1", clipped(clamp_mode=-1), ValueError, "clamp_mode must be 0"),
    ("cs: clamp_mode float", clipped(clamp_mode=1.0), TypeError, "clamp_mode must be an int"),
    ("cs: clamp_mode bool", clipped(clamp_mode=True), TypeError, "clamp_mode must be an int"),
    ("cs: interleaved int", clipped(interleaved=1), TypeError, "interleaved must be a bool"),
    (
        "cs: UT float group_index",
        clipped(group_index=ones(1)),
        TypeError,
        r"group_index \(group counts\) must be int64 or int32",
    ),
    ("cs: group_index int16", clipped(group_index=ones(1, dtype=torch.int16)), TypeError, "group_index"),
    (
        "cs: UT 2-D group_index",
        clipped(group_index=torch.ones(1, 1, dtype=torch.int64)),
        ValueError,
        "group_index",
    ),
    (
        "cs: empty group_index",
        clipped(group_index=torch.zeros(0, dtype=torch.int64)),
        ValueError,
        "group_index",
    ),
    (
        "cs: UT group_index (8193,)",
        clipped(group_index=torch.ones(8193, dtype=torch.int64)),
        ValueError,
        r"group_index \(group counts\) must have at most 8192 entries",
    ),
    (
        "cs: group_index on another device",
        clipped(group_index=torch.ones(1, dtype=torch.int64, device="meta")),
        ValueError,
        "group_index must be on the same device",
    ),
    ("cs: UT y rank mismatch (out)", clipped(out=ones(4, 16, 1)), ValueError, "out must have shape"),
    ("cs: UT y[dim] wrong (out)", clipped(out=ones(4, 32)), ValueError, "out must have shape"),
    ("cs: out dtype", clipped(out=ones(4, 16, dtype=BF16)), TypeError, "out must have dtype"),
    ("cs: out strided", clipped(out=ones(16, 4).t()), ValueError, "out must be contiguous"),
    ("cs: out on another device", clipped(out=ones(4, 16, device="meta")), ValueError, "out must be on"),
    (
        "cs: out overlaps x",
        clipped(x=_CLIPPED_X, out=_overlapping_out(_CLIPPED_X, (4, 16))),
        ValueError,
        "out must not overlap x",
    ),
    (
        "cs: out with x requiring grad",
        clipped(x=ones(4, 32).requires_grad_(), out=ones(4, 16)),
        ValueError,
        "out=",
    ),
    ("cs: unknown backend", clipped(backend="numpy"), ValueError, "backend must be one of"),
    ("cs: backend not a string", clipped(backend=None), TypeError, "backend must be a string"),
    # --- clipped_swiglu_grad: clipped_swiglu.md 2.2 / 2.3 / UT 8.5
    ("csg: grad_y missing", clipped_grad(grad_y=None), TypeError, "grad_y must be a torch.Tensor"),
    ("csg: x missing", clipped_grad(x=None), TypeError, "x must be a torch.Tensor"),
    ("csg: x int32", clipped_grad(x=ones(4, 32, dtype=torch.int32)), TypeError, "x must be bfloat16"),
    (
        "csg: grad_y dtype != x",
        clipped_grad(grad_y=ones(4, 16, dtype=F16)),
        TypeError,
        "grad_y must have the dtype",
    ),
    ("csg: grad_y last dim", clipped_grad(grad_y=ones(4, 32)), ValueError, "grad_y must have shape"),
    ("csg: grad_y rank", clipped_grad(grad_y=ones(1, 4, 16)), ValueError, "grad_y must have shape"),
    ("csg: grad_y other dim", clipped_grad(grad_y=ones(5, 16)), ValueError, "grad_y must have shape"),
    ("csg: grad_y for dim 0", clipped_grad(dim=0), ValueError, "grad_y must have shape"),
    ("csg: UT (1, 3) infershape", clipped_grad(x=ones(1, 3), grad_y=ones(1, 1)), ValueError, "must be even"),
    ("csg: dim out of range", clipped_grad(dim=2), ValueError, "dim must be in"),
    ("csg: limit 0", clipped_grad(limit=0.0), ValueError, "limit must be > 0"),
    ("csg: limit NaN (torch wrapper)", clipped_grad(limit=NAN), ValueError, "limit must be > 0"),
    ("csg: alpha string", clipped_grad(alpha="x"), TypeError, "alpha"),
    ("csg: interleaved None", clipped_grad(interleaved=None), TypeError, "interleaved"),
    ("csg: no clamp_mode (CANN's grad has none)", clipped_grad(clamp_mode=1), TypeError, "clamp_mode"),
    (
        "csg: group_index (8193,) (documented G <= 8192)",
        clipped_grad(group_index=torch.ones(8193, dtype=torch.int64)),
        ValueError,
        "at most 8192",
    ),
    (
        "csg: empty group_index (CANN: 'absent')",
        clipped_grad(group_index=torch.zeros(0, dtype=torch.int64)),
        ValueError,
        "group_index",
    ),
    (
        "csg: grad_y on another device",
        clipped_grad(grad_y=ones(4, 16, device="meta")),
        ValueError,
        "grad_y must be on the same device",
    ),
    ("csg: out shape", clipped_grad(out=ones(4, 16)), ValueError, "out must have shape"),
    ("csg: out dtype", clipped_grad(out=ones(4, 32, dtype=F16)), TypeError, "out must have dtype"),
    (
        "csg: out overlaps grad_y",
        clipped_grad(grad_y=_CLIPPED_DY_BASE[:4], out=_CLIPPED_DY_BASE.view(4, 32)),
        ValueError,
        "out must not overlap grad_y",
    ),
    ("csg: out is x", clipped_grad(x=_CLIPPED_X, out=_CLIPPED_X), ValueError, "out must not overlap x"),
    ("csg: unknown backend", clipped_grad(backend="gpu"), ValueError, "backend must be one of"),
    # --- mx_dequantize
    ("dequant: data not a tensor", dequant(data=[0] * 64), TypeError, "data must be a torch.Tensor"),
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
    # --- swiglu_mx_quant_dual_axis: swiglu_mx_quant.md 0 / tiling 1.5 / UT section 8 / contract
    ("fwd: x missing", mx_fwd(x=None), TypeError, "x must be a torch.Tensor"),
    ("fwd: x a list", mx_fwd(x=[[1.0] * 40] * 4), TypeError, "x must be a torch.Tensor"),
    ("fwd: x int8", mx_fwd(x=ones(4, 40, dtype=torch.int8)), TypeError, "x must be"),
    ("fwd: x double", mx_fwd(x=ones(4, 40, dtype=torch.float64)), TypeError, "x must be"),
    ("fwd: x rank 1", mx_fwd(x=ones(40, dtype=BF16)), ValueError, "x must have rank"),
    ("fwd: 2N odd", mx_fwd(x=ones(4, 41, dtype=BF16)), ValueError, r"x last dim \(2N\)"),
    ("fwd: N = 0", mx_fwd(x=ones(4, 0, dtype=BF16)), ValueError, r"x last dim \(2N\)"),
    ("fwd: E2M1, 2N = 42", mx_fwd(x=ones(4, 42), dst_dtype=E2M1), ValueError, "x last dim.*multiple of 4"),
    ("fwd: E1M2, 2N = 6", mx_fwd(x=ones(4, 6), dst_dtype=E1M2), ValueError, "x last dim.*multiple of 4"),
    ("fwd: dst_dtype fp16", mx_fwd(dst_dtype=F16), TypeError, "dst_dtype"),
    ("fwd: dst_dtype uint8 (E1M2's result dtype)", mx_fwd(dst_dtype=torch.uint8), TypeError, "dst_dtype"),
    ("fwd: dst_dtype e4m3fnuz", mx_fwd(dst_dtype=torch.float8_e4m3fnuz), TypeError, "dst_dtype"),
    ("fwd: dst_dtype a name", mx_fwd(dst_dtype="float8_e4m3fn"), TypeError, "dst_dtype"),
    ("fwd: dst_dtype misspelt sentinel", mx_fwd(dst_dtype="float4_e1m2"), TypeError, "dst_dtype"),
    ("fwd: dst_dtype as ge number (41)", mx_fwd(dst_dtype=41), TypeError, "dst_dtype"),
    ("fwd: dst_dtype None", mx_fwd(dst_dtype=None), TypeError, "dst_dtype"),
    ("fwd: UT case 6, dst_type 99", mx_fwd(activate_left=False, dst_dtype=99), TypeError, "dst_dtype"),
    ("fwd: UT case 5, FP8 floor", mx_fwd(activate_left=False, round_mode="floor"), ValueError, "round_mode"),
    ("fwd: e5m2 round", mx_fwd(dst_dtype=torch.float8_e5m2, round_mode="round"), ValueError, "round_mode"),
    ("fwd: round_mode ceil", mx_fwd(dst_dtype=E2M1, round_mode="ceil"), ValueError, "round_mode"),
    ("fwd: round_mode RINT", mx_fwd(dst_dtype=E2M1, round_mode="RINT"), ValueError, "round_mode"),
    ("fwd: round_mode None", mx_fwd(round_mode=None), ValueError, "round_mode"),
    ("fwd: round_mode int (CANN's 4)", mx_fwd(round_mode=4), ValueError, "round_mode"),
    ("fwd: scale_alg 1 with E2M1", mx_fwd(dst_dtype=E2M1, scale_alg=1), ValueError, "scale_alg"),
    ("fwd: scale_alg 1 with E1M2", mx_fwd(dst_dtype=E1M2, scale_alg=1), ValueError, "scale_alg"),
    ("fwd: scale_alg 2", mx_fwd(scale_alg=2), ValueError, "scale_alg"),
    ("fwd: scale_alg -1", mx_fwd(scale_alg=-1), ValueError, "scale_alg"),
    ("fwd: scale_alg float", mx_fwd(scale_alg=1.0), TypeError, "scale_alg"),
    ("fwd: scale_alg bool", mx_fwd(scale_alg=True), TypeError, "scale_alg"),
    ("fwd: scale_alg string", mx_fwd(scale_alg="1"), TypeError, "scale_alg"),
    ("fwd: max_dtype_value 448", mx_fwd(max_dtype_value=448.0), ValueError, "max_dtype_value"),
    ("fwd: max_dtype_value NaN", mx_fwd(max_dtype_value=NAN), ValueError, "max_dtype_value"),
    ("fwd: max_dtype_value string", mx_fwd(max_dtype_value="0"), TypeError, "max_dtype_value"),
    ("fwd: activate_left int", mx_fwd(activate_left=1), TypeError, "activate_left"),
    ("fwd: interleaved None", mx_fwd(interleaved=None), TypeError, "interleaved"),
    ("fwd: limit alone", mx_fwd(limit=7.0), ValueError, "limit, alpha and bias"),
    ("fwd: alpha and bias without limit", mx_fwd(alpha=1.702, bias=1.0), ValueError, "limit, alpha and bias"),
    ("fwd: limit 0", mx_fwd(limit=0.0, alpha=1.702, bias=1.0), ValueError, "limit"),
    ("fwd: limit -7", mx_fwd(limit=-7.0, alpha=1.702, bias=1.0), ValueError, "limit"),
    ("fwd: limit NaN", mx_fwd(limit=NAN, alpha=1.702, bias=1.0), ValueError, "limit"),
    ("fwd: limit 1e-50 (0 in fp32)", mx_fwd(limit=1e-50, alpha=1.702, bias=1.0), ValueError, "limit"),
    ("fwd: alpha string", mx_fwd(limit=7.0, alpha="1.702", bias=1.0), TypeError, "alpha"),
    ("fwd: bias bool", mx_fwd(limit=7.0, alpha=1.702, bias=True), TypeError, "bias"),
    ("fwd: group_index fp32", mx_fwd(group_index=ones(1)), TypeError, "group_index"),
    ("fwd: group_index int16", mx_fwd(group_index=ones(1, dtype=torch.int16)), TypeError, "group_index"),
    ("fwd: group_index 2-D", mx_fwd(group_index=torch.tensor([[4]])), ValueError, "group_index"),
    (
        "fwd: group_index empty",
        mx_fwd(group_index=torch.zeros(0, dtype=torch.int32)),
        ValueError,
        "group_index",
    ),
    (
        "fwd: group_index with 3-D x",
        mx_fwd(x=ones(1, 4, 40, dtype=BF16), group_index=torch.tensor([4])),
        ValueError,
        "group_index",
    ),
    ("fwd: group_index negative", mx_fwd(group_index=torch.tensor([-1, 4])), ValueError, "group_index.*>= 0"),
    (
        "fwd: group_index decreasing",
        mx_fwd(group_index=torch.tensor([3, 2, 4])),
        ValueError,
        "group_index.*non-decreasing",
    ),
    (
        "fwd: group_index ends < M",
        mx_fwd(group_index=torch.tensor([2, 3])),
        ValueError,
        r"group_index \(cumulative row ends\) last",
    ),
    (
        "fwd: group_index ends > M",
        mx_fwd(group_index=torch.tensor([5])),
        ValueError,
        r"group_index \(cumulative row ends\) last",
    ),
    (
        "fwd: group_index on another device",
        mx_fwd(group_index=torch.tensor([4], device="meta")),
        ValueError,
        "group_index must be on the same device",
    ),
    ("fwd: out not a 4-tuple", mx_fwd(out=mx_fwd_out()[:3]), TypeError, "out must be"),
    (
        "fwd: out y1 fp8 for an E2M1 output",
        mx_fwd(dst_dtype=E2M1, out=mx_fwd_out(0, torch.empty(4, 10, dtype=torch.float8_e4m3fn), dst=E2M1)),
        TypeError,
        r"out\[0\] \(y1\)",
    ),
    (
        "fwd: out y1 unpacked for E2M1",
        mx_fwd(dst_dtype=E2M1, out=mx_fwd_out(0, torch.empty(4, 20, dtype=E2M1), dst=E2M1)),
        ValueError,
        r"out\[0\] \(y1\)",
    ),
    (
        "fwd: out y2 float4 for E1M2 (uint8)",
        mx_fwd(dst_dtype=E1M2, out=mx_fwd_out(2, torch.empty(4, 10, dtype=E2M1), dst=E1M2)),
        TypeError,
        r"out\[2\] \(y2\)",
    ),
    (
        "fwd: out mxscale1 without the pad slot",
        mx_fwd(out=mx_fwd_out(1, torch.empty(4, 1, 1, dtype=E8M0))),
        ValueError,
        r"out\[1\] \(mxscale1\)",
    ),
    (
        "fwd: out mxscale1 uint8",
        mx_fwd(out=mx_fwd_out(1, torch.empty(4, 1, 2, dtype=torch.uint8))),
        TypeError,
        r"out\[1\] \(mxscale1\)",
    ),
    (
        "fwd: out mxscale2 rows without the groups' G",
        mx_fwd(group_index=torch.tensor([2, 4]), out=mx_fwd_out()),
        ValueError,
        r"out\[3\] \(mxscale2\)",
    ),
    (
        "fwd: out y2 strided",
        mx_fwd(out=mx_fwd_out(2, torch.empty(20, 4, dtype=torch.float8_e4m3fn).t())),
        ValueError,
        r"out\[2\] \(y2\).*contiguous",
    ),
    (
        "fwd: out on another device",
        mx_fwd(out=mx_fwd_out(0, torch.empty(4, 20, dtype=torch.float8_e4m3fn, device="meta"))),
        ValueError,
        r"out\[0\] \(y1\) must be on",
    ),
    ("fwd: unknown backend", mx_fwd(backend="npu"), ValueError, "backend must be one of"),
    ("fwd: backend not a string", mx_fwd(backend=None), TypeError, "backend must be a string"),
    (
        "dequant: uint8 data without dst_dtype",
        dequant(data=torch.zeros(4, 32, dtype=torch.uint8)),
        TypeError,
        "dst_dtype",
    ),
    # routing weights of the MX operators; the ends mx_dequantize reads
    (
        "mx: weight fp64",
        mx_quant(weight=torch.ones(4, dtype=torch.float64)),
        TypeError,
        "weight must be float32",
    ),
    ("mx: weight numel", mx_quant(weight=torch.ones(3)), ValueError, "weight must have numel == rows = 4"),
    ("fwd: weight not a tensor", mx_fwd(weight=[1.0] * 4), TypeError, "weight must be a torch.Tensor"),
    ("fwd: weight on meta", mx_fwd(weight=torch.ones(4, device="meta")), ValueError, "weight must be on"),
    (
        "dequant: axis -2 counts for ends",
        dequant(
            data=torch.zeros(64, 32, dtype=torch.float8_e4m3fn),
            scale=torch.zeros(3, 32, 2, dtype=torch.uint8),
            axis=-2,
            group_index=torch.tensor([30, 34]),
        ),
        ValueError,
        "look like group counts",
    ),
    (
        "dequant: decreasing ends",
        dequant(
            data=torch.zeros(64, 32, dtype=torch.float8_e4m3fn),
            scale=torch.zeros(3, 32, 2, dtype=torch.uint8),
            axis=-2,
            group_index=torch.tensor([40, 30]),
        ),
        ValueError,
        "non-decreasing",
    ),
    ("dequant: float ends", dequant(axis=-2, group_index=torch.tensor([4.0])), TypeError, "int64 or int32"),
    ("dequant: dst_dtype fp16", dequant(dst_dtype=F16), TypeError, "dst_dtype"),
    ("dequant: dtype a string", dequant(dtype="float32"), TypeError, "dtype must be one of"),
    ("dequant: dtype int32", dequant(dtype=torch.int32), TypeError, "dtype must be one of"),
    ("dequant: dtype fp8", dequant(dtype=torch.float8_e4m3fn), TypeError, "dtype must be one of"),
    (
        "dequant: dtype int32, meta tensors (the custom op)",
        dequant(
            data=torch.zeros(4, 64, dtype=torch.float8_e4m3fn, device="meta"),
            scale=torch.zeros(4, 1, 2, dtype=torch.uint8, device="meta"),
            dtype=torch.int32,
        ),
        TypeError,
        "dtype must be one of",
    ),
    ("dequant: fp8 data named E1M2", dequant(dst_dtype=E1M2), TypeError, "data must be"),
    (
        "dequant: E2M1 data, scale for N/2 columns",
        dequant(data=torch.zeros(4, 40, dtype=E2M1), scale=torch.zeros(4, 1, 2, dtype=torch.uint8)),
        ValueError,
        "scale must have shape",
    ),
    (
        "dequant: E1M2 data, mxscale2 for N/2 columns",
        dequant(
            data=torch.zeros(4, 40, dtype=torch.uint8),
            scale=torch.zeros(1, 40, 2, dtype=torch.uint8),
            axis=-2,
            dst_dtype=E1M2,
        ),
        ValueError,
        "scale must have shape",
    ),
    # --- this round's other entry points (each also tested where it lives)
    (
        "available_backends: not a device",
        lambda: swiglu_ops.available_backends("bogus"),
        ValueError,
        "device",
    ),
    (
        "single_process_order: 1-D counts",
        lambda: swiglu_ops.single_process_order(torch.tensor([1, 2])),
        ValueError,
        "counts must be",
    ),
    (
        "expert MLP: backend misspelt in the bf16 mode",
        lambda: swiglu_ops.mxfp8_expert_mlp(
            ones(4, 32, dtype=BF16),
            ones(2, 32, 64, dtype=BF16),
            ones(2, 32, 32, dtype=BF16),
            torch.tensor([2, 4]),
            quantize=False,
            backend="nonsense",
        ),  # fmt: skip
        ValueError,
        "backend must be one of",
    ),
    (
        "scalar type: interleaved None",
        lambda: swiglu_ops.clipped_swiglu(ones(4, 8), interleaved=None),
        TypeError,
        "interleaved must be a bool",
    ),  # fmt: skip
    # --- settings read from the environment at import
    (
        "env: cpu cache size not a number",
        lambda: _cpu_cache_bytes("1GB"),
        ValueError,
        "SWIGLU_OPS_CPU_CACHE_MB",
    ),
    ("env: cpu cache size negative", lambda: _cpu_cache_bytes("-1"), ValueError, "SWIGLU_OPS_CPU_CACHE_MB"),
    ("env: cpu simd not an instruction set", lambda: _cpu_simd("on"), ValueError, "SWIGLU_OPS_CPU_SIMD"),
    ("env: cpu pool not auto/own", lambda: _cpu_pool("pool"), ValueError, "SWIGLU_OPS_CPU_POOL"),
    (
        "env: triton hw conversions not 0/1",
        lambda: _triton_hw_cvt("yes"),
        ValueError,
        "SWIGLU_OPS_TRITON_HW_CVT",
    ),
    # --- 2026-12-06's rejections (their own tests run them on every path and kind; here one row each)
    ("mx: int past int64", mx_fwd(scale_alg=2**70), ValueError, "scale_alg must fit in int64"),
    ("cs: float past the float range", clipped(alpha=10**400), ValueError, "alpha must fit in a float"),
    (
        "gg: group_index not a tensor",
        group_grad(group_index=3),
        TypeError,
        "group_index must be a torch.Tensor",
    ),
    ("dequant: axis a float", dequant(axis=-1.0), TypeError, "axis must be an int"),
    ("dequant: group_index an int", dequant(group_index=2), TypeError, "group_index must be a torch.Tensor"),
    (
        "cs: out a ZeroTensor",
        clipped(out=torch._efficientzerotensor((4, 16))),
        ValueError,
        "out must have storage, got a ZeroTensor",
    ),
    (
        "cs: x inside vmap",
        lambda: torch.func.vmap(lambda t: swiglu_ops.clipped_swiglu(t, backend="reference"))(ones(2, 4, 32)),
        TypeError,
        "torch.func transform",
    ),
    # the autograd wrappers under torch.func.grad (torch refused their old-style autograd.Functions with a
    # RuntimeError naming nothing before the operators' own check could run)
    *(
        (
            f"{name} inside torch.func.grad",
            lambda f=f: torch.func.grad(f)(ones(6, 64)),
            TypeError,
            "torch.func",
        )
        for name, f in (
            ("clipped_swiglu", lambda z: swiglu_ops.clipped_swiglu(z, backend="reference").sum()),
            ("ClippedSwiGLU", lambda z: swiglu_ops.ClippedSwiGLU(backend="reference")(z).sum()),
            ("clamped_swiglu", lambda z: swiglu_ops.clamped_swiglu(z, backend="reference").sum()),
            ("swiglu_mx_backward", lambda z: swiglu_ops.swiglu_mx_backward(z, backend="reference").sum()),
            (
                "mxfp8_expert_mlp probs",
                lambda z: swiglu_ops.mxfp8_expert_mlp(
                    ones(6, 32),
                    ones(2, 32, 64),
                    ones(2, 32, 32),
                    torch.tensor([3, 6]),
                    probs=z[:, 0].contiguous(),
                ).sum(),
            ),
        )
    ),
    (
        "patch_gpt_oss: a non-module",
        lambda: swiglu_ops.integrations.patch_gpt_oss("model"),
        TypeError,
        "model must be a torch.nn.Module, got str",
    ),
    (
        "unpatch_gpt_oss: a non-module",
        lambda: swiglu_ops.integrations.unpatch_gpt_oss(["model"]),
        TypeError,
        "model must be a torch.nn.Module, got list",
    ),
    (
        "mx backward wrapper: capture a dict",
        lambda: swiglu_ops.swiglu_mx_backward(ones(4, 64), capture={}),
        TypeError,
        "capture must be an MXGradient or None",
    ),
    (
        "clamped wrapper: x with H = 0",
        lambda: swiglu_ops.clamped_swiglu(ones(4, 0)),
        ValueError,
        "x last dim",
    ),
]


def _cpu_simd(value):
    from swiglu_ops.backends.cpu._loader import isa_choice_from_env

    return isa_choice_from_env(value)


def _cpu_pool(value):
    from swiglu_ops.backends.cpu._loader import pool_choice_from_env

    return pool_choice_from_env(value)


def _cpu_cache_bytes(value):
    from swiglu_ops.backends.cpu import cache_bytes_from_env

    return cache_bytes_from_env(value)


def _triton_hw_cvt(value):
    triton_backend = pytest.importorskip("swiglu_ops.backends.triton")
    return triton_backend.hw_conversions_from_env(value)


def test_environment_settings_accepted():
    assert _cpu_cache_bytes(None) == _cpu_cache_bytes("") == 1024 << 20
    assert _cpu_cache_bytes("0") == 0 and _cpu_cache_bytes(" 64 ") == 64 << 20
    assert _cpu_simd(None) == _cpu_simd("auto") == ("avx512_bf16", "avx512", "avx2", "portable")
    assert _cpu_simd(" Portable ") == ("portable",) and _cpu_simd("avx512") == ("avx512",)
    assert [_cpu_pool(v) for v in (None, "", "auto", " Own ")] == ["auto", "auto", "auto", "own"]
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
    missing = [b for b in registry.backend_names() if b not in available]
    if missing:
        name = missing[0]
    else:
        name = "reference"
        monkeypatch.setattr(
            registry.backend_module("reference"), "is_available", lambda device: (False, "disabled by test")
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


# ------------------------------------------------- scalar arguments on every path (eager, meta, compile)

#: A value of the wrong type per schema type (the custom op's schema would coerce it, or fail in torch), and
#: numbers the schema cannot carry (past int64, past the float range).
_WRONG = {
    "bool": [None, 0.5],
    "int": [1.5, "1", 2**70],
    "float": ["1.0", True, 10**400],
    "str": [3],
    "ScalarType": ["e4m3"],
    "Tensor": [0.5, [1.0, 2.0]],
}


def _scalar_cases():
    from swiglu_ops.ops.table import PUBLIC

    for op in PUBLIC:
        for p in op.params:
            if p.to_schema is not None:
                continue
            for value in _WRONG[p.schema.removesuffix("?")]:
                yield pytest.param(op, p.name, value, id=f"{op.name}: {p.name}={value!r}")


@pytest.mark.parametrize(("op", "name", "value"), list(_scalar_cases()))
def test_wrong_scalar_types_are_the_same_error_on_every_path(op, name, value):
    """A wrong-typed argument is the eager path's TypeError / ValueError, with its message, on meta tensors
    and inside torch.compile too (it used to be coerced by the custom op's schema: ``interleaved=None`` ran
    as False, ``alpha="1.0"``, ``alpha=10**400`` and ``weight=0.5`` were torch's RuntimeError)."""
    from swiglu_ops.ops import api

    args = op.example(torch.Generator().manual_seed(0), BF16, "cpu")
    fn = getattr(api, op.name)
    with pytest.raises((TypeError, ValueError)) as eager:
        fn(**args, **{name: value}, backend="reference")
    assert name in str(eager.value)
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with pytest.raises(type(eager.value)) as on_meta:
        fn(**meta, **{name: value})
    assert str(on_meta.value) == str(eager.value)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_wrong_scalars_and_backends_inside_torch_compile(fullgraph):
    """Inside torch.compile the same checks run while tracing: the eager error (fullgraph: Dynamo's error
    that carries it), never a coerced value."""
    x = torch.randn(8, 64)
    cases = [
        (lambda x: swiglu_ops.clipped_swiglu(x, interleaved=None), TypeError, "interleaved must be a bool"),
        (lambda x: swiglu_ops.clipped_swiglu(x, alpha="1.0"), TypeError, "alpha must be a real number"),
        (
            lambda x: swiglu_ops.swiglu_mx_quant_dual_axis(x, scale_alg=1.0),
            TypeError,
            "scale_alg must be an int",
        ),
        (lambda x: swiglu_ops.clipped_swiglu(x, backend="bogus"), ValueError, "backend must be one of"),
    ]
    for fn, error, match in cases:
        torch._dynamo.reset()
        with pytest.raises(Exception, match=match) as info:
            torch.compile(fn, fullgraph=fullgraph)(x)
        if not fullgraph:
            assert type(info.value) is error


@pytest.mark.parametrize("fullgraph", [False, True])
def test_wrong_tensors_inside_torch_compile_are_the_eager_error(fullgraph):
    """Tensor arguments too: the operator's checks run on the traced tensors before the custom op, so the
    error is the eager one (with fullgraph: Dynamo's error carrying it); the fake kernel's TypeError /
    ValueError used to surface as Dynamo's TorchRuntimeError, a RuntimeError, with an ERROR log of the fake
    call."""
    x = torch.randn(8, 64)
    cases = [
        (
            lambda x: swiglu_ops.clipped_swiglu(x.double()),
            TypeError,
            "x must be bfloat16, float16 or float32",
        ),
        (lambda x: swiglu_ops.swiglu_mx_quant_dual_axis(x, weight=x[:, 0].bfloat16()), TypeError, "weight"),
        (lambda x: swiglu_ops.swiglu_backward_mx_quant_dual_axis(x[:, :48], x[:, :24]), ValueError, "64"),
        (lambda x: swiglu_ops.swiglu_group_grad(x[:, :32], x, weight=x[:, 0]), ValueError, "y_origin"),
    ]
    for fn, error, match in cases:
        torch._dynamo.reset()
        with pytest.raises(error if not fullgraph else Exception, match=match) as info:
            torch.compile(fn, fullgraph=fullgraph)(x)
        assert not isinstance(info.value, torch._dynamo.exc.TorchRuntimeError)  # (fullgraph: Unsupported)


def test_meta_and_fake_calls_check_the_backend():
    x = torch.empty(8, 64, device="meta")
    with pytest.raises(ValueError, match="backend must be one of"):
        swiglu_ops.clipped_swiglu(x, backend="bogus")
    with pytest.raises(TypeError, match="backend must be a string"):
        swiglu_ops.clipped_swiglu(x, backend=3)
    with pytest.raises(ValueError, match="backend must be one of"):  # the custom op itself, on meta tensors
        torch.ops.swiglu_ops.clipped_swiglu(x, backend="bogus")


def test_autograd_wrappers_check_the_backend_at_the_forward():
    """clamped_swiglu and swiglu_mx_backward run their operator in the backward; a bad backend is an error
    at the forward call (it used to surface only in backward())."""
    x = torch.randn(8, 64, requires_grad=True)
    with pytest.raises(ValueError, match="backend must be one of"):
        swiglu_ops.clamped_swiglu(x, backend="bogus")
    with pytest.raises(TypeError, match="backend must be a string"):
        swiglu_ops.swiglu_mx_backward(x, backend=42)


def test_autograd_wrappers_refuse_an_unavailable_backend_at_the_forward(monkeypatch):
    """A named backend that cannot run on x's device is the forward's ValueError, not the backward's (the
    wrappers whose forward runs no operator used to accept it)."""
    monkeypatch.setattr(
        registry.backend_module("reference"), "is_available", lambda device: (False, "disabled by test")
    )
    x = torch.randn(8, 64, requires_grad=True)
    calls = {
        "clamped_swiglu": lambda: swiglu_ops.clamped_swiglu(x, backend="reference"),
        "ClampedSwiGLU": lambda: swiglu_ops.ClampedSwiGLU(backend="reference")(x),
        "swiglu_mx_backward": lambda: swiglu_ops.swiglu_mx_backward(x, backend="reference"),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="backend 'reference' is not available"):
            call()
        assert x.grad is None, name


def test_capture_must_be_the_documented_type():
    """swiglu_mx_backward takes an MXGradient, the expert MLP a dict: the other one (or anything else) is a
    TypeError at the call, not an AttributeError in backward()."""
    x = torch.randn(8, 64, requires_grad=True)
    for bad in ({}, [], "y1"):
        with pytest.raises(TypeError, match="capture must be an MXGradient or None"):
            swiglu_ops.swiglu_mx_backward(x, capture=bad)
    mlp = swiglu_ops.MXFP8ExpertMLP(2, 32, 64)
    xb = torch.randn(6, 32, dtype=torch.bfloat16)
    for bad in (swiglu_ops.MXGradient(), []):
        with pytest.raises(TypeError, match="capture must be a dict or None"):
            mlp(xb, torch.tensor([2, 6]), capture=bad)


def test_wrapper_errors_name_the_callers_arguments():
    with pytest.raises(ValueError, match="x last dim must be even and > 0"):
        swiglu_ops.clamped_swiglu(torch.randn(4, 0))
    mlp = swiglu_ops.MXFP8ExpertMLP(2, 32, 64)
    with pytest.raises(ValueError, match="group_ends .* last value must equal"):
        mlp(torch.randn(5, 32, dtype=torch.bfloat16), torch.tensor([2, 4]))


_SETTINGS_PROBE = """
import json, warnings, torch, swiglu_ops
from swiglu_ops.ops import registry
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    swiglu_ops.clipped_swiglu(torch.randn(4, 8))
why = registry.backend_status({name!r}, {device!r})[1]
cpu = swiglu_ops.available_backends("cpu")
print(json.dumps(dict(cpu=cpu, why=why, warned=[str(w.message) for w in caught])))
"""


@pytest.mark.parametrize(
    ("variable", "backend", "device"),
    [("SWIGLU_OPS_CPU_CACHE_MB", "cpu", "cpu"), ("SWIGLU_OPS_TRITON_HW_CVT", "triton", "cuda")],
)
def test_a_bad_setting_makes_its_backend_unavailable_not_the_process_fail(variable, backend, device):
    """A bad value of a backend's environment setting makes that backend unavailable with the reason, as
    SWIGLU_OPS_CPU_SIMD / _POOL do: available_backends() and the other backends keep working, "auto"
    warns once and runs another (they used to raise from the import or from every call)."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[variable] = "banana"
    code = _SETTINGS_PROBE.format(name=backend, device=device)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["why"] == f"ValueError: {variable} must be " + (
        "a non-negative integer (MiB), got 'banana'" if backend == "cpu" else "0 or 1, got 'banana'"
    )
    if backend == "cpu":
        assert report["cpu"] == ["reference"] and any(variable in w for w in report["warned"])
    else:
        assert "cpu" in report["cpu"] and not report["warned"]


def test_available_backends_of_a_device_torch_cannot_reach():
    """A CUDA device on a machine without one lists only the reference (the Triton backend needs a device
    torch can use); a name that is no device is a ValueError naming the argument."""
    if not torch.cuda.is_available():
        assert swiglu_ops.available_backends("cuda") == ["reference"]
    with pytest.raises(ValueError, match="device must be a torch.device"):
        swiglu_ops.available_backends("bogus")


@pytest.mark.parametrize(
    ("over", "error", "match"),
    [
        ({"axis": -1.0}, TypeError, "axis must be an int"),
        ({"axis": True}, TypeError, "axis must be an int"),
        ({"axis": 0}, ValueError, "axis must be -1"),
        ({"data": [1]}, TypeError, "data must be a torch.Tensor"),
        ({"scale": 3}, TypeError, "scale must be a torch.Tensor"),
        ({"group_index": 2}, TypeError, "group_index must be a torch.Tensor or None"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_mx_dequantize_argument_types_on_every_path(over, error, match):
    """mx_dequantize's argument types are refused before its custom op: the same error on plain and meta
    tensors (a float axis used to pass in eager and be torch's RuntimeError on meta)."""
    y1, s1, _, _ = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        ones(4, 64, dtype=BF16), ones(4, 32, dtype=BF16)
    )
    for device in ("cpu", "meta"):
        args = {"data": y1.to(device), "scale": s1.to(device), "axis": -1, "group_index": None, **over}
        with pytest.raises(error, match=match):
            swiglu_ops.mx_dequantize(**args)


def test_group_convention_warning_points_at_the_callers_line():
    """The warning names the user's line whatever the library's path to it (a public function, a module
    through nn.Module.__call__ and autograd.Function.apply), so that the default filter shows each call
    site."""
    import warnings

    x = torch.randn(6, 8)
    ends = torch.tensor([2, 4, 6, 6])  # cumulative ends given where counts are expected
    calls = [
        lambda: swiglu_ops.clipped_swiglu(x, ends, backend="reference"),
        lambda: swiglu_ops.ClampedSwiGLU(backend="reference")(x, None, ends),
        lambda: swiglu_ops.clamped_swiglu(x, None, ends, backend="reference"),
    ]
    for call in calls:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        found = [w for w in caught if issubclass(w.category, swiglu_ops.GroupConventionWarning)]
        assert len(found) == 1 and found[0].filename == __file__, [(w.filename, w.lineno) for w in found]
