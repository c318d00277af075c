"""``transpose_y2``: the dual-axis operators write y2 token-contiguous (``[..., C, M]``, the K-major
operand of a wgrad GEMM) with the same codes as CANN's ``[..., M, C]`` layout; FP8 only. Every backend runs
these tests."""

from __future__ import annotations

import pytest
import torch

import swiglu_ops

GEN = torch.Generator().manual_seed(11)
X = (torch.randn(100, 128, generator=GEN) * 2).bfloat16()
DY = torch.randn(100, 64, generator=GEN).bfloat16()
ENDS = torch.tensor([30, 30, 100])


def _bits(t):
    return t.view(torch.uint8)


def _check(default, transposed):
    y1, s1, y2, s2 = default
    t1, ts1, t2, ts2 = transposed
    for a, b in ((y1, t1), (s1, ts1), (s2, ts2)):
        assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))
    assert t2.dtype == y2.dtype and t2.shape == (*y2.shape[:-2], y2.shape[-1], y2.shape[-2])
    assert t2.is_contiguous() and torch.equal(_bits(t2), _bits(y2).transpose(-2, -1))


@pytest.mark.parametrize("dst", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("groups", [None, ENDS])
def test_backward_operator(backend, groups, dst):
    call = lambda t: swiglu_ops.swiglu_backward_mx_quant_dual_axis(  # noqa: E731
        X, DY, groups, dst_dtype=dst, transpose_y2=t, backend=backend
    )
    _check(call(False), call(True))


def test_backward_operator_batched_and_gpt_oss(backend):
    x, dy = X.view(2, 50, 128), DY.view(2, 50, 64)
    kw = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True, backend=backend)
    call = lambda t: swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, transpose_y2=t, **kw)  # noqa: E731
    _check(call(False), call(True))


@pytest.mark.parametrize("n", [40, 64])
@pytest.mark.parametrize("groups", [None, ENDS])
def test_forward_operator(backend, groups, n):
    x = X[:, : 2 * n].contiguous()
    call = lambda t: swiglu_ops.swiglu_mx_quant_dual_axis(x, groups, transpose_y2=t, backend=backend)  # noqa: E731
    _check(call(False), call(True))


def test_out_and_compile(backend):
    want = swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, ENDS, transpose_y2=True, backend=backend)
    out = [torch.empty_like(t) for t in want]
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        X, DY, ENDS, transpose_y2=True, backend=backend, out=out
    )
    assert all(g is o for g, o in zip(got, out, strict=True))
    _check(want[:2] + (want[2].t(),) + want[3:], got)
    fn = torch.compile(
        lambda x: swiglu_ops.swiglu_mx_quant_dual_axis(x, ENDS, transpose_y2=True, backend=backend),
        backend="aot_eager",
        fullgraph=True,
        dynamic=True,
    )
    eager = swiglu_ops.swiglu_mx_quant_dual_axis(X, ENDS, transpose_y2=True, backend=backend)
    for a, b in zip(fn(X), eager, strict=True):
        assert a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def test_dequantize_the_transposed_y2():
    _, _, y2t, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        X, DY, ENDS, transpose_y2=True, backend="reference"
    )
    _, _, y2, _ = swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, ENDS, backend="reference")
    assert torch.equal(
        swiglu_ops.mx_dequantize(y2t.t(), s2, axis=-2, group_index=ENDS),
        swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=ENDS),
    )


def test_validation():
    with pytest.raises(ValueError, match="transpose_y2=True is FP8 only.*two tokens"):
        swiglu_ops.swiglu_mx_quant_dual_axis(X, dst_dtype=torch.float4_e2m1fn_x2, transpose_y2=True)
    with pytest.raises(ValueError, match="transpose_y2=True is FP8 only"):
        swiglu_ops.swiglu_mx_quant_dual_axis(X, dst_dtype=swiglu_ops.float4_e1m2fn_x2, transpose_y2=True)
    with pytest.raises(TypeError, match="transpose_y2 must be a bool"):
        swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, transpose_y2=1)
    with pytest.raises(Exception, match="transpose_y2=True is FP8 only"):  # the fake kernel too
        torch.compile(
            lambda x: swiglu_ops.swiglu_mx_quant_dual_axis(
                x, dst_dtype=torch.float4_e2m1fn_x2, transpose_y2=True
            ),
            backend="aot_eager",
            fullgraph=True,
        )(X)
    y = swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, ENDS, transpose_y2=True, backend="reference")
    wrong = [torch.empty_like(t) for t in y]
    wrong[2] = torch.empty(100, 128, dtype=torch.float8_e4m3fn)  # the default layout's shape
    with pytest.raises(ValueError, match=r"out\[2\] \(y2\) must have shape \(128, 100\)"):
        swiglu_ops.swiglu_backward_mx_quant_dual_axis(
            X, DY, ENDS, transpose_y2=True, out=wrong, backend="reference"
        )
