"""An MoE expert MLP whose SwiGLU runs on the fused dual-axis MX operators: :class:`MXFP8ExpertMLP`.

``out = SwiGLU(x @ W1[e]) @ W2[e]`` for the tokens of each expert ``e`` (ragged groups given by cumulative row
**ends**, the MX operators' ``group_index``, which is also ``torch._grouped_mm``'s ``offs``). The forward's
activation is quantised by :func:`swiglu_ops.swiglu_mx_quant_dual_axis` and the backward's SwiGLU gradient
by :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis`; each of the two dual-axis results feeds two GEMMs:

=====================  ===========================  ======================================  ======
GEMM                   operand from a fused op      partner                                 K
=====================  ===========================  ======================================  ======
1 up    h = x W1       (none: bf16 x)               bf16 W1                                 d
2 down  out = a W2     act ``y1`` (blocks along H)  W2, MXFP8 blocks along H                H
3 down  da = g W2^T    (none: bf16 dout)            bf16 W2                                 d
4 wgrad dW2 = a^T g    act ``y2`` (token blocks)    dout, MXFP8 token blocks                tokens
5 up    dx = dh W1^T   dh ``y1`` (blocks along 2H)  W1, MXFP8 blocks along 2H               2H
6 wgrad dW1 = x^T dh   dh ``y2`` (token blocks)     x, MXFP8 token blocks                   tokens
=====================  ===========================  ======================================  ======

(``a`` = act, ``g`` = dout, ``dh`` = the SwiGLU's input gradient.) GEMMs 2, 4, 5 and 6 read MXFP8 (E4M3FN
elements, E8M0 scales, RCEIL rule, 32-element blocks along K) in **both** operands, as an MX GEMM does:
the partner is quantised by the same rules (:func:`swiglu_ops.numerics.mx.quantize_blocks`), and token-axis
blocks restart at every expert's first token, in the operators' own ``mxscale2`` layout. GEMMs 1 and 3 stay
bf16. Every GEMM accumulates in fp32 and rounds its result once to bf16.

Where the GEMMs run (``gemm=``):

- ``"emulated"`` (every device; what ``"auto"`` picks on CPU and on GPUs without MX GEMMs): the MXFP8
  operands are dequantised exactly and multiplied by ``torch._grouped_mm`` (a per-expert loop on torch <
  2.9), in fp32 on CPU and in bf16 on GPUs (which holds every MXFP8 value whose block amax is above about
  2**-115), accumulating in fp32 either way. No host
  synchronisation, so the function also traces under ``torch.compile(fullgraph=True)``.
- ``"scaled_grouped_mm"`` / ``"scaled_mm"``: CUDA devices with MX GEMMs (compute capability >= 10.0):
  ``torch._scaled_grouped_mm`` (10.0 and a PyTorch built with its MXFP8 grouped kernels) or one
  ``torch._scaled_mm`` per expert, on the FP8 codes and the cuBLAS blocked scales from
  :mod:`swiglu_ops.layouts`. They need every expert's token count to be a multiple of 32 and ``d % 16 == 0``
  (``"auto"`` falls back to ``"emulated"`` otherwise) and read the group ends on the host. **Written from
  PyTorch's tests and torchao's MXFP8 MoE code; never run on such a GPU** (tested on CPU against fakes of
  the two functions that check their documented layout rules).

``quantize=False`` is the bf16 baseline: the same six GEMMs in bf16 and the operators' stage 1 (the exact
activation and its gradient in fp32, rounded once to bf16) without quantisation, so that the two runs differ
only by MXFP8.
"""

from __future__ import annotations

import math
import numbers

import torch

from ..numerics import mx
from ..ops import api
from ..ops import validate as V
from ..ops.registry import check_backend_for, check_backend_name
from . import eager_math, layouts
from .autograd import no_double_backward

mx_dequantize = api.mx_dequantize

__all__ = ["MXFP8ExpertMLP", "mxfp8_expert_mlp", "quantize_mx_rowwise", "expert_mlp_reference", "GEMMS"]

#: Values of ``gemm=``.
GEMMS = ("auto", "emulated", "scaled_grouped_mm", "scaled_mm")

_FMT = mx.E4M3FN
_BF16 = torch.bfloat16
_E8M0 = torch.float8_e8m0fnu
#: ``(major, minor)`` of the running PyTorch.
TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
_HAS_GROUPED_MM = hasattr(torch, "_grouped_mm") and TORCH_VERSION >= (2, 9)  # CPU kernels since 2.9 (not 2.8)


# ------------------------------------------------------------------------------------------ quantisers


def quantize_mx_rowwise(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (E4M3FN, RCEIL E8M0 scales) of ``v [..., K]`` in 32-element blocks along the last dim
    (``K % 32 == 0``): ``(codes float8_e4m3fn [..., K], scale codes uint8 [..., K/32])`` (view them as
    ``torch.float8_e8m0fnu`` for a GEMM).

    The rules are the operators' (:func:`swiglu_ops.numerics.mx.quantize_blocks`); used for the weights,
    whose K is their last dim once laid out ``[E, N, K]``. The codes are contiguous (row-major, as MX GEMMs
    read them)."""
    *lead, k = v.shape
    codes, scales = eager_math.quantize_e4m3_blocks(v.contiguous().view(*lead, k // mx.BLOCK, mx.BLOCK), -1)
    return codes.reshape(v.shape), scales


def _row_experts(ends: torch.Tensor, m: int) -> torch.Tensor:
    """The expert of every row (int64 ``[m]``), without host synchronisation; in bounds for any values."""
    rows = torch.arange(m, device=ends.device)
    return torch.searchsorted(ends.to(torch.int64), rows, right=True).clamp(max=ends.numel() - 1)


def _token_blocks(
    ends: torch.Tensor, m: int, experts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every row r: the ``mxscale2`` slot of its 32-row block and its position in the block. Row r of
    group g (first row ``start``) is in slot ``2 * (start // 64 + g) + (r - start) // 32``
    (:func:`swiglu_ops.numerics.mx.group_row_base`). ``experts``: :func:`_row_experts` of the same ends
    when already computed. Tensor ops only (no host synchronisation)."""
    ends = ends.to(torch.int64)
    rows = torch.arange(m, device=ends.device)
    g = _row_experts(ends, m) if experts is None else experts
    start = torch.cat([ends.new_zeros(1), ends[:-1]])[g]
    offset = rows - start
    return 2 * mx.group_row_base(g, start) + offset // mx.BLOCK, offset % mx.BLOCK


def _quantize_token_axis(v: torch.Tensor, ends: torch.Tensor, blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 of ``v [M, C]`` along the token axis, 32-row blocks restarting at every group start: the
    operators' ``y2``/``mxscale2`` layout (``[M, C]`` codes, ``[M // 64 + G, C, 2]`` uint8 scale codes, unused
    slots 0)."""
    m, c = v.shape
    slot, pos = blocks
    rows = mx.mxscale2_rows(m, ends.numel())
    dest = slot * mx.BLOCK + pos
    padded = v.new_zeros(2 * rows * mx.BLOCK, c).index_copy(0, dest, v)
    codes, scales = eager_math.quantize_e4m3_blocks(padded.view(2 * rows, mx.BLOCK, c), 1)
    y2 = codes.view(2 * rows * mx.BLOCK, c).index_select(0, dest)
    return y2, scales.view(rows, 2, c).transpose(1, 2).contiguous()


def _table(cached, *args) -> torch.Tensor:
    """A decode table of :mod:`swiglu_ops.numerics.mx` (cached per dtype and device); traced uncached under
    torch.compile (Dynamo ignores the cache and warns about it), and made afresh under a dispatch mode such
    as FakeTensorMode (a real cached table cannot meet fake indices, and a fake one must not be cached)."""
    fresh = torch.compiler.is_compiling() or V.dispatch_mode_active()
    return (cached.__wrapped__ if fresh else cached)(*args)


def _values(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``element(codes) * 2**(scales - 127)`` elementwise (scales already one per element), fp32."""
    elements = mx.lookup(_table(mx.element_table, _FMT, torch.float32, codes.device), codes)
    return elements * mx.lookup(_table(mx.e8m0_table, torch.float32, codes.device), scales)


def _dequantize_token_axis(y2: torch.Tensor, s2: torch.Tensor, blocks, ends: torch.Tensor) -> torch.Tensor:
    """``mx_dequantize(y2, s2, axis=-2, group_index=ends)`` in fp32, in eager mode without host
    synchronisation; while torch.compile traces, that function itself (one opaque node: Inductor has no
    ``float8_e8m0fnu`` kernels)."""
    if torch.compiler.is_compiling():
        return mx_dequantize(y2, s2, axis=-2, group_index=ends)
    slots = s2.view(torch.uint8).movedim(-1, -2).reshape(-1, s2.shape[-2])  # slot 2 * row + s
    return _values(y2, slots.index_select(0, blocks[0]))


def _dequantize_rowwise(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_mx_rowwise`, fp32."""
    return _values(codes, scales.view(torch.uint8).repeat_interleave(mx.BLOCK, dim=-1))


# ----------------------------------------------------------------------------------------- bf16 GEMMs


def _ranges(ends: torch.Tensor) -> list[tuple[int, int]]:
    """``[(start, end)]`` of every group, read on the host."""
    bounds = [0, *ends.tolist()]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _grouped_mm_impl(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """:func:`_grouped_mm`. On CPU it runs in fp32: ``torch._grouped_mm``'s bf16 CPU kernel is 20-30x slower
    here (and only bf16 passes its fake kernel, hence the custom op below for torch.compile)."""
    if b.dim() == 3 and a.shape[0] == 0:  # no tokens (torch._grouped_mm rejects empty operands)
        return a.new_zeros(0, b.shape[-1], dtype=_BF16)
    if b.dim() == 2 and b.shape[0] == 0:
        return a.new_zeros(offs.numel(), a.shape[0], b.shape[1], dtype=_BF16)
    work = torch.float32 if a.device.type == "cpu" else _BF16  # fp32 accumulation either way
    a, b = a.to(work), b.to(work)
    if _HAS_GROUPED_MM:
        return torch._grouped_mm(a, b, offs=offs).to(_BF16)
    ranges = _ranges(offs)  # torch < 2.9: a loop over the experts (one host read of the ends)
    if b.dim() == 3:
        parts = [a[s:e].float() @ b[g].float() for g, (s, e) in enumerate(ranges)]
        return torch.cat([a.new_empty(0, b.shape[-1]).float(), *parts]).to(_BF16)
    return torch.stack([a[:, s:e].float() @ b[s:e].float() for s, e in ranges]).to(_BF16)


_grouped_mm_op = torch.library.custom_op(
    "swiglu_ops::_expert_grouped_mm", _grouped_mm_impl, mutates_args=(), device_types=("cpu", "cuda")
)


@_grouped_mm_op.register_fake
def _grouped_mm_fake(a, b, offs):
    if b.dim() == 3:
        return a.new_empty(a.shape[0], b.shape[-1], dtype=_BF16)
    return a.new_empty(offs.shape[0], a.shape[0], b.shape[1], dtype=_BF16)


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Grouped GEMM, fp32 accumulation, one rounding to bf16: ``a [T, K]`` rows of group g times ``b[g]``
    (``b [E, K, N]``) -> ``[T, N]``; or, with ``a [K, T]`` (tokens along its columns) and ``b [T, N]``, the
    per-group ``a[:, group] @ b[group]`` -> ``[E, K, N]`` (zeros for an empty group). ``offs``: int32 group
    ends. Operands are bf16, or fp32 holding bf16-exact values (dequantised MXFP8)."""
    # one opaque node under torch.compile, and the same op's fake kernel for fake tensors (FakeTensorMode):
    # the fp32 CPU computation would meet torch._grouped_mm's fake kernel, which takes bf16 only
    if torch.compiler.is_compiling() or V.needs_dispatch({"a": a, "b": b, "offs": offs}):
        return torch.ops.swiglu_ops._expert_grouped_mm(a, b, offs)
    return _grouped_mm_impl(a, b, offs)


# ------------------------------------------------------------------------------------------- MX GEMMs


def mx_gemm_support(device: torch.device) -> str | None:
    """The MX GEMM PyTorch offers on ``device``: ``"scaled_grouped_mm"``, ``"scaled_mm"`` or None.

    MX ``torch._scaled_mm`` needs CUDA compute capability >= 10.0; MXFP8 ``torch._scaled_grouped_mm`` needs
    10.0 and a PyTorch built with its grouped kernels (the condition PyTorch's own tests use)."""
    if device.type != "cuda" or torch.version.hip or not torch.cuda.is_available():
        return None
    cap = torch.cuda.get_device_capability(device)
    if cap < (10, 0):
        return None
    config = torch.__config__.show()
    grouped = "USE_MSLK" in config or "FBGEMM" in config
    if cap == (10, 0) and hasattr(torch, "_scaled_grouped_mm") and grouped:
        return "scaled_grouped_mm"
    return "scaled_mm" if hasattr(torch, "_scaled_mm") else None


def _resolve_gemm(gemm: str, x: torch.Tensor, ends: torch.Tensor) -> str:
    """The GEMM path of a checked ``gemm`` (:func:`check_options`) for x's device."""
    if gemm == "emulated":
        return gemm
    supported = mx_gemm_support(x.device)
    if gemm == "auto" and supported is None:
        return "emulated"
    if supported is None or (gemm == "scaled_grouped_mm" and supported != gemm):
        raise ValueError(f"gemm={gemm!r} needs MX GEMMs, which PyTorch does not offer on {x.device}")
    sizes = [e - s for s, e in _ranges(ends)]  # the blocked scale layouts need them on the host anyway
    ok = all(n % mx.BLOCK == 0 for n in sizes) and x.shape[-1] % 16 == 0
    if gemm == "auto":
        if not ok:
            return "emulated"
        return supported if all(n > 0 for n in sizes) else "scaled_mm"
    if not ok:
        raise ValueError(f"gemm={gemm!r} needs token counts that are multiples of 32 and d % 16 == 0")
    if gemm == "scaled_grouped_mm" and not all(n > 0 for n in sizes):
        raise ValueError("gemm='scaled_grouped_mm' needs every expert to have tokens (use 'scaled_mm')")
    return gemm


def _e8m0(scales: torch.Tensor) -> torch.Tensor:
    return scales.view(_E8M0)


def _blocked(scales: torch.Tensor) -> torch.Tensor:
    """One ``[rows, K/32]`` scale matrix in the cuBLAS blocked layout, flat, as ``float8_e8m0fnu``."""
    return _e8m0(layouts.to_blocked(scales).flatten())


def _blocked_stack(scales: torch.Tensor) -> torch.Tensor:
    """``[E, N, K/32]`` -> ``[E, blocked]``: each expert's scales in the cuBLAS blocked layout."""
    return torch.stack([_blocked(s) for s in scales])


def _mm_rows(gemm: str, a, b, ends: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """GEMM 2 / 5: ``a = (y1, mxscale1)`` ``[T, K]`` from a fused op times, per group, ``b = (codes, scales)``
    ``[E, N, K]`` (blocks along K) transposed -> ``[T, N]`` bf16."""
    (y1, s1), (bq, bs) = a, b
    if gemm == "emulated":
        lhs = mx_dequantize(y1, s1, axis=-1)  # fp32 values, exact in bf16
        rhs = _dequantize_rowwise(bq, bs).transpose(-2, -1)
        return _grouped_mm(lhs, rhs, offs)
    if gemm == "scaled_grouped_mm":
        return torch._scaled_grouped_mm(
            y1, bq.transpose(-2, -1), _e8m0(layouts.mxscale1_to_blocked(s1, ends)), _blocked_stack(bs),
            offs=offs, out_dtype=_BF16,
        )  # fmt: skip
    plain = layouts.mxscale1_to_plain(s1, y1.shape[1])
    out = y1.new_zeros(y1.shape[0], bq.shape[1], dtype=_BF16)
    for g, (s, e) in enumerate(_ranges(ends)):
        if e > s:
            out[s:e] = torch._scaled_mm(
                y1[s:e], bq[g].t(), _blocked(plain[s:e]), _blocked(bs[g]), out_dtype=_BF16,
            )  # fmt: skip
    return out


def _mm_tokens(
    gemm: str, a, b, ends: torch.Tensor, offs: torch.Tensor, blocks, b_values: torch.Tensor | None = None
) -> torch.Tensor:
    """GEMM 4 / 6: per group ``a[g]^T @ b[g]`` for two token-axis MXFP8 operands ``(y2, mxscale2)``,
    ``[T, Na]`` and ``[T, Nb]`` -> ``[E, Na, Nb]`` bf16 (zeros for an empty group). ``b_values``: ``b``
    already dequantised (:func:`_dequantize_token_axis`), for the emulated GEMM."""
    (ay, a_s), (by, b_s) = a, b
    if gemm == "emulated":
        lhs = _dequantize_token_axis(ay, a_s, blocks, ends)
        rhs = _dequantize_token_axis(by, b_s, blocks, ends) if b_values is None else b_values
        return _grouped_mm(lhs.t(), rhs, offs)
    m = ay.shape[0]
    if gemm == "scaled_grouped_mm":  # "K groups": each group's blocked tiles one after another in memory
        return torch._scaled_grouped_mm(
            ay.t().contiguous(), by.t().contiguous().t(), _e8m0(layouts.mxscale2_to_blocked(a_s, m, ends)),
            _e8m0(layouts.mxscale2_to_blocked(b_s, m, ends)), offs=offs, out_dtype=_BF16,
        )  # fmt: skip
    ranges = _ranges(ends)
    a_plain = layouts.mxscale2_to_plain(a_s, m, ends)  # [blocks, Na]: the groups' blocks in group order
    b_plain = layouts.mxscale2_to_plain(b_s, m, ends)
    out = ay.new_zeros(len(ranges), ay.shape[1], by.shape[1], dtype=_BF16)
    first = 0
    for g, (s, e) in enumerate(ranges):
        nblk = -(-(e - s) // mx.BLOCK)
        if e > s:
            out[g] = torch._scaled_mm(
                ay[s:e].t().contiguous(), by[s:e].t().contiguous().t(),
                _blocked(a_plain[first : first + nblk].t()), _blocked(b_plain[first : first + nblk].t()),
                out_dtype=_BF16,
            )  # fmt: skip
        first += nblk
    return out


# ------------------------------------------------------------------------------------ autograd function


def _group_sums(v: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Per-expert column sums of ``v [T, N]`` in fp32, rounded once to bf16: the gradient of a per-expert
    bias (``index_add_``: exact order on CPU; atomics on CUDA)."""
    out = torch.zeros(num_experts, v.shape[1], dtype=torch.float32, device=v.device)
    return out.index_add_(0, experts, v.float()).to(_BF16)


class _ExpertMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x, w1, w2, ends, limit, alpha, bias, interleaved, quantize, backend, gemm, capture, b1, b2, probs
    ):
        glu_kwargs = dict(limit=limit, alpha=alpha, bias=bias, interleaved=interleaved)
        offs = ends.to(torch.int32)
        path = _resolve_gemm(gemm, x, ends) if quantize else "bf16"
        h = _grouped_mm(x, w1, offs)  # GEMM 1, bf16
        experts = _row_experts(ends, x.shape[0]) if b1 is not None or b2 is not None else None
        if b1 is not None:  # the linear bias of GEMM 1, added to its bf16 result (HF's grouped_mm does that)
            h = h + b1[experts]
        if quantize:
            act = api.swiglu_mx_quant_dual_axis(h, ends, **glu_kwargs, weight=probs, backend=backend)
            w2q = quantize_mx_rowwise(w2.transpose(-2, -1))  # [E, d, H]: blocks along H
            out = _mm_rows(path, act[:2], w2q, ends, offs)  # GEMM 2
            saved = act[2:]  # y2, mxscale2: the wgrad operand of W2
            if capture is not None:
                capture.update(gemm=path, h=h, act=act, w2q=w2q)
        else:
            glu = V.mx_glu_params(True, interleaved, limit, alpha, bias)
            act = eager_math.forward_rounded(h, glu, probs)  # the router's probabilities: the last fp32 op
            out = _grouped_mm(act, w2, offs)
            saved = (act,)
            if capture is not None:
                capture.update(gemm=path, h=h, act=act)
        if b2 is not None:
            out = out + b2[experts]
        ctx.save_for_backward(x, w1, w2, ends, h, experts, probs, *saved)
        ctx.glu_kwargs, ctx.quantize, ctx.backend, ctx.path = glu_kwargs, quantize, backend, path
        ctx.capture = capture
        return out

    @staticmethod
    @no_double_backward
    def backward(ctx, dout):
        x, w1, w2, ends, h, experts, probs, *saved = ctx.saved_tensors
        need_x, need_w1, need_w2 = ctx.needs_input_grad[:3]
        need_b1, need_b2, need_probs = ctx.needs_input_grad[12:]
        need_dh = need_x or need_w1 or need_b1 or need_probs
        dout = dout.to(_BF16).contiguous()
        offs = ends.to(torch.int32)
        dx = dw1 = dw2 = db1 = dprobs = None
        # b2's gradient: the per-expert sum of the bf16 dout (the unquantised operand, as in GEMM 3)
        db2 = _group_sums(dout, experts, w1.shape[0]) if need_b2 else None
        if not ctx.quantize:
            (act,) = saved
            glu = V.mx_glu_params(True, **ctx.glu_kwargs)
            if need_w2:
                dw2 = _grouped_mm(act.t(), dout, offs)
            if need_dh:
                dact = _grouped_mm(dout, w2.transpose(-2, -1), offs)
                dh = eager_math.backward_rounded(h, dact, glu, probs)
                dx = _grouped_mm(dh, w1.transpose(-2, -1), offs) if need_x else None
                dw1 = _grouped_mm(x.t(), dh, offs) if need_w1 else None
                db1 = _group_sums(dh, experts, w1.shape[0]) if need_b1 else None
                if need_probs:  # dL/dprobs = sum_h dact * act16, act16 the unweighted activation (rounded)
                    dprobs = eager_math.act16_sums(dact, h, glu).view(probs.shape)
                if ctx.capture is not None:
                    ctx.capture.update(dact=dact, dh=dh)
            if ctx.capture is not None:
                ctx.capture.update(dout=dout, dx=dx, dw1=dw1, dw2=dw2, db1=db1, db2=db2, dprobs=dprobs)
            return dx, dw1, dw2, *([None] * 9), db1, db2, dprobs

        path, capture = ctx.path, ctx.capture
        blocks = _token_blocks(ends, x.shape[0], experts)  # experts: saved when there is a bias
        if need_w2:
            doutq = _quantize_token_axis(dout, ends, blocks)
            dw2 = _mm_tokens(path, tuple(saved), doutq, ends, offs, blocks)  # GEMM 4
            if capture is not None:
                capture.update(doutq=doutq)
        if need_dh:
            dact = _grouped_mm(dout, w2.transpose(-2, -1), offs)  # GEMM 3, bf16
            dh = api.swiglu_backward_mx_quant_dual_axis(
                h, dact, ends, **ctx.glu_kwargs, weight=probs, backend=ctx.backend
            )
            if probs is not None:  # the operator's fifth output: dL/dprobs (spec 7.1)
                dprobs = dh[4].view(probs.shape) if need_probs else None
                dh = dh[:4]
            if capture is not None:
                capture.update(dact=dact, dh=dh)
            if need_x:
                w1q = quantize_mx_rowwise(w1)  # [E, d, 2H]: blocks along 2H
                dx = _mm_rows(path, dh[:2], w1q, ends, offs)  # GEMM 5
                if capture is not None:
                    capture.update(w1q=w1q)
            # dh's wgrad operand y2 dequantised, once for the emulated GEMM 6 and b1's gradient together
            dh2 = None
            if need_b1 or (need_w1 and path == "emulated"):
                dh2 = _dequantize_token_axis(dh[2], dh[3], blocks, ends)
            if need_w1:
                xq = _quantize_token_axis(x, ends, blocks)
                dw1 = _mm_tokens(path, xq, dh[2:], ends, offs, blocks, dh2)  # GEMM 6
                if capture is not None:
                    capture.update(xq=xq)
            if need_b1:  # b1 is W1's row for a constant-1 input: its gradient reads dh's wgrad operand y2
                db1 = _group_sums(dh2, experts, w1.shape[0])
        if capture is not None:
            capture.update(dout=dout, dx=dx, dw1=dw1, dw2=dw2, db1=db1, db2=db2, dprobs=dprobs)
        return dx, dw1, dw2, *([None] * 9), db1, db2, dprobs


def check_bf16(**tensors) -> None:
    """TypeError unless every named tensor is a bfloat16 ``torch.Tensor`` (checked in the given order): the
    expert MLP's operands (leave out an absent optional one)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_local(name, t)
        if t.dtype != _BF16:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")


def check_local(name: str, t) -> None:
    """TypeError for a DTensor operand of the expert MLP, which computes on each rank's local tensors."""
    if V.is_dtensor(t):
        raise TypeError(
            f"{name} is a DTensor: the expert MLP computes on each rank's local tensors; pass "
            f"{name}.to_local() (swiglu_ops.integrations.torchtitan.FusedGroupedExperts does so under "
            "expert and tensor parallelism)"
        )


def check_sizes(two_h: int, d: int) -> None:
    """ValueError unless the MX blocks of 32 divide the expert MLP's sizes: ``2H % 64 == 0`` (the hidden
    size H a multiple of 32) and ``d % 8 == 0`` (d_model)."""
    if two_h <= 0 or d <= 0 or two_h % 64 != 0 or d % 8 != 0:
        raise ValueError(
            f"hidden must be a multiple of 32 (2H of 64) and d_model of 8 (MX blocks of 32), got "
            f"2H = {two_h}, d_model = {d}"
        )


def _check(x, w1, w2, group_ends, limit, alpha, bias, interleaved, quantize, backend, gemm, b1, b2) -> None:
    check_bf16(x=x, w1=w1, w2=w2, **{n: t for n, t in (("b1", b1), ("b2", b2)) if t is not None})
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"expected x [T, d], w1 [E, d, 2H], w2 [E, H, d]; got {tuple(x.shape)}, {tuple(w1.shape)}, "
            f"{tuple(w2.shape)}"
        )
    e, d, two_h = w1.shape
    if e < 1:
        raise ValueError(f"w1 must hold at least one expert ([E, d, 2H] with E >= 1), got {tuple(w1.shape)}")
    if x.shape[1] != d or tuple(w2.shape) != (e, two_h // 2, d):
        raise ValueError(
            f"w1 [E, d, 2H] = {tuple(w1.shape)} needs x [T, {d}] and w2 [{e}, {two_h // 2}, {d}]; got "
            f"{tuple(x.shape)} and {tuple(w2.shape)}"
        )
    for name, t, shape in (("b1", b1, (e, two_h)), ("b2", b2, (e, d))):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (one row per expert), got {tuple(t.shape)}")
    check_sizes(two_h, d)
    check_expert_ends(group_ends, e)
    V.check_device(x, w1=w1, w2=w2, group_ends=group_ends, b1=b1, b2=b2)  # None skipped
    V.check_group_ends(group_ends, x.shape[0], "group_ends")  # values, where readable without a sync (CPU)
    V.mx_glu_params(True, interleaved, limit, alpha, bias)
    if not isinstance(quantize, bool):
        raise TypeError(f"quantize must be a bool, got {type(quantize).__name__}")
    check_options(backend, gemm)


def check_options(backend, gemm) -> None:
    """The expert MLP's ``backend`` (``"auto"`` or a backend's name) and ``gemm`` (one of ``GEMMS``), checked
    where they are given (a module's construction, a call), also in the bf16 mode that uses no MX GEMM."""
    check_backend_name(backend)
    if not isinstance(gemm, str) or gemm not in GEMMS:
        raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")


def check_expert_ends(group_ends, num_experts: int) -> None:
    """``group_ends``: int64/int32, 1-D, one cumulative token end per expert, a local tensor."""
    check_local("group_ends", group_ends)
    if not isinstance(group_ends, torch.Tensor) or group_ends.dtype not in (torch.int64, torch.int32):
        raise TypeError("group_ends must be an int64 or int32 tensor of cumulative token ends")
    if group_ends.dim() != 1 or group_ends.numel() != num_experts:
        raise ValueError(
            f"group_ends must be 1-D with one cumulative token end per expert ({num_experts}), got shape "
            f"{tuple(group_ends.shape)}"
        )


def mxfp8_expert_mlp(
    x,
    w1,
    w2,
    group_ends,
    *,
    limit=None,
    alpha=None,
    bias=None,
    interleaved=False,
    quantize=True,
    backend="auto",
    gemm="auto",
    capture: dict | None = None,
    b1=None,
    b2=None,
    probs=None,
):
    """``(SwiGLU(x @ w1[e] + b1[e]) * probs) @ w2[e] + b2[e]`` per expert, with the MXFP8 GEMMs of the module
    docstring.

    Args:
        x: ``[T, d]`` bf16, the tokens sorted by expert.
        w1: ``[E, d, 2H]`` bf16: gate | up (chunked halves), or interleaved gate/up columns with
            ``interleaved=True`` (GPT-OSS). ``2H % 64 == 0``, ``d % 8 == 0``.
        w2: ``[E, H, d]`` bf16.
        group_ends: ``[E]`` int64/int32 cumulative token ends (non-decreasing, last == T): expert e has rows
            ``[group_ends[e-1], group_ends[e])``; empty experts allowed. ``torch._grouped_mm``'s ``offs``
            are the same numbers (``counts.cumsum(0)``).
        limit, alpha, bias, interleaved: the GPT-OSS clipped SwiGLU (e.g. 7.0, 1.702, 1.0, True), passed to
            both fused operators; default CANN's plain SwiGLU ``silu(gate) * up``.
        quantize: False gives the bf16 baseline (same GEMMs and activation math, nothing quantised).
        backend: backend of the fused operators ("auto", "reference", "cpu", "triton").
        gemm: "auto", "emulated", "scaled_grouped_mm" or "scaled_mm" (module docstring).
        capture: a dict to receive the intermediate tensors (``h``, ``act``, ``w2q``, ``dact``, ``dh``,
            ``w1q``, ``xq``, ``doutq``, ``dout``, ``dx``, ``dw1``, ``dw2``, ``db1``, ``db2``, ``dprobs``,
            ``gemm``; a gradient not computed is None); eager mode only. The bf16 mode (``quantize=False``)
            has no quantised operands: ``h``, ``act``, ``dact``, ``dh``, ``dout`` and the gradients, with
            ``gemm`` "bf16".
        b1, b2: optional per-expert linear biases (GPT-OSS's ``gate_up_proj_bias`` / ``down_proj_bias``),
            ``[E, 2H]`` and ``[E, d]`` bf16 (b1 in w1's column order), each added to its GEMM's bf16 result
            and rounded (as Hugging Face's ``grouped_mm`` does). Gradients: per-expert sums in fp32, rounded
            once to bf16, of ``dout`` (bf16, unquantised) for b2 and of ``dh`` for b1; with
            ``quantize=True`` ``dh`` exists only quantised, and b1 (W1's row for a constant-1 input) reads
            the wgrad operand of GEMM 6, ``dh``'s token-axis MXFP8 ``y2``, dequantised.

        probs: the router's probability of every routed token row, fp32, numel T (``[T]`` or ``[T, 1]``), or
            None. It multiplies the activation inside the fused forward operator (the last fp32 operation of
            its stage 1), and its gradient is the fused backward operator's ``grad_weight``: the true
            dL/dprobs, ``sum_h dact * act16`` with ``act16`` the unweighted activation rounded to bf16. With
            ``quantize=False`` the same math, unfused.

    Returns:
        ``[T, d]`` bf16. Differentiable with respect to x, w1, w2, b1, b2 and probs (never group_ends); no
        double backward.
    """
    V.check_untransformed(dict(x=x, w1=w1, w2=w2, b1=b1, b2=b2, probs=probs))
    _check(x, w1, w2, group_ends, limit, alpha, bias, interleaved, quantize, backend, gemm, b1, b2)
    check_backend_for(backend, x)
    if capture is not None and not isinstance(capture, dict):
        raise TypeError(f"capture must be a dict or None, got {type(capture).__name__}")
    check_local("probs", probs)
    V.check_weight(probs, x, x.shape[0], name="probs")
    return _ExpertMLPFunction.apply(
        x.contiguous(),  # any layout: the GEMMs and the MX operators read rows
        w1,
        w2,
        group_ends,
        limit,
        alpha,
        bias,
        interleaved,
        quantize,
        backend,
        gemm,
        capture,
        b1,
        b2,
        probs,
    )


class MXFP8ExpertMLP(torch.nn.Module):
    """The expert MLPs of an MoE layer (``E`` experts, ``d_model -> 2H -> d_model``) on the fused MX SwiGLU
    operators and MXFP8 GEMMs (:func:`mxfp8_expert_mlp`; which operand is MXFP8 where: the module docstring
    of :mod:`swiglu_ops.training.expert_mlp`).

    Parameters ``w1 [E, d, 2H]`` (gate | up, or interleaved for GPT-OSS) and ``w2 [E, H, d]``, kept in
    ``dtype`` (fp32 master weights by default) and cast to bf16 in ``forward``. ``forward(x, group_ends)``
    takes the tokens sorted by expert (any float dtype, cast to bf16) and the cumulative token ends per
    expert; it returns ``[T, d]`` bf16. ``MXFP8ExpertMLP(..., limit=7.0, alpha=1.702, bias=1.0,
    interleaved=True)`` is GPT-OSS's expert MLP (without its linear biases); ``quantize=False`` the bf16
    baseline.
    """

    def __init__(
        self,
        num_experts: int,
        d_model: int,
        hidden: int,
        *,
        limit: float | None = None,
        alpha: float | None = None,
        bias: float | None = None,
        interleaved: bool = False,
        quantize: bool = True,
        backend: str = "auto",
        gemm: str = "auto",
        device=None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        for name, value in (("num_experts", num_experts), ("d_model", d_model), ("hidden", hidden)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        num_experts, d_model, hidden = int(num_experts), int(d_model), int(hidden)
        check_sizes(2 * hidden, d_model)  # errors here, naming the argument
        V.mx_glu_params(True, interleaved, limit, alpha, bias)
        if not isinstance(quantize, bool):
            raise TypeError(f"quantize must be a bool, got {type(quantize).__name__}")
        check_options(backend, gemm)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype (of the master weights) must be a floating dtype, got {dtype!r}")
        kw = dict(device=device, dtype=dtype)
        self.w1 = torch.nn.Parameter(torch.empty(num_experts, d_model, 2 * hidden, **kw))
        self.w2 = torch.nn.Parameter(torch.empty(num_experts, hidden, d_model, **kw))
        self.limit, self.alpha, self.bias, self.interleaved = limit, alpha, bias, interleaved
        self.quantize, self.backend, self.gemm = quantize, backend, gemm
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``N(0, 1 / fan_in)`` weights (fan_in = d for w1, H for w2)."""
        with torch.no_grad():
            self.w1.normal_(0.0, 1.0 / math.sqrt(self.w1.shape[1]))
            self.w2.normal_(0.0, 1.0 / math.sqrt(self.w2.shape[1]))

    def forward(
        self, x: torch.Tensor, group_ends: torch.Tensor, probs: torch.Tensor | None = None, *,
        capture: dict | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """``x [T, d]`` sorted by expert (any float dtype, cast to bf16), ``group_ends`` their cumulative
        ends, ``probs`` (numel T, or None) the router's probability of every row, applied inside the fused
        forward operator in fp32 (a bf16 or fp16 ``probs``, e.g. cast by FSDP2's mixed-precision policy,
        is widened exactly); returns ``[T, d]`` bf16 (``probs.grad`` from the fused backward operator's
        ``grad_weight``)."""
        for name, t in (("x", x), ("probs", probs)):
            if t is not None and not (isinstance(t, torch.Tensor) and t.is_floating_point()):
                what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"{name} must be a floating-point torch.Tensor, got {what}")
        if probs is not None and probs.dtype in (_BF16, torch.float16):
            probs = probs.float()
        return mxfp8_expert_mlp(
            x.to(_BF16), self.w1.to(_BF16), self.w2.to(_BF16), group_ends, limit=self.limit,
            alpha=self.alpha, bias=self.bias, interleaved=self.interleaved, quantize=self.quantize,
            backend=self.backend, gemm=self.gemm, capture=capture, probs=probs,
        )  # fmt: skip

    def extra_repr(self) -> str:
        e, d, two_h = self.w1.shape
        glu = "" if self.limit is None else f", limit={self.limit}, alpha={self.alpha}, bias={self.bias}"
        return (
            f"experts={e}, d_model={d}, hidden={two_h // 2}{glu}, interleaved={self.interleaved}, "
            f"quantize={self.quantize}, backend={self.backend!r}, gemm={self.gemm!r}"
        )


# ------------------------------------------------------------------------------------ float64 reference


def expert_mlp_reference(
    x, w1, w2, group_ends, *, limit=None, alpha=None, bias=None, interleaved=False, b1=None, b2=None,
    probs=None,
):  # fmt: skip
    """The same expert MLP as plain differentiable torch ops in the inputs' dtype (use float64): no
    quantisation, no intermediate rounding. GPT-OSS: ``min(g, L) * sigmoid(alpha * min(g, L)) *
    (clip(u, -L, L) + bias)``, with its linear biases ``b1``/``b2`` and the router's ``probs`` (one per row,
    multiplying the activation) when given. For checks and the demo."""
    outs = []
    for g, (s, e) in enumerate(_ranges(group_ends)):
        h = x[s:e] @ w1[g] + (0.0 if b1 is None else b1[g])
        gate, up = (h[:, ::2], h[:, 1::2]) if interleaved else h.chunk(2, dim=-1)
        if limit is None:
            act = torch.nn.functional.silu(gate) * up
        else:
            gate = gate.clamp(max=limit)
            act = gate * torch.sigmoid(alpha * gate) * (up.clamp(-limit, limit) + bias)
        if probs is not None:
            act = act * probs.reshape(-1, 1)[s:e]
        outs.append(act @ w2[g] + (0.0 if b2 is None else b2[g]))
    return torch.cat([x.new_zeros(0, w2.shape[-1]), *outs])
