"""The Triton kernels: the GLU family written once (spec README 6.2), as shared ``@triton.jit`` pieces that
four kernels assemble, one per kind of output:

- ``clipped_swiglu_kernel``: ClippedSwiglu and ClippedSwigluGrad (constexpr ``BACKWARD``), stored rounded;
- ``swiglu_group_grad_kernel``: SwigluGroupGrad (row-streaming, routing weight, grad_weight);
- ``swiglu_mx_quant_kernel``: SwigluMxQuantWithDualAxis (forward, FP8/FP4 dual-axis MX);
- ``swiglu_bwd_mx_quant_kernel``: SwigluBackwardMxQuantWithDualAxis (backward, FP8 dual-axis MX).

The pieces, mirroring the C backend (``cpu/csrc/glu.h``, ``mx.h``, ``numerics.h``):

- the math, one functor per direction in each CANN operator's operation order (``_glu_fwd``,
  ``_glu_bwd``: plain SwiGLU, clipped SwiGLU clamp_mode 0 / 1; ``_group_grad_fn``), built on the activations
  of A alone (``_silu``, ``_sigmoid``); ``swiglu_ops.reference.glu`` is the readable version;
- the layout: ``_load_pairs`` / ``_store_pairs`` / ``_interleave_ab`` take A and B from a row's two halves or
  its even/odd elements (constexpr ``INTERLEAVED``), A being the first or the second (runtime ``a_index``);
- the MX quantisation of a tile of 32 rows x 32-column blocks along both axes (``_mx_row_block``,
  ``_mx_quantize``: scale codes, element codes, FP4 nibble packing), shared by both MX kernels; the FP8 and
  FP4 element encoders are one integer transcription of ``mx.encode`` (``_elem_code_int``).

Every numeric rule mirrors :mod:`swiglu_ops.mx` and the reference backend, written so that it computes the
same bits on a GPU and under ``TRITON_INTERPRET=1``:

- Roundings are correctly rounded conversions. On the GPU, with ``HW_CVT``, they are single PTX
  instructions: ``rcp.rn.f32`` for the sigmoids' reciprocals, ``cvt.rn.bf16x2.f32`` for bf16,
  ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` for the FP8 codes (NaN blocks are zeroed before the cast: the
  hardware would give 0x7F where the contract wants 0x00). By default, and always in the interpreter (no
  inline asm; its fp32->bf16 / fp8 casts truncate), the same rules run as integer arithmetic on IEEE bit
  patterns (and ``div_rn``). The two paths differ only in NaN payloads of bf16 values, which the contract
  does not compare. FP4 codes have no hardware path (PTX has no floor / ties-away FP4 conversion).
- Divisions (the forward activations ``a / (exp(-a) + 1)``) are ``div_rn`` (``div.rn.f32``) in both paths.
- E8M0 codes are integer arithmetic on the amax bits in both modes.
- The only other floating-point operations are the spec's fp32 multiplies/adds in the spec's order
  (launched with ``enable_fp_fusion=False``, so neither LLVM nor ptxas contracts them into FMAs), NaN-
  propagating min/max for the clamps, ``exp`` and the exact scaling multiply of the MX rule
  (``amax * fp32(1/max)``, ``v * 2**(127 - E)``).
- ``exp`` is libdevice's ``__nv_expf`` on the GPU (at most 2 ulp from the correctly rounded value; ``tl.exp``
  would be ``ex2.approx`` of an already rounded ``x * log2(e)``, whose error grows with ``|x|``). The
  interpreter does not implement libdevice and runs NumPy's ``exp``.
- All offsets are int64; no kernel needs anything from the host but shapes (and pointer alignment).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

#: Kernels are built for the interpreter when ``TRITON_INTERPRET=1`` is set at import time (Triton reads it
#: when ``@triton.jit`` runs); libdevice has no interpreter implementation.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_LIBDEVICE_EXP = tl.constexpr(not INTERPRETED)
# ``HW_CVT`` (a launch-time constexpr, ``swiglu_ops.triton.HW_CONVERSIONS``): on the GPU, the correctly
# rounded conversions as single PTX instructions (``rcp.rn.f32``, ``cvt.rn.bf16x2.f32``,
# ``cvt.rn.satfinite.e4m3x2.f32``) instead of their integer transcriptions. The interpreter has no inline
# asm and its fp32->bf16 cast truncates, so it always runs the integer transcriptions.

#: Rows of one column-wise MX block (and of the dual-axis tile), columns of one row-wise block.
MX_BLOCK = tl.constexpr(32)

#: Element round modes (constexpr ``ROUND``), by ``swiglu_ops.mx.ROUND_MODES`` name: ties to even, ties away
#: from zero, towards -inf on the signed value. FP8 is always ``RINT``.
ROUND_RINT = tl.constexpr(0)
ROUND_HALF_AWAY = tl.constexpr(1)
ROUND_FLOOR = tl.constexpr(2)
ROUND_MODES = {"rint": 0, "round": 1, "floor": 2}


# --------------------------------------------------------------------------------- numeric helpers


@triton.jit
def _exp(v):
    if _LIBDEVICE_EXP:
        return libdevice.exp(v)
    else:
        return tl.exp(v)


@triton.jit
def _recip_rn(v, HW_CVT: tl.constexpr):
    """``1 / v`` correctly rounded (IEEE round-to-nearest-even), the value of ``div_rn(1, v)``.

    GPU: ``rcp.rn.f32`` (no ftz: subnormal results, 0, inf and NaN as IEEE). ptxas expands it to
    ``MUFU.RCP`` + a two-FFMA Newton step, with a branch to a slow path only for operands whose reciprocal
    is subnormal or special; ``div.rn`` of a general numerator adds ``FCHK`` and a longer fix-up. (A
    hand-written fast path with a predicated ``rcp.rn`` fallback compiled to more instructions: ptxas
    keeps its whole expansion.) Interpreter: ``div_rn``, the same correctly rounded value.
    """
    if HW_CVT:
        return tl.inline_asm_elementwise(
            "rcp.rn.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.math.div_rn(1.0, v)


@triton.jit
def _div_rn(n, d):
    """``n / d`` correctly rounded (``div.rn.f32``; a plain ``/`` would be the approximate ``div.full``)."""
    return tl.math.div_rn(n, d)


@triton.jit
def _min_nan(v, hi):
    """``min(v, hi)``, NaN-propagating (``torch.minimum``; one ``min.NaN`` on sm_80+)."""
    return tl.minimum(v, hi, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _clip(v, limit):
    """``max(min(v, L), -L)``, NaN-propagating (L > 0)."""
    return tl.clamp(v, -limit, limit, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _widen(v):
    """Exact widening to fp32. bf16 goes through its bits (the interpreter mis-converts bf16 subnormals)."""
    if v.dtype == tl.bfloat16:
        return (v.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return v.to(tl.float32)


@triton.jit
def _bf16_bits_rne(v):
    """fp32 -> bf16 bit pattern (int32 in [0, 0xFFFF]), round-to-nearest-even, overflow -> inf, NaN kept."""
    bits = v.to(tl.int32, bitcast=True)
    sign = bits & -0x80000000
    mag = bits & 0x7FFFFFFF
    rounded = (mag + 0x7FFF + ((mag >> 16) & 1)) >> 16
    rounded = tl.where(mag > 0x7F800000, 0x7FC0, rounded)
    return rounded | ((sign >> 16) & 0x8000)


@triton.jit
def _to_bf16(v, HW_CVT: tl.constexpr):
    """fp32 -> bf16, round-to-nearest-even, overflow -> inf. On the GPU one ``cvt.rn.bf16x2.f32`` per two
    elements (NaN -> the canonical NaN 0x7FFF; the contract compares NaN positions, not payloads); in the
    interpreter the integer rounding (NaN -> 0x7FC0 with its sign)."""
    if HW_CVT:
        return v.to(tl.bfloat16, fp_downcast_rounding="rtne")
    else:
        return _bf16_bits_rne(v).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _narrow(v, DTYPE: tl.constexpr, HW_CVT: tl.constexpr):
    """fp32 ``v`` rounded to ``DTYPE`` (RNE, no saturation: fp16 overflow is inf)."""
    if DTYPE == tl.bfloat16:
        return _to_bf16(v, HW_CVT)
    else:
        return v.to(DTYPE)


@triton.jit
def _round_to_dtype(v, DTYPE: tl.constexpr, HW_CVT: tl.constexpr):
    """fp32 ``v`` rounded to ``DTYPE`` (RNE, no saturation) and widened back to fp32 (exactly)."""
    if DTYPE == tl.float32:
        return v
    elif DTYPE == tl.bfloat16 and not HW_CVT:
        return (_bf16_bits_rne(v) << 16).to(tl.float32, bitcast=True)
    else:
        return _widen(_narrow(v, DTYPE, HW_CVT))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


# ----------------------------------------------------------------------- the GLU family: the math


@triton.jit
def _sigmoid(v, HW_CVT: tl.constexpr):
    """``1 / (1 + exp(-v))`` with an IEEE (correctly rounded) division: the backward's activation."""
    return _recip_rn(1.0 + _exp(-v), HW_CVT)


@triton.jit
def _silu(a):
    """SiLU in the forward operators' order, ``a / (exp(a * -1) + 1)`` (a division, no sigmoid formed)."""
    return _div_rn(a, _exp(a * -1.0) + 1.0)


@triton.jit
def _glu_fwd(a, b, alpha, limit, bias, CLIPPED: tl.constexpr, MODE: tl.constexpr):
    """The forward's fp32 result from the widened halves (``reference.glu.forward``):

    - plain SwiGLU (SwigluMxQuantWithDualAxis 2.2): ``(a / (exp(a * -1) + 1)) * b``;
    - clipped, clamp_mode 0 (ClippedSwiglu 3.1): ``A~ = min(a, L)``,
      ``(A~ / (exp(A~ * -alpha) + 1)) * (clip(b, L) + bias)``;
    - clipped, clamp_mode 1 (3.2): ``min(a / (exp(a * -1) + 1), L) * clip(b, L)``.
    """
    if not CLIPPED:
        y = _silu(a) * b
    elif MODE == 0:
        at = _min_nan(a, limit)
        y = _div_rn(at, _exp(at * -alpha) + 1.0) * (_clip(b, limit) + bias)
    else:
        y = _min_nan(_silu(a), limit) * _clip(b, limit)
    return y


@triton.jit
def _glu_bwd(a, b, dy, alpha, limit, bias, CLIPPED: tl.constexpr, MODE: tl.constexpr, HW_CVT: tl.constexpr):
    """``(grad_a, grad_b)`` in fp32 from the widened halves and dy (``reference.glu.backward``):

    - plain SwiGLU (SwigluBackwardMxQuantWithDualAxis 2.2): ``s = 1 / (1 + exp(-a))``,
      ``t = ((-s) + 1) * a + 1``, ``(((t * b) * s) * dy, (s * dy) * a)``;
    - clipped, clamp_mode 0 (ClippedSwigluGrad, clipped_swiglu.md 4) and the clamp_mode-1 extension
      (section 10): closed masks on the raw inputs, applied by a select (a masked position is +0.0).
    """
    if not CLIPPED:
        s = _sigmoid(a, HW_CVT)
        t = ((-s) + 1.0) * a + 1.0
        da = ((t * b) * s) * dy
        db = (s * dy) * a
    else:
        if MODE == 0:
            at = _min_nan(a, limit)
            # s = (A~ * 0 + 1) / (exp(A~ * -alpha) + 1): the numerator is exactly 1 (NaN for an infinite or
            # NaN A~), so its product with the correctly rounded reciprocal is that same IEEE quotient.
            s = (at * 0.0 + 1.0) * _recip_rn(_exp(at * -alpha) + 1.0, HW_CVT)
            db = (dy * at) * s
            t = (s * -1.0) + 1.0
            t = ((((t * at) * alpha) + 1.0) * s) * (_clip(b, limit) + bias)
            da = t * dy
            a_ok = a <= limit
        else:
            den = _exp(a * -1.0) + 1.0
            silu = _div_rn(a, den)
            s = _recip_rn(den, HW_CVT)
            db = dy * _min_nan(silu, limit)
            t = ((((s * -1.0) + 1.0) * a + 1.0) * s) * _clip(b, limit)
            da = t * dy
            a_ok = silu <= limit
        da = tl.where(a_ok, da, 0.0)
        db = tl.where((b <= limit) & (b >= -limit), db, 0.0)
    return da, db


@triton.jit
def _group_grad_fn(
    dy, g, u, w, m_r, clamp, hi, has_clamp, HAS_WEIGHT: tl.constexpr, HAS_MASK: tl.constexpr,
    HW_CVT: tl.constexpr,
):  # fmt: skip
    """SwigluGroupGrad (swiglu_group_grad.md 3) in its operation order: ``(grad_gate, grad_up)``.

    Open-interval masks from the raw inputs, **multiplied** (a mask of 1.0 is bit-identical to skipping the
    multiply, so the clamp is a runtime argument: ``has_clamp``, ``hi`` = clamp or +inf), the routing weight
    ``w`` and the row mask ``m_r`` multiplied too (a masked inf/NaN stays NaN).
    """
    m_g = tl.where(has_clamp & ~(g < clamp), 0.0, 1.0)
    m_u = tl.where(has_clamp & ~(tl.abs(u) < clamp), 0.0, 1.0)
    # NaN-propagating min/max against [lo, hi] (+-inf without clamp): one min.NaN/max.NaN each on sm_80+.
    g = _min_nan(g, hi)
    u = _clip(u, hi)
    s = _sigmoid(g, HW_CVT)
    f = tl.where(g == float("-inf"), 0.0, g * s)
    # g = -inf: s = 1/(1 + inf) = +0 and f = 0, so sp = (0 + 0) - 0 = +0 already; only +inf needs a fix.
    sp = tl.where(g == float("inf"), 1.0, (s + f) - (f * s))
    dg = (dy * sp) * u
    du = dy * f
    if HAS_WEIGHT:
        dg = dg * w
        du = du * w
    dg = dg * m_g
    du = du * m_u
    if HAS_MASK:
        dg = dg * m_r
        du = du * m_r
    return dg, du


# --------------------------------------------------------------------- the GLU family: the layout


@triton.jit
def _load_pairs(ptr, row_off, jb, rows_ok, half, a_index, K: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The stored A and B elements of the pairs ``jb + [0, K)`` of rows of ``2 * half`` elements that start
    at element ``row_off``; pairs past ``half`` and rows not ``rows_ok`` load zeros.

    Chunked: A and B are the two halves (A the left one for ``a_index`` 0). Interleaved: A and B are the
    even and odd elements (A the even one for ``a_index`` 0), two loads of stride 2 whose warps touch the
    same sectors. (One contiguous load split in registers vectorises, but its layout differs from dy's and
    the outputs': the layout conversions through shared memory cost more registers than the scalar
    loads, 146 instead of 91 in the fp32 MX backward.) ``row_off``, ``jb`` and ``rows_ok`` broadcast
    against ``[K]``; ``a_index`` may be a runtime value.
    """
    j = jb + tl.arange(0, K)
    mask = rows_ok & (j < half)
    if INTERLEAVED:
        offs = row_off + 2 * j
        a_off = a_index
        b_off = 1 - a_index
    else:
        offs = row_off + j
        a_off = a_index * half
        b_off = (1 - a_index) * half
    a = tl.load(ptr + offs + a_off, mask=mask, other=0.0)
    b = tl.load(ptr + offs + b_off, mask=mask, other=0.0)
    return a, b


@triton.jit
def _interleave_ab(va, vb, a_index):
    """A's and B's values (``[..., K]``) at their interleaved positions (``[..., 2K]``): pair k at 2k and
    2k + 1, A first for ``a_index`` 0."""
    a_first = a_index == 0
    return tl.interleave(tl.where(a_first, va, vb), tl.where(a_first, vb, va))


@triton.jit
def _store_pairs(
    ptr, row_off, jb, rows_ok, half, a_index, va, vb, K: tl.constexpr, INTERLEAVED: tl.constexpr,
    HW_CVT: tl.constexpr,
):  # fmt: skip
    """Stores A's and B's fp32 results, rounded to the output dtype, at the columns ``_load_pairs`` read."""
    DTYPE: tl.constexpr = ptr.dtype.element_ty
    j = jb + tl.arange(0, K)
    mask = rows_ok & (j < half)
    if INTERLEAVED:
        offs = row_off + 2 * j
        a_off = a_index
        b_off = 1 - a_index
    else:
        offs = row_off + j
        a_off = a_index * half
        b_off = (1 - a_index) * half
    tl.store(ptr + offs + a_off, _narrow(va, DTYPE, HW_CVT), mask=mask)
    tl.store(ptr + offs + b_off, _narrow(vb, DTYPE, HW_CVT), mask=mask)


# ---------------------------------------------------------- ClippedSwiglu / ClippedSwigluGrad


@triton.jit(do_not_specialize=["rows", "n_chunks", "a_index"])
def clipped_swiglu_kernel(
    x_ptr, dy_ptr, valid_ptr, out_ptr,
    rows, half, n_chunks, a_index, alpha, limit, bias,
    BACKWARD: tl.constexpr, INTERLEAVED: tl.constexpr, MODE: tl.constexpr, HAS_MASK: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """``ROWS`` rows x ``BLOCK`` pairs of ClippedSwiglu (y = the forward, rounded) or, with ``BACKWARD``,
    ClippedSwigluGrad (grad_x at x's positions). Program ``pid`` takes row tile ``pid // n_chunks`` and pair
    chunk ``pid % n_chunks``. Rows at or past ``valid_rows`` are not loaded and are written as +0.0."""
    pid = tl.program_id(0)
    r = (pid // n_chunks).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    p0 = (pid % n_chunks).to(tl.int64) * BLOCK
    row_ok = r < rows
    if HAS_MASK:
        live = row_ok & (r < tl.load(valid_ptr))
    else:
        live = row_ok
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    x_row = r * 2 * half  # int64 (a single row may hold 2**31 elements or more)
    a_raw, b_raw = _load_pairs(x_ptr, x_row, p0, live, half, a_index, BLOCK, INTERLEAVED)
    a = _widen(a_raw)
    b = _widen(b_raw)
    j = p0 + tl.arange(0, BLOCK)
    if BACKWARD:
        dy = _widen(tl.load(dy_ptr + r * half + j, mask=live & (j < half), other=0.0))
        da, db = _glu_bwd(a, b, dy, alpha, limit, bias, True, MODE, HW_CVT)
        if HAS_MASK:
            da = tl.where(live, da, 0.0)
            db = tl.where(live, db, 0.0)
        _store_pairs(out_ptr, x_row, p0, row_ok, half, a_index, da, db, BLOCK, INTERLEAVED, HW_CVT)
    else:
        y = _glu_fwd(a, b, alpha, limit, bias, True, MODE)
        if HAS_MASK:
            y = tl.where(live, y, 0.0)
        tl.store(out_ptr + r * half + j, _narrow(y, DTYPE, HW_CVT), mask=row_ok & (j < half))


# ---------------------------------------------------------------------------------- swiglu_group_grad


@triton.jit
def _group_grad_loads(
    dy_ptr, x_ptr, yo_ptr, r, row_ok, h0, hidden, BLOCK_H: tl.constexpr, HAS_WEIGHT: tl.constexpr
):
    """The raw (16-bit or fp32) inputs of one ``[ROWS, BLOCK_H]`` chunk: dy, gate, up and y_origin (dy again
    without weight). Out-of-range columns and rows load zeros and are never stored."""
    h = h0 + tl.arange(0, BLOCK_H)
    rows_ok = row_ok[:, None]
    offs = r[:, None] * hidden + h[None, :]
    dy = tl.load(dy_ptr + offs, mask=rows_ok & (h < hidden)[None, :], other=0.0)
    g, u = _load_pairs(x_ptr, r[:, None] * (2 * hidden), h0, rows_ok, hidden, 0, BLOCK_H, False)
    if HAS_WEIGHT:
        yo = tl.load(yo_ptr + offs, mask=rows_ok & (h < hidden)[None, :], other=0.0)
    else:
        yo = dy
    return dy, g, u, yo


@triton.jit(do_not_specialize=["rows"])
def swiglu_group_grad_kernel(
    dy_ptr, x_ptr, w_ptr, yo_ptr, valid_ptr, gx_ptr, gw_ptr,
    rows, hidden, clamp,
    HAS_WEIGHT: tl.constexpr, HAS_MASK: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
    PREFETCH: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """grad_x (and grad_weight) of ``ROWS`` rows, streaming over the hidden dim in ``BLOCK_H`` chunks.

    ``_group_grad_fn`` per chunk; grad_weight is the fp32 sum of the ``dy * y_origin`` products: a fixed
    tree inside each chunk, chunks added in order (deterministic; not NumPy's pairwise order, see
    docs/triton_backend.md).

    All four loads of a chunk are issued before its math. With ``PREFETCH`` the loads of chunk k + 1 are
    issued before the math of chunk k (register double buffering: twice the bytes in flight per warp, for
    about 16 more registers with 16-bit inputs).
    """
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = r < rows
    has_clamp = clamp > 0.0
    hi = tl.where(has_clamp, clamp, float("inf"))
    w = 1.0
    m_r = 1.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + r, mask=row_ok, other=0.0)[:, None]
        gw = tl.zeros([ROWS], dtype=tl.float32)
    if HAS_MASK:
        m_r = tl.where(r < tl.load(valid_ptr), 1.0, 0.0)[:, None]
    if PREFETCH:
        n_dy, n_g, n_u, n_yo = _group_grad_loads(
            dy_ptr, x_ptr, yo_ptr, r, row_ok, 0, hidden, BLOCK_H, HAS_WEIGHT
        )
    for h0 in range(0, hidden, BLOCK_H):
        if PREFETCH:
            raw_dy, raw_g, raw_u, raw_yo = n_dy, n_g, n_u, n_yo
            n_dy, n_g, n_u, n_yo = _group_grad_loads(
                dy_ptr, x_ptr, yo_ptr, r, row_ok, h0 + BLOCK_H, hidden, BLOCK_H, HAS_WEIGHT
            )
        else:
            raw_dy, raw_g, raw_u, raw_yo = _group_grad_loads(
                dy_ptr, x_ptr, yo_ptr, r, row_ok, h0, hidden, BLOCK_H, HAS_WEIGHT
            )
        dy = _widen(raw_dy)
        dg, du = _group_grad_fn(
            dy, _widen(raw_g), _widen(raw_u), w, m_r, clamp, hi, has_clamp, HAS_WEIGHT, HAS_MASK, HW_CVT
        )
        _store_pairs(
            gx_ptr, r[:, None] * (2 * hidden), h0, row_ok[:, None], hidden, 0, dg, du, BLOCK_H, False, HW_CVT
        )
        if HAS_WEIGHT:
            gw += tl.sum(dy * _widen(raw_yo), axis=1)
    if HAS_WEIGHT:
        tl.store(gw_ptr + r, 0.0 + gw, mask=row_ok)


# ------------------------------------------------------------------ MX quantisation (both MX kernels)


@triton.jit
def _scale_code(amax, inv_max, emax, SCALE_ALG: tl.constexpr, FP4: tl.constexpr):
    """E8M0 code (int32) and fp32 element multiplier from block amax fp32 bits: ``mx.scale_codes`` and
    ``mx.scale_reciprocal`` (SCALE_ALG 1 = RCEIL, 0 = OCP floor), specialised per rule.

    The multiplier of a NaN/inf block (code 0xFF) is not used: :func:`_mx_codes` writes 0x00 there. For a
    zero block every element is +-0 and any finite multiplier keeps it +-0, so ``2**(127 - code)`` serves.
    The multiplier ``2**(127 - code)`` is ``(254 - code) << 23`` for codes below 254; code 254 has the
    subnormal multiplier 2**-127 (bits 0x00400000). Only FP4 E1M2 (emax 0, OCP) reaches it, with amax in
    [2**127, 2**128); FP8 codes stay below 254 (RCEIL: amax <= 2**128 and ``inv_max`` < 2**-8; OCP:
    ``Ef - emax`` <= 246).
    """
    finite = amax < 0x7F800000
    if SCALE_ALG == 1:
        # RCEIL: the biased exponent of p = amax * fp32(1/max), rounded up when p's fraction is non-zero
        # ((p + 0x7FFFFF) >> 23 for a normal p); a subnormal p rounds up to code 1 only above 2**-127.
        p = (amax.to(tl.float32, bitcast=True) * inv_max).to(tl.int32, bitcast=True)
        code = tl.where(p < 0x800000, (p > 0x400000).to(tl.int32), (p + 0x7FFFFF) >> 23)
        recip = (254 - code) << 23
    else:
        # OCP floor: max(Ef - emax, 0); amax zero or fp32-subnormal (Ef == 0) is a zero block: multiplier 0.
        ef = amax >> 23
        code = tl.maximum(ef - emax, 0)
        recip = (254 - code) << 23
        if FP4:
            recip = tl.where(code >= 254, 0x00400000, recip)
        recip = tl.where(ef == 0, 0, recip)
    return tl.where(finite, code, 0xFF), recip.to(tl.float32, bitcast=True)


@triton.jit
def _elem_code_int(t, mbits, bias, max_code, FP4: tl.constexpr, ROUND: tl.constexpr):
    """``mx.encode`` of fp32 ``t`` into an FP8 or FP4 element code (int32; FP4: a nibble, sign 0x8):
    ``t`` rounded on the format's grid (quantum ``2**(max(e, emin) - mbits)``) by ``ROUND`` (FP8: RINT),
    finite magnitudes past the largest code saturate, the sign bit is t's (-0 and negative values that
    round to 0 keep it), NaN -> 0. Integer arithmetic on the IEEE bits, so exact for every fp32 ``t``."""
    bits = t.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    exp_field = a >> 23
    normal32 = exp_field > 0
    mant = (a & 0x7FFFFF) | tl.where(normal32, 0x800000, 0)
    e = tl.where(normal32, exp_field - 127, -126)
    emin = 1 - bias
    shift = tl.minimum(tl.maximum(tl.maximum(e, emin) - mbits - (e - 23), 0), 30)
    q = mant >> shift
    rem = mant - (q << shift)
    half = tl.where(shift > 0, 1 << tl.maximum(shift - 1, 0), 0)
    if ROUND == ROUND_RINT:
        up = (rem > half) | ((rem == half) & (shift > 0) & ((q & 1) == 1))
    elif ROUND == ROUND_HALF_AWAY:
        up = (rem >= half) & (shift > 0)
    else:  # floor of the signed value: a negative value with a remainder moves its magnitude up
        up = (bits < 0) & (rem > 0)
    q += up.to(tl.int32)
    code = tl.where(e >= emin, ((e + bias - 1) << mbits) + q, q)
    code = tl.minimum(code, max_code)
    if FP4:
        sign = (bits >> 28) & 0x8
    else:
        sign = (bits >> 24) & 0x80
    return tl.where(a > 0x7F800000, 0, code | sign)


def _cvt_fp8x4_asm(fmt: str) -> tl.constexpr:
    """PTX converting four fp32 values ($1..$4) to FP8 codes packed into one 32-bit register ($0), value
    $1 in the lowest byte: each ``cvt ... d, a, b`` puts ``a`` in the upper and ``b`` in the lower byte, and
    ``mov.b32 $0, {lo, hi}`` puts ``lo`` in the lower half."""
    cvt = f"cvt.rn.satfinite.{fmt}x2.f32"
    body = f"{cvt} lo, $2, $1;\n{cvt} hi, $4, $3;\nmov.b32 $0, {{lo, hi}};"
    return tl.constexpr("{ .reg .b16 lo, hi;\n" + body + " }")


_CVT_E4M3X4 = _cvt_fp8x4_asm("e4m3")
_CVT_E5M2X4 = _cvt_fp8x4_asm("e5m2")


@triton.jit
def _cvt_fp8x4(q, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,r,r,r,r", [q], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def _mx_codes(
    v, recip, nonfinite, mbits, bias, max_code, FP4: tl.constexpr, E5M2: tl.constexpr, ROUND: tl.constexpr,
    HW_CVT: tl.constexpr,
):  # fmt: skip
    """Element codes of ``v * recip``, the element rule of ``mx.quantize_blocks``: ``mx.encode`` of the exact
    product, and 0 for every element of a NaN/inf block (``nonfinite``, where recip is NaN). FP8: uint8
    codes; FP4: int32 nibbles (packed by :func:`_store_codes`).

    The fp32 product is exact unless it underflows, far below every format's smallest step: the codes are
    the same, except under FP4 ``floor`` where a negative ``v`` whose product underflows to -0 still gives
    -q (0x9), unless the block's multiplier is 0 (a zero block: +-0) or the block is not finite (0).

    FP8 on the GPU with ``HW_CVT``: ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``, four elements per asm block packed
    into one 32-bit register. For non-NaN inputs it is exactly the encode's rule: IEEE RNE into the format
    (subnormals included, no flush: an fp32 subnormal rounds to a signed zero either way), the sign of zero
    kept, magnitudes past the largest finite (and +-inf) saturate to +-max. It turns NaN into 0x7F/0xFF,
    but a NaN product only comes from a non-finite block (finite block: finite ``v`` times a finite power
    of two), and those elements are replaced by +0.0 before the cast (in both paths), which encodes as
    0x00. Otherwise (and in the interpreter) the integer transcription of ``mx.encode``.
    """
    q = tl.where(nonfinite, 0.0, v * recip)
    if FP4:
        code = _elem_code_int(q, mbits, bias, max_code, True, ROUND)
        if ROUND == ROUND_FLOOR:
            code = tl.where((q == 0.0) & (v < 0.0) & (recip > 0.0) & ~nonfinite, 0x9, code)
    elif HW_CVT:
        if E5M2:
            code = _cvt_fp8x4(q, _CVT_E5M2X4)
        else:
            code = _cvt_fp8x4(q, _CVT_E4M3X4)
    else:
        code = _elem_code_int(q, mbits, bias, max_code, False, ROUND_RINT).to(tl.uint8)
    return code


@triton.jit
def _store_codes(ptr, codes, mask, FP4: tl.constexpr):
    """Stores element codes ``[R, NB, 32]`` (32-column blocks). FP8: a byte each, at ``ptr`` ``[R, NB, 32]``.
    FP4: two per byte, element 2j in bits 3:0, at ``ptr`` ``[R, NB, 16]`` (one per byte)."""
    if FP4:
        lo, hi = tl.split(tl.reshape(codes, codes.shape[:-1] + [MX_BLOCK // 2, 2]))
        tl.store(ptr, (lo | (hi << 4)).to(tl.uint8), mask=mask)
    else:
        tl.store(ptr, codes, mask=mask)


@triton.jit
def _mx_row_block(ends_ptr, m, num_groups, blocks_per_slice, s2_rows, width, GROUPED: tl.constexpr,
                  GROUP_CHUNK: tl.constexpr):  # fmt: skip
    """The 32-row block of this program (axis 0: batch slice x row-block), shared by both MX kernels.

    Returns ``(row, rows_ok, live, first, s2_base, s2_cols, nonempty)``: the flattened [B*M] rows ``[32, 1]``
    of the block, which of them exist (are stored), which are loaded (rows of a group; the tail past the last
    clamped group end loads nothing, so its y1, mxscale1 and y2 come out as zeros), the slice's first
    flattened row, the element offset of the block's mxscale2 slot (``[B, R, width, 2]``: row
    ``base + t // 2``, slot ``t % 2``, column 0), the columns of mxscale2 to write (0 for the tail: those
    slots stay as the caller zero-filled them), and whether the program has a block at all.
    """
    pid = tl.program_id(0)
    batch = pid // blocks_per_slice
    rb = pid % blocks_per_slice
    if GROUPED:
        group, start, end, t = _locate_block(ends_ptr, num_groups, m, rb.to(tl.int64), GROUP_CHUNK)
        in_group = group < num_groups
        base = start // 64 + group
        load_end = tl.where(in_group, end, start)
        s2_cols = tl.where(in_group, width, 0)
    else:
        start = 0
        end = m
        t = rb.to(tl.int64)
        base = 0
        load_end = m
        s2_cols = width
    row0 = start + MX_BLOCK * t
    row_end = tl.minimum(row0 + MX_BLOCK, end)
    first = batch.to(tl.int64) * m  # first flattened row of the slice
    row = first + row0 + tl.arange(0, MX_BLOCK)[:, None]
    rows_ok = row < first + row_end
    live = row < first + load_end
    s2_base = ((batch.to(tl.int64) * s2_rows + base + t // 2) * width) * 2 + t % 2
    return row, rows_ok, live, first, s2_base, s2_cols, row0 < row_end


@triton.jit
def _mx_quantize(
    v, row, rows_ok, ob, ob_ok, width, y_stride, s1_stride, y1_ptr, s1_ptr, y2_ptr, s2_ptr, s2_base, s2_cols,
    first, m, inv_max, emax, mbits, bias, max_code,
    FP4: tl.constexpr, E5M2: tl.constexpr, SCALE_ALG: tl.constexpr, ROUND: tl.constexpr,
    TRANSPOSE_Y2: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """Both MX quantisations of a tile ``v`` ``[32 rows, NB blocks, 32 columns]`` (fp32, the stage-1 values
    in x's dtype, zeros outside the data): output columns ``32 * ob + [0, 32)`` (``ob`` ``[1, NB]``, the
    row-wise block index; ``ob_ok``: the mxscale1 slots to write, pad slots included) of the rows ``row``.

    From the same registers: the row-wise blocks (-1 axis: 32 columns of a row -> y1, mxscale1 slot ``ob``)
    and the column-wise blocks (-2 axis: the 32 rows of a column, zero padded -> y2, mxscale2 at
    ``s2_base + 2 * column`` for columns below ``s2_cols``). With ``TRANSPOSE_Y2`` (FP8), y2 is
    token-contiguous, ``[B, width, M]``: row ``row - first`` of column ``c`` at ``(first * width + c * m)``.
    """
    # |v| as fp32 bits: they order like the magnitudes (NaN above inf), and the exact widening of a 16-bit
    # value is monotonic, so their integer max is the widened 16-bit amax of the spec.
    mag = v.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    ok = rows_ok & ob_ok
    col = ob[:, :, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)  # [1, NB, 32]
    if FP4:  # byte columns (the width is even)
        y_col = ob[:, :, None] * (MX_BLOCK // 2) + tl.arange(0, MX_BLOCK // 2)
        y_ok = ok[:, :, None] & (2 * y_col < width)
    else:
        y_col = col
        y_ok = ok[:, :, None] & (col < width)
    y_off = row[:, :, None] * y_stride + y_col
    # -1 axis: 32 consecutive columns of one row.
    code1, recip1 = _scale_code(tl.max(mag, axis=2), inv_max, emax, SCALE_ALG, FP4)
    y1 = _mx_codes(
        v, recip1[:, :, None], (code1 == 0xFF)[:, :, None], mbits, bias, max_code, FP4, E5M2, ROUND, HW_CVT
    )
    _store_codes(y1_ptr + y_off, y1, y_ok, FP4)
    tl.store(s1_ptr + row * s1_stride + ob, code1.to(tl.uint8), mask=ok)
    # -2 axis: 32 rows of one column (rows past the block end are zeros = the padding).
    code2, recip2 = _scale_code(tl.max(mag, axis=0), inv_max, emax, SCALE_ALG, FP4)
    y2 = _mx_codes(
        v, recip2[None, :, :], (code2 == 0xFF)[None, :, :], mbits, bias, max_code, FP4, E5M2, ROUND, HW_CVT
    )
    if TRANSPOSE_Y2:
        y2_off = first * width + col * m + (row[:, :, None] - first)
    else:
        y2_off = y_off
    _store_codes(y2_ptr + y2_off, y2, y_ok, FP4)
    s2_ok = ob_ok[:, :, None] & (col < s2_cols)
    tl.store(s2_ptr + s2_base + 2 * col, code2[None, :, :].to(tl.uint8), mask=s2_ok)


@triton.jit
def _locate_block(ends_ptr, num_groups, m, rb, GROUP_CHUNK: tl.constexpr):
    """Which 32-row block the row-block program ``rb`` owns: ``(group, start, end, t)``.

    Segments are the G groups, each end clamped into [previous end, M] (``mx.clamp_group_ends``), then the
    tail [last end, M) as segment G. Blocks are numbered segment after segment, ``ceil(n / 32)`` each; the
    program owns block ``t`` of its segment. A program past the last block gets an empty range.
    """
    zero = tl.zeros((), dtype=tl.int64)
    done = zero  # blocks of the segments already scanned
    run_max = zero  # max(0, raw ends of the earlier chunks)
    group = zero
    start = zero
    end = zero
    t = zero
    for c0 in range(0, num_groups + 1, GROUP_CHUNK):
        idx = c0 + tl.arange(0, GROUP_CHUNK)
        raw_end = tl.load(ends_ptr + idx, mask=idx < num_groups, other=m)
        raw_prev = tl.load(ends_ptr + idx - 1, mask=(idx >= 1) & (idx <= num_groups), other=0)
        raw_prev = tl.where(idx > num_groups, m, raw_prev)
        seg_end = tl.minimum(tl.maximum(tl.associative_scan(raw_end, 0, _max_combine), run_max), m)
        seg_start = tl.minimum(tl.maximum(tl.associative_scan(raw_prev, 0, _max_combine), run_max), m)
        nblk = (seg_end - seg_start + (MX_BLOCK - 1)) // MX_BLOCK
        last = done + tl.cumsum(nblk, 0)  # blocks up to and including each segment
        mine = (last > rb) & (last - nblk <= rb)
        group += tl.sum(tl.where(mine, idx, 0))
        start += tl.sum(tl.where(mine, seg_start, 0))
        end += tl.sum(tl.where(mine, seg_end, 0))
        t += tl.sum(tl.where(mine, rb - (last - nblk), 0))
        done += tl.sum(nblk)
        run_max = tl.maximum(run_max, tl.max(raw_end))
    return group, start, end, t


# ------------------------------------------------------------------ SwigluMxQuantWithDualAxis (forward)

_MX_NOT_SPECIALIZED = [
    "m", "num_groups", "blocks_per_slice", "s2_rows", "a_index", "emax", "mbits", "bias", "max_code",
]  # fmt: skip


@triton.jit(do_not_specialize=[*_MX_NOT_SPECIALIZED, "s1_slots"])
def swiglu_mx_quant_kernel(
    x_ptr, ends_ptr, y1_ptr, s1_ptr, y2_ptr, s2_ptr,
    m, n, num_groups, blocks_per_slice, s2_rows, s1_slots, a_index, alpha, limit, glu_bias,
    inv_max, emax, mbits, bias, max_code,
    GROUPED: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_CHUNK: tl.constexpr, INTERLEAVED: tl.constexpr,
    CLIPPED: tl.constexpr, MODE: tl.constexpr, FP4: tl.constexpr, E5M2: tl.constexpr,
    SCALE_ALG: tl.constexpr, ROUND: tl.constexpr, TRANSPOSE_Y2: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """One 32-row block x ``BLOCK_N`` output columns (= pairs) of one batch slice of the forward operator.

    Stage 1 (``_glu_fwd``) rounded to x's dtype (fp32 x: not rounded), then ``_mx_quantize``. Output columns
    past N are zeros (a partial last block is scaled from its real columns); the mxscale1 slots up to
    ``s1_slots`` are written, so the pad slot of an odd block count comes out as code 0 (the launcher's grid
    covers it).
    """
    row, rows_ok, live, first, s2_base, s2_cols, nonempty = _mx_row_block(
        ends_ptr, m, num_groups, blocks_per_slice, s2_rows, n, GROUPED, GROUP_CHUNK
    )
    if not nonempty:
        return
    NB: tl.constexpr = BLOCK_N // MX_BLOCK
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ob = tl.program_id(1).to(tl.int64) * NB + tl.arange(0, NB)[None, :]  # row-wise block = 32 pairs, [1, NB]
    jb = (ob * MX_BLOCK)[:, :, None]
    live3 = live[:, :, None]
    a_raw, b_raw = _load_pairs(x_ptr, row[:, :, None] * 2 * n, jb, live3, n, a_index, MX_BLOCK, INTERLEAVED)
    act = _glu_fwd(_widen(a_raw), _widen(b_raw), alpha, limit, glu_bias, CLIPPED, MODE)
    if CLIPPED:  # e.g. 0 * inf = NaN for an infinite bias: the padding must stay zeros
        act = tl.where(live3 & (jb + tl.arange(0, MX_BLOCK) < n), act, 0.0)
    act = _round_to_dtype(act, DTYPE, HW_CVT)
    if FP4:
        y_stride = n // 2
    else:
        y_stride = n
    _mx_quantize(
        act, row, rows_ok, ob, ob < s1_slots, n, y_stride, s1_slots, y1_ptr, s1_ptr, y2_ptr, s2_ptr, s2_base,
        s2_cols, first, m, inv_max, emax, mbits, bias, max_code, FP4, E5M2, SCALE_ALG, ROUND, TRANSPOSE_Y2,
        HW_CVT,
    )  # fmt: skip


# ---------------------------------------------------------- SwigluBackwardMxQuantWithDualAxis (backward)


@triton.jit(do_not_specialize=_MX_NOT_SPECIALIZED)
def swiglu_bwd_mx_quant_kernel(
    x_ptr, dy_ptr, ends_ptr, y1_ptr, s1_ptr, y2_ptr, s2_ptr,
    m, n, num_groups, blocks_per_slice, s2_rows, a_index, alpha, limit, glu_bias,
    inv_max, emax, mbits, bias, max_code,
    GROUPED: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_CHUNK: tl.constexpr, INTERLEAVED: tl.constexpr,
    CLIPPED: tl.constexpr, MODE: tl.constexpr, E5M2: tl.constexpr, SCALE_ALG: tl.constexpr,
    TRANSPOSE_Y2: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """One 32-row block x ``BLOCK_N`` pairs of one batch slice of the backward operator.

    Loads x and dy once, computes both halves' gradients (``_glu_bwd``), rounds them to x's dtype and
    quantises them at x's columns: chunked, as two tiles (A's and B's half, 32 pairs per block); interleaved,
    as one tile of ``2 * BLOCK_N`` columns (16 pairs per block).
    """
    c = 2 * n
    row, rows_ok, live, first, s2_base, s2_cols, nonempty = _mx_row_block(
        ends_ptr, m, num_groups, blocks_per_slice, s2_rows, c, GROUPED, GROUP_CHUNK
    )
    if not nonempty:
        return
    K: tl.constexpr = MX_BLOCK // 2 if INTERLEAVED else MX_BLOCK  # pairs per 32-column output block
    NB: tl.constexpr = BLOCK_N // K
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    blk = tl.program_id(1).to(tl.int64) * NB + tl.arange(0, NB)[None, :]  # [1, NB]
    jb = (blk * K)[:, :, None]
    j = jb + tl.arange(0, K)  # pairs, [1, NB, K]
    row3 = row[:, :, None]
    ok = live[:, :, None] & (j < n)
    a_raw, b_raw = _load_pairs(x_ptr, row3 * c, jb, live[:, :, None], n, a_index, K, INTERLEAVED)
    dy = _widen(tl.load(dy_ptr + row3 * n + j, mask=ok, other=0.0))
    ga, gb = _glu_bwd(_widen(a_raw), _widen(b_raw), dy, alpha, limit, glu_bias, CLIPPED, MODE, HW_CVT)
    if CLIPPED:  # e.g. 0 * inf = NaN for an infinite alpha or bias: the padding must stay zeros
        ga = tl.where(ok, ga, 0.0)
        gb = tl.where(ok, gb, 0.0)
    ga = _round_to_dtype(ga, DTYPE, HW_CVT)
    gb = _round_to_dtype(gb, DTYPE, HW_CVT)
    if INTERLEAVED:
        _mx_quantize(
            _interleave_ab(ga, gb, a_index), row, rows_ok, blk, blk * K < n, c, c, c // MX_BLOCK, y1_ptr,
            s1_ptr, y2_ptr, s2_ptr, s2_base, s2_cols, first, m, inv_max, emax, mbits, bias, max_code, False,
            E5M2, SCALE_ALG, ROUND_RINT, TRANSPOSE_Y2, HW_CVT,
        )  # fmt: skip
    else:
        blk_ok = blk * MX_BLOCK < n
        half_blocks = n // MX_BLOCK
        for half in tl.static_range(2):
            if half == 0:
                v = ga
                ob = blk + a_index * half_blocks
            else:
                v = gb
                ob = blk + (1 - a_index) * half_blocks
            _mx_quantize(
                v, row, rows_ok, ob, blk_ok, c, c, c // MX_BLOCK, y1_ptr, s1_ptr, y2_ptr, s2_ptr, s2_base,
                s2_cols, first, m, inv_max, emax, mbits, bias, max_code, False, E5M2, SCALE_ALG, ROUND_RINT,
                TRANSPOSE_Y2, HW_CVT,
            )  # fmt: skip
