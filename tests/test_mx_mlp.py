"""MXFP8ExpertMLP / mxfp8_expert_mlp: every GEMM against float64 on the module's own quantised operands, the
quantisers against an independent MX quantiser, groups, GPT-OSS, backends, torch.compile, and the MX GEMM
path (torch._scaled_mm / torch._scaled_grouped_mm) against fakes that check the layouts those functions read.

The float64 checks take the MXFP8 operands the module produced (captured), dequantise them exactly with the
public ``mx_dequantize`` (not the module's own decoder) and redo each GEMM per expert in float64: the module's
bf16 result must be that value rounded once, up to fp32 accumulation. The fused operators' outputs are
compared bit for bit with a direct call of the operator on the captured input.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import swiglu_ops
from swiglu_ops.numerics import mx
from swiglu_ops.training import eager_math, expert_mlp

GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)
VARIANTS = {"swiglu": {}, "gpt_oss": GPT_OSS}
BF16 = torch.bfloat16


# --------------------------------------------------------------------------------- independent helpers


def ref_mx_quantize(v: torch.Tensor) -> torch.Tensor:
    """Dequantised MXFP8 of ``v [..., nblk, 32]`` (blocks along the last dim), written from the spec without
    swiglu_ops.mx: RCEIL scale 2**ceil(log2(fp32(amax * fp32(1/448)))), E4M3 round-to-nearest-even on the
    grid 2**(max(floor(log2|t|), -6) - 3), saturating at 448. Normal-range data only (asserted)."""
    v64 = v.double()
    amax = v64.abs().amax(dim=-1, keepdim=True)
    p = (amax.float() * torch.tensor(1 / 448, dtype=torch.float32)).double()
    assert bool(((p == 0) | (p >= 2.0**-126)).all()), "test data must keep the block scales normal"
    mant, exp = torch.frexp(p)
    scale = torch.where(
        mant == 0.5, torch.ldexp(torch.ones_like(p), exp - 1), torch.ldexp(torch.ones_like(p), exp)
    )
    scale = torch.where(p == 0, torch.ones_like(p), scale)
    t = v64 / scale
    q = torch.ldexp(torch.ones_like(t), torch.floor(torch.log2(t.abs())).clamp(min=-6) - 3)
    q = torch.where(t == 0, torch.ones_like(t), q)
    return (torch.round(t / q) * q).clamp(-448, 448) * scale  # torch.round: half to even


def ref_rowwise(v: torch.Tensor) -> torch.Tensor:
    """Blocks of 32 along the last dim."""
    return ref_mx_quantize(v.reshape(*v.shape[:-1], -1, 32)).reshape(v.shape)


def ref_token_axis(v: torch.Tensor, ends) -> torch.Tensor:
    """Blocks of 32 rows restarting at every group start (zero padded)."""
    out = torch.zeros(v.shape, dtype=torch.float64)
    for s, e in ranges(ends):
        n = e - s
        if n:
            padded = torch.zeros(-(-n // 32) * 32, v.shape[1], dtype=v.dtype)
            padded[:n] = v[s:e]
            blocks = padded.view(-1, 32, v.shape[1]).transpose(1, 2)  # [nblk, C, 32]
            out[s:e] = ref_mx_quantize(blocks).transpose(1, 2).reshape(-1, v.shape[1])[:n]
    return out


def ranges(ends):
    bounds = [0, *torch.as_tensor(ends).tolist()]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def glu64(h, limit=None, alpha=None, bias=None, interleaved=False):
    gate, up = (h[:, ::2], h[:, 1::2]) if interleaved else h.chunk(2, dim=-1)
    if limit is None:
        return F.silu(gate) * up
    gate = gate.clamp(max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up.clamp(-limit, limit) + bias)


def mlp64(x, w1, w2, ends, **glu):
    """The unquantised expert MLP in float64 (autograd gives the exact gradients)."""
    outs = [glu64(x[s:e] @ w1[g], **glu) @ w2[g] for g, (s, e) in enumerate(ranges(ends))]
    return torch.cat([x.new_zeros(0, w2.shape[-1]), *outs])


def assert_gemm(got: torch.Tensor, a64: torch.Tensor, b64: torch.Tensor) -> None:
    """``got`` (bf16) is the float64 product rounded once to bf16, up to fp32 accumulation."""
    want = a64 @ b64
    bound = 2.0**-8 * want.abs() + 2.0**-22 * (a64.abs() @ b64.abs())
    err = (got.double() - want).abs()
    assert got.dtype == BF16 and got.shape == want.shape
    assert bool((err <= bound).all()), float((err - bound).max())


def make_problem(counts, d=64, hidden=64, seed=0, gain=1.0, variant="swiglu"):
    gen = torch.Generator().manual_seed(seed)
    e = len(counts)
    x = torch.randn(sum(counts), d, generator=gen).to(BF16)
    w1 = (torch.randn(e, d, 2 * hidden, generator=gen) * gain / math.sqrt(d)).to(BF16)
    w2 = (torch.randn(e, hidden, d, generator=gen) / math.sqrt(hidden)).to(BF16)
    dout = (torch.randn(sum(counts), d, generator=gen) * 0.05).to(BF16)
    return x, w1, w2, torch.tensor(counts).cumsum(0), dout, VARIANTS[variant]


def run(x, w1, w2, ends, dout, glu, capture=None, **kw):
    xs, w1s, w2s = (t.clone().requires_grad_() for t in (x, w1, w2))
    out = swiglu_ops.mxfp8_expert_mlp(xs, w1s, w2s, ends, **glu, capture=capture, **kw)
    out.backward(dout)
    return out.detach(), xs.grad, w1s.grad, w2s.grad


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


COUNTS = [70, 0, 1, 130, 31]  # an empty expert, a one-token expert, partial 32-row blocks


# ------------------------------------------------------------------------------------------- quantisers


def test_fast_quantiser_is_mx_quantize_blocks_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(96, 128, generator=gen) * torch.exp2(
        torch.randint(-40, 40, (96, 1), generator=gen).float()
    )
    v[3] = 0.0  # all-zero blocks
    v[5, :7] = -0.0
    v[7] = torch.randn(128, generator=gen) * 2.0**-130  # bf16 subnormals
    v[9, 3] = 448.0 * 2.0**20  # an exact power-of-two multiple of the E4M3 max
    v = v.to(BF16).view(96, 4, 32)
    for dim, blocks in ((-1, v), (1, v.transpose(1, 2).contiguous())):
        want_codes, want_scales = mx.quantize_blocks(blocks, dim, mx.E4M3FN, 1)
        # eager, and the opaque op that torch.compile calls
        for codes, scales in (
            eager_math.quantize_e4m3_blocks(blocks, dim),
            torch.ops.swiglu_ops._mx_e4m3_blocks(blocks, dim),
        ):
            assert torch.equal(codes.view(torch.uint8), want_codes)
            assert torch.equal(scales.view(torch.uint8).long(), want_scales)
        torch.library.opcheck(torch.ops.swiglu_ops._mx_e4m3_blocks, (blocks, dim))


def test_quantisers_match_an_independent_mx_quantiser():
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn(3, 40, 96, generator=gen) * 0.1).to(BF16)
    codes, scales = expert_mlp.quantize_mx_rowwise(w)
    assert codes.dtype == torch.float8_e4m3fn and scales.dtype == torch.uint8 and codes.is_contiguous()
    assert scales.shape == (3, 40, 3)
    deq = codes.double() * torch.exp2(scales.view(torch.uint8).double() - 127).repeat_interleave(32, -1)
    assert torch.equal(deq, ref_rowwise(w))
    assert torch.equal(expert_mlp._dequantize_rowwise(codes, scales).double(), deq)

    v = torch.randn(233, 48, generator=gen).to(BF16)
    ends = torch.tensor([70, 70, 71, 201, 233])
    blocks = expert_mlp._token_blocks(ends, 233)
    y2, s2 = expert_mlp._quantize_token_axis(v, ends, blocks)
    assert s2.shape == (mx.mxscale2_rows(233, 5), 48, 2)  # the operators' mxscale2 layout ...
    public = swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=ends, dtype=torch.float64)
    assert torch.equal(public, ref_token_axis(v, ends))  # ... read by the public dequantiser
    assert torch.equal(expert_mlp._dequantize_token_axis(y2, s2, blocks, ends).double(), public)


def test_token_axis_dequantiser_equals_mx_dequantize_on_operator_output():
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(300, 128, generator=gen).to(BF16)
    ends = torch.tensor([0, 64, 65, 65, 250, 300])
    _, _, y2, s2 = swiglu_ops.swiglu_mx_quant_dual_axis(h, ends, backend="cpu")
    got = expert_mlp._dequantize_token_axis(y2, s2, expert_mlp._token_blocks(ends, 300), ends)
    assert torch.equal(got, swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=ends))


# ------------------------------------------------------------------ every GEMM against float64, per variant


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_gemm_is_the_float64_product_of_its_mxfp8_operands(variant):
    # gain 5: about 8 % of the GPT-OSS gates and 16 % of the up values lie beyond the limit 7
    gain = 5.0 if variant == "gpt_oss" else 1.0
    x, w1, w2, ends, dout, glu = make_problem(COUNTS, seed=4, gain=gain, variant=variant)
    cap = {}
    out, dx, dw1, dw2 = run(x, w1, w2, ends, dout, glu, capture=cap, backend="cpu")
    assert cap["gemm"] == "emulated"
    x64, w1_64, w2_64, dout64 = x.double(), w1.double(), w2.double(), dout.double()
    groups = list(enumerate(ranges(ends)))
    if variant == "gpt_oss":
        gate, up = cap["h"][:, ::2].float(), cap["h"][:, 1::2].float()
        assert float((gate > 7).float().mean()) > 0.05 and float((up.abs() > 7).float().mean()) > 0.1

    # GEMM 1 (bf16): h = x @ w1; then the fused forward operator on exactly that h.
    for g, (s, e) in groups:
        assert_gemm(cap["h"][s:e], x64[s:e], w1_64[g])
    for got, want in zip(
        cap["act"], swiglu_ops.swiglu_mx_quant_dual_axis(cap["h"], ends, **glu), strict=True
    ):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    act_rows = swiglu_ops.mx_dequantize(*cap["act"][:2], axis=-1, dtype=torch.float64)
    act_tokens = swiglu_ops.mx_dequantize(*cap["act"][2:], axis=-2, group_index=ends, dtype=torch.float64)

    # GEMM 2: out = act(y1, blocks along H) @ W2 (MXFP8 along H).
    w2q = ref_rowwise(w2.transpose(-2, -1)).transpose(-2, -1)  # [E, H, d], blocks along H
    assert torch.equal(expert_mlp._dequantize_rowwise(*cap["w2q"]).double().transpose(-2, -1), w2q)
    for g, (s, e) in groups:
        assert_gemm(out[s:e], act_rows[s:e], w2q[g])

    # GEMM 3 (bf16): dact = dout @ W2^T; then the fused backward operator on exactly (h, dact).
    for g, (s, e) in groups:
        assert_gemm(cap["dact"][s:e], dout64[s:e], w2_64[g].t())
    dh_want = swiglu_ops.swiglu_backward_mx_quant_dual_axis(cap["h"], cap["dact"], ends, **glu)
    for got, want in zip(cap["dh"], dh_want, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    dh_rows = swiglu_ops.mx_dequantize(*cap["dh"][:2], axis=-1, dtype=torch.float64)
    dh_tokens = swiglu_ops.mx_dequantize(*cap["dh"][2:], axis=-2, group_index=ends, dtype=torch.float64)

    # GEMM 4: dW2 = act(y2, token blocks)^T @ dout (MXFP8, token blocks restarting per expert).
    dout_q = ref_token_axis(dout, ends)
    assert torch.equal(swiglu_ops.mx_dequantize(*cap["doutq"], axis=-2, group_index=ends).double(), dout_q)
    # GEMM 5: dx = dh(y1, blocks along 2H) @ W1^T (MXFP8 along 2H).
    w1q = ref_rowwise(w1)
    assert torch.equal(expert_mlp._dequantize_rowwise(*cap["w1q"]).double(), w1q)
    # GEMM 6: dW1 = x^T (MXFP8, token blocks) @ dh(y2, token blocks).
    x_q = ref_token_axis(x, ends)
    assert torch.equal(swiglu_ops.mx_dequantize(*cap["xq"], axis=-2, group_index=ends).double(), x_q)
    for g, (s, e) in groups:
        assert_gemm(dw2[g], act_tokens[s:e].t(), dout_q[s:e])
        assert_gemm(dx[s:e], dh_rows[s:e], w1q[g].t())
        assert_gemm(dw1[g], x_q[s:e].t(), dh_tokens[s:e])
        if e == s:  # an empty expert gets exactly zero weight gradients
            assert not dw1[g].any() and not dw2[g].any()
    assert cap["dx"] is dx or torch.equal(cap["dx"], dx)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mxfp8_and_bf16_runs_against_the_exact_float64_mlp(variant):
    x, w1, w2, ends, dout, glu = make_problem([150, 40, 0, 90], seed=5, variant=variant)
    mxfp8 = run(x, w1, w2, ends, dout, glu, backend="cpu")
    bf16 = run(x, w1, w2, ends, dout, glu, backend="cpu", quantize=False)
    x64, w1_64, w2_64 = (t.double().requires_grad_() for t in (x, w1, w2))
    out64 = mlp64(x64, w1_64, w2_64, ends, **glu)
    out64.backward(dout.double())
    exact = (out64.detach(), x64.grad, w1_64.grad, w2_64.grad)
    lib = swiglu_ops.training.expert_mlp.expert_mlp_reference(
        x.double(), w1.double(), w2.double(), ends, **glu
    )
    torch.testing.assert_close(lib, out64.detach(), rtol=1e-12, atol=1e-12)  # the demo's oracle
    for name, m, b, want in zip(("out", "dx", "dw1", "dw2"), mxfp8, bf16, exact, strict=True):
        assert rel(b, want) < 0.01, name  # bf16: a few 2^-9 roundings
        assert 0.01 < rel(m, want) < 0.08, name  # MXFP8: E4M3 (2^-4 steps) in both operands of a GEMM
        assert rel(m, b) < 0.08, name


def test_bf16_baseline_is_the_operators_stage_one_without_quantisation():
    x, w1, w2, ends, dout, glu = make_problem([50, 14], seed=6, variant="gpt_oss")
    cap = {}
    out, dx, dw1, dw2 = run(x, w1, w2, ends, dout, glu, capture=cap, backend="cpu", quantize=False)
    h = torch.cat([(x[s:e].float() @ w1[g].float()).to(BF16) for g, (s, e) in enumerate(ranges(ends))])
    act = swiglu_ops.clipped_swiglu(h)  # GPT-OSS stage 1 of the forward operator, exactly
    for g, (s, e) in enumerate(ranges(ends)):
        assert_gemm(out[s:e], act[s:e].double(), w2[g].double())
    dact = torch.cat(
        [(dout[s:e].float() @ w2[g].float().t()).to(BF16) for g, (s, e) in enumerate(ranges(ends))]
    )
    dh = swiglu_ops.clipped_swiglu_grad(dact, h)
    for g, (s, e) in enumerate(ranges(ends)):
        assert_gemm(dx[s:e], dh[s:e].double(), w1[g].double().t())
    # capture= holds this mode's intermediates too: no quantised operands
    assert set(cap) == {"gemm", "h", "act", "dact", "dh", "dout", "dx", "dw1", "dw2", "db1", "db2", "dprobs"}
    assert cap["gemm"] == "bf16" and cap["db1"] is None and cap["db2"] is None and cap["dprobs"] is None
    for name, want in (("h", h), ("act", act), ("dact", dact), ("dh", dh), ("dout", dout)):
        assert torch.equal(cap[name], want), name
    for name, want in (("dx", dx), ("dw1", dw1), ("dw2", dw2)):
        assert torch.equal(cap[name], want), name


# ------------------------------------------------------------------------------------------------ groups


@pytest.mark.parametrize("counts", [[0, 97, 0], [1, 1, 64], [200], [33, 0, 31, 0]])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_expert_equals_a_call_on_its_tokens_alone(counts, variant):
    """Row-wise blocks never cross a token and token-axis blocks restart at every expert, so the grouped call
    is, bit for bit, the concatenation of one-expert calls; empty experts get zero weight gradients."""
    x, w1, w2, ends, dout, glu = make_problem(counts, d=32, seed=7, variant=variant)
    out, dx, dw1, dw2 = run(x, w1, w2, ends, dout, glu, backend="cpu")
    for g, (s, e) in enumerate(ranges(ends)):
        if e == s:
            assert not dw1[g].any() and not dw2[g].any()
            continue
        one = run(x[s:e], w1[g : g + 1], w2[g : g + 1], torch.tensor([e - s]), dout[s:e], glu, backend="cpu")
        for got, want in zip((out[s:e], dx[s:e], dw1[g : g + 1], dw2[g : g + 1]), one, strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("quantize", [True, False])
def test_no_tokens_at_all(quantize):
    x, w1, w2, _, dout, glu = make_problem([0, 0], d=32, seed=16)
    out, dx, dw1, dw2 = run(x, w1, w2, torch.tensor([0, 0]), dout, glu, backend="cpu", quantize=quantize)
    assert out.shape == dx.shape == (0, 32) and dw1.shape == w1.shape and dw2.shape == w2.shape
    assert not dw1.any() and not dw2.any()


def test_int32_ends_and_no_gradient_for_the_ends():
    x, w1, w2, ends, dout, glu = make_problem([40, 24], d=32, seed=8)
    want = run(x, w1, w2, ends, dout, glu, backend="cpu")
    got = run(x, w1, w2, ends.to(torch.int32), dout, glu, backend="cpu")
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    node = swiglu_ops.mxfp8_expert_mlp(x.requires_grad_(), w1, w2, ends).grad_fn
    assert [f is None for f, _ in node.next_functions] == [False, True, True, True]  # only x is a leaf input


def test_only_the_requested_gradients_are_computed():
    x, w1, w2, ends, dout, glu = make_problem([40, 24], d=32, seed=9)
    full = run(x, w1, w2, ends, dout, glu, backend="cpu")
    w2r = w2.clone().requires_grad_()
    cap = {}
    swiglu_ops.mxfp8_expert_mlp(x, w1, w2r, ends, backend="cpu", capture=cap).backward(dout)
    assert torch.equal(w2r.grad, full[3])
    assert "dh" not in cap and cap["dx"] is None and cap["dw1"] is None  # no SwiGLU backward at all


# ---------------------------------------------------------------------------------- backends, module


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_reference_and_cpu_backends_give_the_same_bits(variant):
    x, w1, w2, ends, dout, glu = make_problem([70, 0, 33, 25], seed=10, variant=variant)
    ref = run(x, w1, w2, ends, dout, glu, backend="reference")
    cpu = run(x, w1, w2, ends, dout, glu, backend="cpu")
    for a, b in zip(ref, cpu, strict=True):
        assert torch.equal(a, b)


def test_module_trains_fp32_master_weights():
    torch.manual_seed(11)
    mod = swiglu_ops.MXFP8ExpertMLP(3, 32, 64, **GPT_OSS, backend="cpu")
    assert "limit=7.0" in repr(mod) and mod.w1.shape == (3, 32, 128) and mod.w2.shape == (3, 64, 32)
    x, ends = torch.randn(90, 32), torch.tensor([30, 30, 90])
    target = torch.randn(90, 32) * 0.1
    opt = torch.optim.Adam(mod.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = F.mse_loss(mod(x, ends).float(), target)
        loss.backward()
        assert mod.w1.grad.dtype == torch.float32 and not mod.w1.grad[1].any()  # expert 1 has no tokens
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("quantize", [True, False])
def test_any_layout_of_x(quantize):
    """x in column-major storage (a transposed view; T = 10 gives fp32 row strides the grouped GEMM
    rejected) gives the contiguous x's output and gradients bit for bit."""
    x, w1, w2, ends, dout, glu = make_problem([4, 6], d=32, seed=17)
    want = run(x, w1, w2, ends, dout, glu, backend="cpu", quantize=quantize)
    got = run(x.t().contiguous().t(), w1, w2, ends, dout, glu, backend="cpu", quantize=quantize)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_bad_arguments_are_clear_errors():
    x, w1, w2, ends, _, _ = make_problem([4, 4], d=32, seed=12)
    f = swiglu_ops.mxfp8_expert_mlp
    with pytest.raises(TypeError, match="x must be bfloat16"):
        f(x.float(), w1, w2, ends)
    with pytest.raises(ValueError, match="w2"):
        f(x, w1, w2[:, :32], ends)
    with pytest.raises(ValueError, match="one cumulative token end per expert"):
        f(x, w1, w2, ends[:1])
    with pytest.raises(TypeError, match="group_ends"):
        f(x, w1, w2, ends.float())
    for quantize in (True, False):  # the bf16 baseline calls no operator, the values are still checked
        with pytest.raises(ValueError, match="last value must equal"):
            f(x, w1, w2, torch.tensor([4, 7]), quantize=quantize)
        with pytest.raises(ValueError, match="non-decreasing"):
            f(x, w1, w2, torch.tensor([8, 4]), quantize=quantize)
    with pytest.raises(ValueError, match="limit, alpha and bias"):
        f(x, w1, w2, ends, limit=7.0)
    for quantize in (True, False):  # checked in the bf16 mode too, which runs neither
        with pytest.raises(ValueError, match="gemm must be one of"):
            f(x, w1, w2, ends, gemm="cublas", quantize=quantize)
        with pytest.raises(ValueError, match="backend must be one of"):
            f(x, w1, w2, ends, backend="nonsense", quantize=quantize)
    with pytest.raises(ValueError, match="needs MX GEMMs"):
        f(x, w1, w2, ends, gemm="scaled_mm")
    with pytest.raises(ValueError, match="at least one expert"):
        f(x[:0], w1[:0], w2[:0], ends[:0])
    with pytest.raises(ValueError, match="hidden must be a multiple of 32"):
        swiglu_ops.MXFP8ExpertMLP(2, 32, 48)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0, 32, 32), {}, ValueError, "num_experts must be >= 1"),
        ((-1, 32, 32), {}, ValueError, "num_experts must be >= 1"),
        (("3", 32, 32), {}, TypeError, "num_experts must be an int"),
        ((2, 0, 32), {}, ValueError, "d_model must be >= 1"),
        ((2, 32, 0), {}, ValueError, "hidden must be >= 1"),
        ((2, 32, 32.0), {}, TypeError, "hidden must be an int"),
        ((2, 32, 32), dict(dtype=torch.int32), TypeError, "dtype"),
        ((2, 32, 32), dict(quantize="yes"), TypeError, "quantize must be a bool"),
        ((2, 32, 32), dict(backend="gpu"), ValueError, "backend must be one of"),
        ((2, 32, 32), dict(backend=None), TypeError, "backend must be a string"),
    ],
)
def test_module_checks_its_arguments_at_construction(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        swiglu_ops.MXFP8ExpertMLP(*args, **kwargs)


def test_module_forward_inputs():
    """x must be a float tensor (TypeError naming it; an int x used to be cast silently, a list died with
    AttributeError); a bf16 probs (FSDP2's mixed precision casts every float input) is widened exactly:
    the fp32 call's output bit for bit, its gradient that one's rounded; numpy sizes are sizes."""
    import numpy as np

    torch.manual_seed(3)
    mod = swiglu_ops.MXFP8ExpertMLP(np.int64(2), 32, np.int32(32), backend="cpu")
    x, ends = torch.randn(40, 32), torch.tensor([15, 40])
    with pytest.raises(TypeError, match="x must be a floating-point torch.Tensor, got list"):
        mod(x.tolist(), ends)
    with pytest.raises(TypeError, match="x must be a floating-point torch.Tensor, got torch.int64"):
        mod(x.long(), ends)
    with pytest.raises(TypeError, match="probs must be a floating-point torch.Tensor"):
        mod(x, ends, torch.ones(40, dtype=torch.int32))
    p16 = torch.rand(40).bfloat16().requires_grad_()
    p32 = p16.detach().float().requires_grad_()
    out16, out32 = mod(x, ends, p16), mod(x, ends, p32)
    assert torch.equal(out16, out32)
    out16.float().sum().backward()
    out32.float().sum().backward()
    assert p16.grad.dtype == torch.bfloat16 and torch.equal(p16.grad, p32.grad.bfloat16())


# ----------------------------------------------------------------------------------------- torch.compile


def compile_step(compile_backend, weights_dtype, variant="swiglu"):
    torch.manual_seed(13)
    mod = swiglu_ops.MXFP8ExpertMLP(3, 32, 64, **VARIANTS[variant], backend="cpu", dtype=weights_dtype)
    x, ends, dout = torch.randn(100, 32).to(BF16), torch.tensor([37, 37, 100]), torch.randn(100, 32).to(BF16)

    def step(fn):
        mod.zero_grad()
        xr = x.clone().requires_grad_()
        out = fn(xr, ends)
        out.backward(dout)
        return out.detach(), xr.grad, mod.w1.grad.clone(), mod.w2.grad.clone()

    eager = step(mod)
    torch._dynamo.reset()
    return step(torch.compile(mod, backend=compile_backend, fullgraph=True)), eager


@pytest.mark.parametrize(
    ("compile_backend", "weights_dtype", "variant"),
    [
        ("aot_eager", torch.float32, "swiglu"),
        ("inductor", BF16, "swiglu"),
        ("inductor", BF16, "gpt_oss"),
        ("inductor", torch.float32, "swiglu"),
        ("inductor", torch.float32, "gpt_oss"),
    ],
)
def test_module_compiles_fullgraph_and_equals_eager(compile_backend, weights_dtype, variant):
    """Bit for bit, fp32 master weights under Inductor too: Inductor fused ``w.to(bf16)`` into the weight
    quantisation and by default (``emulate_precision_casts`` off) skipped that rounding, quantising the fp32
    values (out and dx then differed within MX precision); the quantiser is one opaque op under compile."""
    compiled, eager = compile_step(compile_backend, weights_dtype, variant)
    for a, b in zip(compiled, eager, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("quantize", [True, False])
def test_module_runs_on_fake_tensors(quantize):
    """Under FakeTensorMode (shape propagation, as tracers and memory planners do) forward and backward give
    the eager shapes and dtypes: the CPU GEMMs' fp32 computation used to meet torch._grouped_mm's fake
    kernel, which takes bf16 only (a RuntimeError and an ERROR log). Real calls before and after are
    unchanged (the cached decode tables stay real: a fake call makes its own)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    torch.manual_seed(0)
    real = swiglu_ops.MXFP8ExpertMLP(2, 32, 32, quantize=quantize)
    x, ends = torch.randn(6, 32), torch.tensor([3, 6])

    def real_step():
        xr = x.clone().requires_grad_()
        out = real(xr, ends)
        out.float().sum().backward()
        return out, xr.grad

    before = real_step()
    with FakeTensorMode():
        mod = swiglu_ops.MXFP8ExpertMLP(2, 32, 32, quantize=quantize)
        xf, probs = torch.empty(6, 32, requires_grad=True), torch.ones(6, requires_grad=True)
        out = mod(xf, torch.tensor([3, 6]), probs)
        out.float().sum().backward()
    assert isinstance(out, FakeTensor) and out.shape == (6, 32) and out.dtype == BF16
    assert xf.grad.shape == xf.shape and probs.grad.shape == probs.shape
    assert mod.w1.grad.shape == mod.w1.shape and mod.w2.grad.shape == mod.w2.shape
    for a, b in zip(real_step(), before, strict=True):
        assert not isinstance(a, FakeTensor) and torch.equal(a, b)


@pytest.mark.parametrize("variant", ["swiglu", "gpt_oss"])
def test_bf16_baseline_with_probs_compiles_to_eager_bit_for_bit(variant):
    """The unfused baseline (``quantize=False``) computes its activation, gradient and the router's gradient
    in plain torch; under Inductor the router's gradient (a sum over the hidden axis of dact * act16) was
    reordered and lost act16's rounding (0.1-0.2 % off eager). Each is one opaque op under compile now."""
    torch.manual_seed(7)
    mod = swiglu_ops.MXFP8ExpertMLP(3, 32, 64, **VARIANTS[variant], quantize=False, dtype=BF16)
    x, ends, dout = torch.randn(100, 32).to(BF16), torch.tensor([37, 37, 100]), torch.randn(100, 32).to(BF16)
    probs = torch.rand(100)

    def step(fn):
        mod.zero_grad()
        xr, pr = x.clone().requires_grad_(), probs.clone().requires_grad_()
        out = fn(xr, ends, pr)
        out.backward(dout)
        return out.detach(), xr.grad, pr.grad, mod.w1.grad.clone(), mod.w2.grad.clone()

    eager = step(mod)
    torch._dynamo.reset()
    for a, b in zip(step(torch.compile(mod, fullgraph=True)), eager, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------- the MX GEMM path, against fakes of the torch functions


def unblock(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of the cuBLAS blocked layout (128x4 tiles, row-major tile order, byte (r%32)*16 + (r//32)*4 + c
    inside a tile) for a ``[rows, cols]`` scale matrix stored at ``flat``."""
    pcols = -(-cols // 4) * 4
    r = torch.arange(rows).view(-1, 1)
    c = torch.arange(cols).view(1, -1)
    tile = (r // 128) * (pcols // 4) + c // 4
    rr, cc = r % 128, c % 4
    return flat.view(torch.uint8)[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc]


def padded_numel(rows: int, cols: int) -> int:
    return -(-rows // 128) * 128 * -(-cols // 4) * 4


def deq(codes: torch.Tensor, scale_codes: torch.Tensor) -> torch.Tensor:
    """``[R, K]`` FP8 codes with ``[R, K/32]`` scale codes (blocks along K)."""
    return codes.double() * torch.exp2(scale_codes.double() - 127).repeat_interleave(32, dim=-1)


def is_row_major(t):
    return t.stride(-1) == 1 and t.stride(-2) >= max(1, t.shape[-1])


def is_col_major(t):
    return t.stride(-2) == 1 and t.stride(-1) >= max(1, t.shape[-2])


class FakeMXGemms:
    """torch._scaled_mm / torch._scaled_grouped_mm for MXFP8 as PyTorch documents them (meta registrations,
    test_scaled_matmul_cuda.py): checks the argument rules, then computes on the dequantised operands."""

    def __init__(self):
        self.calls = []

    def _check_common(self, a, b, sa, sb, out_dtype):
        assert a.dtype == b.dtype == torch.float8_e4m3fn and sa.dtype == sb.dtype == torch.float8_e8m0fnu
        assert sa.is_contiguous() and sb.is_contiguous() and out_dtype == BF16
        assert is_row_major(a) and is_col_major(b), (a.shape, a.stride(), b.shape, b.stride())

    def scaled_mm(
        self, a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False
    ):
        self.calls.append("scaled_mm")
        self._check_common(a, b, scale_a, scale_b, out_dtype)
        (m, k), n = a.shape, b.shape[1]
        assert k % 16 == 0 and b.shape[0] == k and n % 16 == 0
        assert scale_a.numel() == padded_numel(m, k // 32) and scale_b.numel() == padded_numel(n, k // 32)
        lhs = deq(a, unblock(scale_a.flatten(), m, k // 32))
        rhs = deq(b.t(), unblock(scale_b.flatten(), n, k // 32)).t()
        return (lhs.float() @ rhs.float()).to(BF16)

    def scaled_grouped_mm(self, a, b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                          out_dtype=None, use_fast_accum=False):  # fmt: skip
        self.calls.append(f"scaled_grouped_mm_{a.dim()}d{b.dim()}d")
        self._check_common(a, b, scale_a, scale_b, out_dtype)
        assert offs.dtype == torch.int32 and offs.dim() == 1
        bounds = [0, *offs.tolist()]
        if b.dim() == 3:  # 2d-3d: groups along M; scale_a per group padded to 128 rows, scale_b per expert
            (t, k), (e, _, n) = a.shape, b.shape
            assert scale_a.dim() == 2 and scale_b.shape == (e, padded_numel(n, k // 32))
            out, row = torch.zeros(t, n, dtype=BF16), 0  # scale_a: groups at multiples of 128 rows
            for g, (s, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                flat = scale_a.flatten()[row * scale_a.shape[1] :]
                lhs = deq(a[s:end], unblock(flat, end - s, k // 32))
                rhs = deq(b[g].t(), unblock(scale_b[g], n, k // 32)).t()
                out[s:end] = (lhs.float() @ rhs.float()).to(BF16)
                row += -(-(end - s) // 128) * 128
            assert row <= scale_a.shape[0] and not scale_a.view(torch.uint8)[row:].any()  # a zero tail
            return out
        # 2d-2d: groups along K (tokens), each group's blocked scales one after another in memory
        (na, t), nb = a.shape, b.shape[1]
        outs, offset_a, offset_b = [], 0, 0
        for s, end in zip(bounds[:-1], bounds[1:], strict=True):
            kb = (end - s) // 32
            assert (end - s) % 32 == 0 and kb > 0
            lhs = deq(a[:, s:end], unblock(scale_a.flatten()[offset_a:], na, kb))
            rhs = deq(b[s:end].t(), unblock(scale_b.flatten()[offset_b:], nb, kb)).t()
            outs.append((lhs.float() @ rhs.float()).to(BF16))
            offset_a += padded_numel(na, kb)
            offset_b += padded_numel(nb, kb)
        for scale, used in ((scale_a, offset_a), (scale_b, offset_b)):  # then (upper-bound sizes) zeros
            assert used <= scale.numel() and not scale.view(torch.uint8).flatten()[used:].any()
        return torch.stack(outs)


@pytest.fixture
def fake_mx_gemms(monkeypatch):
    fakes = FakeMXGemms()
    monkeypatch.setattr(torch, "_scaled_mm", fakes.scaled_mm)
    monkeypatch.setattr(torch, "_scaled_grouped_mm", fakes.scaled_grouped_mm)
    return fakes


@pytest.mark.parametrize(
    ("gemm", "counts"), [("scaled_grouped_mm", [64, 32, 160]), ("scaled_mm", [64, 0, 32, 160])]
)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mx_gemm_path_feeds_the_documented_layouts(fake_mx_gemms, monkeypatch, gemm, counts, variant):
    """With MX GEMMs "available" (faked), the module passes FP8 codes and cuBLAS blocked scales that, read
    back by the documented layout rules, give the emulated path's results."""
    monkeypatch.setattr(expert_mlp, "mx_gemm_support", lambda device: gemm)
    x, w1, w2, ends, dout, glu = make_problem(counts, d=48, seed=14, variant=variant)
    cap = {}
    got = run(x, w1, w2, ends, dout, glu, capture=cap, backend="cpu")
    assert cap["gemm"] == gemm
    expected_calls = {"scaled_grouped_mm": {"scaled_grouped_mm_2d3d", "scaled_grouped_mm_2d2d"}}
    assert set(fake_mx_gemms.calls) == expected_calls.get(gemm, {"scaled_mm"})
    want = run(x, w1, w2, ends, dout, glu, backend="cpu", gemm="emulated")
    for a, b in zip(got, want, strict=True):  # same products, fp32 sums in another order: 1 bf16 ulp at most
        ulp = torch.exp2(torch.floor(torch.log2(b.double().abs().clamp_min(2.0**-126))) - 7)
        assert bool(((a.double() - b.double()).abs() <= ulp).all())
        assert (a != b).float().mean() < 0.01


def test_auto_uses_mx_gemms_only_where_their_rules_hold(fake_mx_gemms, monkeypatch):
    monkeypatch.setattr(expert_mlp, "mx_gemm_support", lambda device: "scaled_grouped_mm")
    x, w1, w2, _, dout, glu = make_problem([64, 33], d=32, seed=15)
    # 33 tokens: not a multiple of 32; an empty expert: per-expert torch._scaled_mm; else the grouped GEMM
    for ends, expect in (([64, 97], "emulated"), ([64, 64], "scaled_mm"), ([32, 96], "scaled_grouped_mm")):
        cap, n = {}, ends[-1]
        run(x[:n], w1, w2, torch.tensor(ends), dout[:n], glu, capture=cap, backend="cpu")
        assert cap["gemm"] == expect
    with pytest.raises(ValueError, match="multiples of 32"):
        run(x, w1, w2, torch.tensor([64, 97]), dout, glu, backend="cpu", gemm="scaled_mm")
    with pytest.raises(ValueError, match="every expert to have tokens"):
        run(x[:64], w1, w2, torch.tensor([64, 64]), dout[:64], glu, backend="cpu", gemm="scaled_grouped_mm")
