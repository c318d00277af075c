"""The Triton kernels. One fused kernel per operator; every numeric rule mirrors :mod:`swiglu_ops.mx` and
the reference backend, written so that it computes the same bits on a GPU and under ``TRITON_INTERPRET=1``:

- Roundings are correctly rounded conversions. On the GPU they are single PTX instructions: ``rcp.rn.f32``
  for the sigmoid's division, ``cvt.rn.bf16x2.f32`` for bf16, ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` for
  the FP8 codes (NaN blocks are zeroed before the cast: the hardware would give 0x7F where the contract
  wants 0x00). The interpreter has no inline asm and its fp32->bf16 / fp8 casts truncate, so under
  ``INTERPRETED`` the same rules run as integer arithmetic on IEEE bit patterns (and ``div_rn``). The two
  paths differ only in NaN payloads of bf16 gradients, which the contract does not compare.
- E8M0 codes are integer arithmetic on the amax bits in both modes.
- The only other floating-point operations are the spec's fp32 multiplies/adds in the spec's order
  (launched with ``enable_fp_fusion=False``, so neither LLVM nor ptxas contracts them into FMAs), NaN-
  propagating min/max for the clamp, ``exp`` and the exact scaling multiply of the MX rule
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

#: Rows of one column-wise MX block (and of the dual-axis tile).
MX_BLOCK = tl.constexpr(32)


# ------------------------------------------------------------------------------------------ helpers


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
def _sigmoid(v, HW_CVT: tl.constexpr):
    """``1 / (1 + exp(-v))`` with an IEEE (correctly rounded) division."""
    return _recip_rn(1.0 + _exp(-v), HW_CVT)


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
def _store_grad(ptr, v, mask, OUT_DTYPE: tl.constexpr, HW_CVT: tl.constexpr):
    """Store fp32 ``v`` rounded (RNE, no saturation) to the output dtype."""
    if OUT_DTYPE == tl.bfloat16:
        tl.store(ptr, _to_bf16(v, HW_CVT), mask=mask)
    else:
        tl.store(ptr, v.to(OUT_DTYPE), mask=mask)


@triton.jit
def _round_to_dtype(v, DTYPE: tl.constexpr, HW_CVT: tl.constexpr):
    """fp32 ``v`` rounded to ``DTYPE`` (RNE, no saturation) and widened back to fp32 (exactly)."""
    if DTYPE == tl.bfloat16:
        return _widen(_to_bf16(v, HW_CVT))
    elif DTYPE == tl.float16:
        return v.to(tl.float16).to(tl.float32)
    else:
        return v


@triton.jit
def _scale_code(amax, inv_max, emax, SCALE_ALG: tl.constexpr):
    """E8M0 code (int32) and fp32 element multiplier from block amax fp32 bits: ``mx.scale_codes`` and
    ``mx.scale_reciprocal`` (SCALE_ALG 1 = RCEIL, 0 = OCP floor), specialised per rule.

    The multiplier of a NaN/inf block (code 0xFF) is not used: :func:`_fp8_codes` writes 0x00 there. For a
    zero block every element is +-0 and any finite multiplier keeps it +-0, so ``2**(127 - code)`` serves.
    Finite codes stay below 254 (amax <= 2**128 and ``inv_max`` < 2**-8 for RCEIL; ``ef - emax`` <= 246 for
    the floor rule), so ``(254 - code) << 23`` is the normal fp32 ``2**(127 - code)``.
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
        recip = tl.where(ef == 0, 0, (254 - code) << 23)
    return tl.where(finite, code, 0xFF), recip.to(tl.float32, bitcast=True)


@triton.jit
def _fp8_code_int(v, mbits, bias, max_code):
    """``mx.fp8_encode`` of fp32 ``v``: saturating round-to-nearest-even FP8 code (int32), NaN -> 0x00."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
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
    q += ((rem > half) | ((rem == half) & (shift > 0) & ((q & 1) == 1))).to(tl.int32)
    code = tl.where(e >= emin, ((e + bias - 1) << mbits) + q, q)
    code = tl.minimum(code, max_code)
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
def _fp8_codes(v, recip, nonfinite, mbits, bias, max_code, E5M2: tl.constexpr, HW_CVT: tl.constexpr):
    """FP8 codes (uint8) of ``v * recip``, the element rule of ``mx.quantize_blocks``: ``mx.fp8_encode`` of
    the exact product, and 0x00 for every element of a NaN/inf block (``nonfinite``, where recip is NaN).

    GPU: ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``, four elements per asm block packed into one 32-bit register.
    For non-NaN inputs it is exactly the encode's rule: IEEE RNE into the format (subnormals included, no
    flush: an fp32 subnormal rounds to a signed zero either way), the sign of zero kept, magnitudes past the
    largest finite (and +-inf) saturate to +-max. It turns NaN into 0x7F/0xFF, but a NaN product only comes
    from a non-finite block (finite block: finite ``v`` times a finite power of two), and those elements are
    replaced by +0.0 before the cast (in both paths), which encodes as 0x00. Interpreter: the integer
    transcription of ``mx.fp8_encode``.
    """
    q = tl.where(nonfinite, 0.0, v * recip)
    if HW_CVT:
        if E5M2:
            return _cvt_fp8x4(q, _CVT_E5M2X4)
        else:
            return _cvt_fp8x4(q, _CVT_E4M3X4)
    else:
        return _fp8_code_int(q, mbits, bias, max_code).to(tl.uint8)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


# ---------------------------------------------------------------------------------- swiglu_group_grad


@triton.jit
def _group_grad_loads(
    dy_ptr, x_ptr, yo_ptr, r, row_ok, h0, hidden, BLOCK_H: tl.constexpr, HAS_WEIGHT: tl.constexpr
):
    """The raw (16-bit or fp32) inputs of one ``[ROWS, BLOCK_H]`` chunk: dy, gate, up and y_origin (dy again
    without weight). Out-of-range columns and rows load zeros and are never stored."""
    h = h0 + tl.arange(0, BLOCK_H)
    mask = row_ok[:, None] & (h < hidden)[None, :]
    offs = r[:, None] * hidden + h[None, :]
    x_offs = r[:, None] * (2 * hidden) + h[None, :]
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
    g = tl.load(x_ptr + x_offs, mask=mask, other=0.0)
    u = tl.load(x_ptr + x_offs + hidden, mask=mask, other=0.0)
    if HAS_WEIGHT:
        yo = tl.load(yo_ptr + offs, mask=mask, other=0.0)
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

    Spec swiglu_group_grad.md section 3 in its operation order; grad_weight is the fp32 sum of the
    ``dy * y_origin`` products: a fixed tree inside each chunk, chunks added in order (deterministic; not
    NumPy's pairwise order, see docs/triton_backend.md).

    All four loads of a chunk are issued before its math. With ``PREFETCH`` the loads of chunk k + 1 are
    issued before the math of chunk k (register double buffering: twice the bytes in flight per warp, for
    about 16 more registers with 16-bit inputs).
    """
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = r < rows
    has_clamp = clamp > 0.0
    hi = tl.where(has_clamp, clamp, float("inf"))
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
        h = h0 + tl.arange(0, BLOCK_H)
        mask = row_ok[:, None] & (h < hidden)[None, :]
        x_offs = r[:, None] * (2 * hidden) + h[None, :]
        dy = _widen(raw_dy)
        g = _widen(raw_g)
        u = _widen(raw_u)
        # Clamp (open intervals on the raw inputs; min/clip keep NaN). Multiplying by a mask of 1.0 is
        # bit-identical to skipping it, so one code path serves both settings.
        m_g = tl.where(has_clamp & ~(g < clamp), 0.0, 1.0)
        m_u = tl.where(has_clamp & ~(tl.abs(u) < clamp), 0.0, 1.0)
        # NaN-propagating min/max against [lo, hi] (+-inf without clamp): one min.NaN/max.NaN each on sm_80+.
        g = tl.minimum(g, hi, propagate_nan=tl.PropagateNan.ALL)
        u = tl.clamp(u, -hi, hi, propagate_nan=tl.PropagateNan.ALL)
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
        _store_grad(gx_ptr + x_offs, dg, mask, gx_ptr.dtype.element_ty, HW_CVT)
        _store_grad(gx_ptr + x_offs + hidden, du, mask, gx_ptr.dtype.element_ty, HW_CVT)
        if HAS_WEIGHT:
            gw += tl.sum(dy * _widen(raw_yo), axis=1)
    if HAS_WEIGHT:
        tl.store(gw_ptr + r, 0.0 + gw, mask=row_ok)


# ------------------------------------------------------------------------ swiglu_bwd_mx_quant (dual)


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


@triton.jit(
    do_not_specialize=[
        "m",
        "num_groups",
        "blocks_per_slice",
        "s2_rows",
        "emax",
        "mbits",
        "bias",
        "max_code",
    ]
)
def swiglu_bwd_mx_quant_kernel(
    x_ptr, dy_ptr, ends_ptr, y1_ptr, s1_ptr, y2_ptr, s2_ptr,
    m, n, num_groups, blocks_per_slice, s2_rows, a_col, inv_max, emax, mbits, bias, max_code,
    GROUPED: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_CHUNK: tl.constexpr, E5M2: tl.constexpr,
    SCALE_ALG: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """One 32-row block x ``BLOCK_N`` column pairs (A and B halves) of one batch slice.

    Computes the gradient tile once, rounds it to x's dtype, and derives from the same registers the
    row-wise blocks (32 columns, -> y1/mxscale1) and the column-wise blocks (32 rows, -> y2/mxscale2).
    Rows of the tail (past the last clamped group end) are loaded as zeros, so they quantise to code 0
    and scale 0; their mxscale2 slots are never written (the caller zero-filled them).
    """
    pid = tl.program_id(0)
    batch = pid // blocks_per_slice
    rb = pid % blocks_per_slice
    if GROUPED:
        group, start, end, t = _locate_block(ends_ptr, num_groups, m, rb.to(tl.int64), GROUP_CHUNK)
        in_group = group < num_groups
        base = start // 64 + group
        # The tail segment (rows past the last group end) loads nothing, so it quantises zeros.
        load_end = tl.where(in_group, end, start)
        scale2_cols = tl.where(in_group, n, 0)
    else:
        start = 0
        end = m
        t = rb.to(tl.int64)
        base = 0
        load_end = m
        scale2_cols = n
    row0 = start + MX_BLOCK * t
    row_end = tl.minimum(row0 + MX_BLOCK, end)
    if row0 >= row_end:
        return
    NB: tl.constexpr = BLOCK_N // MX_BLOCK
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    c = 2 * n
    b_col = n - a_col
    # Tile [32 rows, NB row-wise blocks, 32 lanes]; column j = tile start + 32 * block + lane (< n).
    row = batch.to(tl.int64) * m + row0 + tl.arange(0, MX_BLOCK)[:, None]  # flattened [B*M] row, [32, 1]
    rows_ok = row < batch.to(tl.int64) * m + row_end
    # Row-wise block index within the half, [1, NB].
    blk = tl.program_id(1).to(tl.int64) * NB + tl.arange(0, NB)[None, :]
    blk_ok = blk * MX_BLOCK < n
    j = blk[:, :, None] * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, None, :]  # [1, NB, 32]
    row3 = row[:, :, None]
    store_ok = (rows_ok & blk_ok)[:, :, None]
    load_ok = (row < batch.to(tl.int64) * m + load_end)[:, :, None] & store_ok
    a = _widen(tl.load(x_ptr + row3 * c + a_col + j, mask=load_ok, other=0.0))
    b = _widen(tl.load(x_ptr + row3 * c + b_col + j, mask=load_ok, other=0.0))
    g = _widen(tl.load(dy_ptr + row3 * n + j, mask=load_ok, other=0.0))
    # Stage 1 (spec 2.2), fp32, kernel order. Each half is computed right before it is quantised, so only one
    # fp32 gradient tile is live at a time.
    s = _sigmoid(a, HW_CVT)
    # mxscale2 [B, R, C, 2]: block t of the segment -> row base + t // 2, slot t % 2.
    s2_off = ((batch.to(tl.int64) * s2_rows + base + t // 2) * c + j) * 2 + t % 2  # [1, NB, 32]
    for half in tl.static_range(2):
        if half == 0:
            tt = ((-s) + 1.0) * a + 1.0
            grad = ((tt * b) * s) * g
            col = a_col
        else:
            grad = (s * g) * a
            col = b_col
        v = _round_to_dtype(grad, DTYPE, HW_CVT)
        # |v| as fp32 bits: they order like the magnitudes (NaN above inf), and the exact widening of a 16-bit
        # value is monotonic, so their integer max is the widened 16-bit amax of the spec.
        mag = v.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        # -1 axis: 32 consecutive columns of one row.
        code1, recip1 = _scale_code(tl.max(mag, axis=2), inv_max, emax, SCALE_ALG)
        y1 = _fp8_codes(
            v, recip1[:, :, None], (code1 == 0xFF)[:, :, None], mbits, bias, max_code, E5M2, HW_CVT
        )
        tl.store(y1_ptr + row3 * c + col + j, y1, mask=store_ok)
        tl.store(
            s1_ptr + row * (c // MX_BLOCK) + col // MX_BLOCK + blk, code1.to(tl.uint8), mask=rows_ok & blk_ok
        )
        # -2 axis: 32 rows of one column (rows past the block end were loaded as zeros = the padding).
        code2, recip2 = _scale_code(tl.max(mag, axis=0), inv_max, emax, SCALE_ALG)
        y2 = _fp8_codes(
            v, recip2[None, :, :], (code2 == 0xFF)[None, :, :], mbits, bias, max_code, E5M2, HW_CVT
        )
        tl.store(y2_ptr + row3 * c + col + j, y2, mask=store_ok)
        tl.store(s2_ptr + s2_off + 2 * col, code2[None, :, :].to(tl.uint8), mask=j < scale2_cols)
