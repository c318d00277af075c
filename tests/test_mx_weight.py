"""Routing weights through the public dual-axis MX operators and the MXFP8 expert MLP (spec 7.1).

The kernels themselves, every backend x weights x GLU x format x dtype, are ``test_mx_weight_kernels.py``;
here what the operator table adds on top: the public signature (``weight=``, a fifth output
``grad_weight`` only with it), the errors, ``out=``, torch.compile, fake tensors, and the MLP's ``probs``
gradient against float64.
"""

from __future__ import annotations

import pytest
import torch

import swiglu_ops
from swiglu_ops.numerics.glu import forward_rounded
from swiglu_ops.ops.validate import mx_glu_params
from swiglu_ops.training.expert_mlp import expert_mlp_reference

BF16 = torch.bfloat16
GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)
BWD, FWD = swiglu_ops.swiglu_backward_mx_quant_dual_axis, swiglu_ops.swiglu_mx_quant_dual_axis


def _inputs(m=70, c=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, c, generator=gen) * 3).to(BF16)
    dy = torch.randn(m, c // 2, generator=gen).to(BF16)
    w = torch.randn(m, generator=gen)
    w[::5] = 0.0
    return x, dy, w, torch.tensor([20, 20, m])


def _bits(outs):
    return [t.view(torch.uint8) if t.element_size() == 1 else t for t in outs]


def _equal(a, b):
    assert len(a) == len(b)
    for g, w in zip(_bits(a), _bits(b), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


@pytest.mark.parametrize("glu", [{}, GPT_OSS], ids=["plain", "gpt_oss"])
def test_backward_grad_weight_is_group_grads_on_act16(glu, backend):
    """grad_weight = swiglu_group_grad's grad_weight for y_origin = act16 (the unweighted forward, rounded),
    every row (groups do not mask it); None gives today's four outputs, ones the same codes."""
    x, dy, w, ends = _inputs()
    outs = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, weight=w, **glu, backend=backend)
    assert len(outs) == 5 and outs[4].dtype == torch.float32 and outs[4].shape == w.shape
    # act16: the forward operator's unweighted stage 1 with the same GLU parameters, rounded to bf16
    fwd_glu = mx_glu_params(True, glu.get("interleaved", False), glu.get("limit"), glu.get("alpha"),
                            glu.get("bias"))  # fmt: skip
    y16 = forward_rounded(x, fwd_glu)
    _, gw = swiglu_ops.swiglu_group_grad(dy, x, torch.ones(70), y16, backend="reference")
    if backend == "reference":
        assert torch.equal(outs[4], gw)
    else:
        scale = (dy.float() * y16.float()).norm(dim=-1)
        assert ((outs[4] - gw).abs() <= 1e-5 * torch.maximum(gw.abs(), scale) + 1e-30).all()
    plain = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, **glu, backend=backend)
    assert len(plain) == 4
    _equal(
        swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, weight=None, **glu, backend=backend), plain
    )
    ones = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, dy, ends, weight=torch.ones(70), **glu, backend=backend
    )
    _equal(ones[:4], plain)


@pytest.mark.parametrize("dst", [torch.float8_e4m3fn, torch.float4_e2m1fn_x2], ids=["e4m3", "e2m1"])
def test_forward_powers_of_two_shift_the_scales_only(dst, backend):
    x, _, _, ends = _inputs()
    plain = swiglu_ops.swiglu_mx_quant_dual_axis(x, None, dst_dtype=dst, backend=backend)
    w = torch.full((70,), 4.0)
    got = swiglu_ops.swiglu_mx_quant_dual_axis(x, None, dst_dtype=dst, weight=w, backend=backend)
    assert torch.equal(got[0].view(torch.uint8), plain[0].view(torch.uint8))  # codes unchanged
    s_plain, s_got = plain[1].view(torch.uint8).int(), got[1].view(torch.uint8).int()
    nonzero = s_plain != 0
    assert torch.equal(s_got[nonzero], s_plain[nonzero] + 2)  # x4: two more in the exponent
    ones = swiglu_ops.swiglu_mx_quant_dual_axis(
        x, ends, dst_dtype=dst, weight=torch.ones(70), backend=backend
    )
    _equal(ones, swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, dst_dtype=dst, backend=backend))


@pytest.mark.parametrize(
    ("weight", "error", "match"),
    [
        (torch.ones(70, dtype=torch.float64), TypeError, "weight must be float32"),
        (torch.ones(70, dtype=BF16), TypeError, "weight must be float32"),
        ([1.0] * 70, TypeError, "weight must be a torch.Tensor"),
        (torch.ones(69), ValueError, "weight must have numel == rows = 70"),
        (torch.ones(7, 10), None, None),  # any shape with numel == rows
        (torch.ones(70, device="meta"), ValueError, "weight must be on the same device"),
    ],
    ids=["fp64", "bf16", "list", "numel", "shape 7x10", "device"],
)
def test_weight_errors_name_the_argument(weight, error, match):
    x, dy, _, ends = _inputs()
    for call in (
        lambda: swiglu_ops.swiglu_backward_mx_quant_dual_axis(
            x, dy, ends, weight=weight, backend="reference"
        ),
        lambda: swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, weight=weight, backend="reference"),
    ):
        if error is None:
            call()
        else:
            with pytest.raises(error, match=match):
                call()


def test_weight_that_requires_grad_and_out(backend):
    x, dy, w, ends = _inputs()
    want = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, weight=w, backend=backend)
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, dy, ends, weight=w.clone().requires_grad_(), backend=backend
    )
    _equal(got, want)
    out = tuple(torch.empty_like(t) for t in want)
    _equal(BWD(x, dy, ends, weight=w, backend=backend, out=out), out)
    _equal(out, want)
    with pytest.raises(TypeError, match="out must be a"):  # five outputs with weight, four without
        swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, weight=w, backend=backend, out=out[:4])


def test_compiled_fullgraph_equals_eager_with_weight(backend):
    x, dy, w, ends = _inputs()

    def fn(x, dy, w):
        fwd = swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, weight=w, backend=backend, **GPT_OSS)
        bwd = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, weight=w, backend=backend, **GPT_OSS)
        return (*fwd, *bwd)

    torch._dynamo.reset()
    _equal(torch.compile(fn, backend="aot_eager", fullgraph=True)(x, dy, w), fn(x, dy, w))


@pytest.mark.parametrize("quantize", [False, True], ids=["bf16", "mxfp8"])
@pytest.mark.parametrize("glu", [{}, GPT_OSS], ids=["plain", "gpt_oss"])
def test_mlp_probs_gradient_against_float64(quantize, glu):
    """MXFP8ExpertMLP.forward(x, ends, probs): probs.grad within 2 % of a float64 plain-torch MLP."""
    gen = torch.Generator().manual_seed(3)
    counts = [40, 0, 70, 1, 33]
    t, d, hidden = sum(counts), 32, 64
    torch.manual_seed(0)
    mlp = swiglu_ops.MXFP8ExpertMLP(len(counts), d, hidden, quantize=quantize, backend="cpu", **glu)
    x = torch.randn(t, d, generator=gen).to(BF16)
    probs = torch.rand(t, generator=gen).requires_grad_()
    ends = torch.tensor(counts).cumsum(0)
    dout = torch.randn(t, d, generator=gen)
    mlp(x, ends, probs).float().backward(dout)
    p64 = probs.detach().double().requires_grad_()
    w1, w2 = (p.detach().to(BF16).double() for p in (mlp.w1, mlp.w2))
    expert_mlp_reference(x.double(), w1, w2, ends, probs=p64, **glu).backward(dout.double())
    rel = (probs.grad.double() - p64.grad).norm() / p64.grad.norm()
    assert rel < 0.02, float(rel)
