"""mxfp8_expert_mlp's per-expert linear biases ``b1`` / ``b2`` (GPT-OSS's ``gate_up_proj_bias`` /
``down_proj_bias``): the definition of each gradient, and the whole MLP against float64.

- Zero biases change nothing: output, dx, dW1 and dW2 bit for bit those of the call without biases.
- The bias gradients are what the docstring says, exactly: per-expert fp32 sums (rounded once to bf16) of
  the bf16 ``dout`` (b2) and, with ``quantize=True``, of ``dh``'s dequantised token-axis operand ``y2`` from
  the fused backward (b1; taken from ``capture``).
- Against the exact float64 MLP with biases: the bf16 baseline within bf16 rounding (2 % of each tensor's
  norm, measured <= 0.5 %), MXFP8 within 8 % (measured <= 4 %, the README's MXFP8 error).
"""

from __future__ import annotations

import pytest
import torch

import swiglu_ops
from swiglu_ops.training import expert_mlp

BF16 = torch.bfloat16
GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)
VARIANTS = {"swiglu": {}, "gpt_oss": GPT_OSS}
COUNTS = [5, 0, 40, 1, 18]  # an empty expert, a one-token one, one longer than a 32-row block
E, D, H = len(COUNTS), 32, 32


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(COUNTS), D, generator=g).to(BF16)
    w1 = (torch.randn(E, D, 2 * H, generator=g) / D**0.5).to(BF16)
    w2 = (torch.randn(E, H, D, generator=g) / H**0.5).to(BF16)
    b1 = torch.randn(E, 2 * H, generator=g).to(BF16)
    b2 = torch.randn(E, D, generator=g).to(BF16)
    ends = swiglu_ops.counts_to_ends(torch.tensor(COUNTS))
    return x, w1, w2, b1, b2, ends


def run(x, w1, w2, ends, dout, b1=None, b2=None, capture=None, **kw):
    leaves = [t.detach().requires_grad_() for t in (x, w1, w2, b1, b2) if t is not None]
    it = iter(leaves)
    args = [next(it) for _ in range(3)]
    bias = {n: next(it) for n, t in (("b1", b1), ("b2", b2)) if t is not None}
    out = swiglu_ops.mxfp8_expert_mlp(*args, ends, capture=capture, **bias, **kw)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def group_sums(v, ends):
    experts = torch.repeat_interleave(torch.arange(E), torch.tensor(COUNTS))
    return torch.zeros(E, v.shape[1]).index_add_(0, experts, v.float()).to(BF16)


@pytest.mark.parametrize("quantize", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_zero_biases_change_nothing_and_bias_gradients_are_group_sums(variant, quantize):
    x, w1, w2, b1, b2, ends = inputs()
    dout = torch.randn(x.shape[0], D, generator=torch.Generator().manual_seed(9)).to(BF16)
    kw = dict(VARIANTS[variant], quantize=quantize, backend="reference")
    plain = run(x, w1, w2, ends, dout, **kw)
    capture = {}
    zero = run(x, w1, w2, ends, dout, torch.zeros_like(b1), torch.zeros_like(b2), capture=capture, **kw)
    for a, b in zip(plain, zero[:4], strict=True):
        assert torch.equal(a, b)
    db1, db2 = zero[4:]
    assert db1.dtype == db2.dtype == BF16
    assert torch.equal(db2, group_sums(dout, ends))
    if quantize:  # (the bf16 baseline's dh is internal: its db1 is checked against float64 below)
        dh = capture["dh"]
        assert torch.equal(
            db1, group_sums(swiglu_ops.mx_dequantize(dh[2], dh[3], axis=-2, group_index=ends), ends)
        )
    assert not db1[COUNTS.index(0)].any() and not db2[COUNTS.index(0)].any()  # the empty expert


def reference(x, w1, w2, b1, b2, ends, **glu):
    return expert_mlp.expert_mlp_reference(x, w1, w2, ends, b1=b1, b2=b2, **glu)


@pytest.mark.parametrize("quantize", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_against_the_exact_float64_mlp_with_biases(variant, quantize):
    x, w1, w2, b1, b2, ends = inputs(1)
    dout = torch.randn(x.shape[0], D, generator=torch.Generator().manual_seed(3)).to(BF16)
    got = run(x, w1, w2, ends, dout, b1, b2, quantize=quantize, backend="reference", **VARIANTS[variant])
    leaves = [t.double().requires_grad_() for t in (x, w1, w2, b1, b2)]
    out = reference(*leaves, ends, **VARIANTS[variant])
    out.backward(dout.double())
    expected = [out.detach()] + [t.grad for t in leaves]
    bound = 0.08 if quantize else 0.02
    for name, g, e in zip(["out", "dx", "dw1", "dw2", "db1", "db2"], got, expected, strict=True):
        rel = float((g.double() - e).norm() / e.norm())
        assert rel <= bound, f"{name}: relative error {rel:.3g} > {bound}"


def test_bias_shape_and_dtype_errors():
    x, w1, w2, b1, b2, ends = inputs()
    with pytest.raises(ValueError, match="b1 must have shape"):
        swiglu_ops.mxfp8_expert_mlp(x, w1, w2, ends, b1=b1[:, :-2])
    with pytest.raises(ValueError, match="b2 must have shape"):
        swiglu_ops.mxfp8_expert_mlp(x, w1, w2, ends, b2=b2[1:])
    with pytest.raises(TypeError, match="b1 must be bfloat16"):
        swiglu_ops.mxfp8_expert_mlp(x, w1, w2, ends, b1=b1.float())
