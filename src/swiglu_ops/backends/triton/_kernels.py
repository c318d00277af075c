"""The Triton kernels: the GLU family written once (spec README 6.2), as shared ``@triton.jit`` pieces that
four kernels assemble, one per kind of output:

- ``clipped_swiglu_kernel``: ClippedSwiglu and ClippedSwigluGrad (constexpr ``BACKWARD``), stored rounded;
- ``swiglu_group_grad_kernel``: SwigluGroupGrad (row-streaming, routing weight, grad_weight);
- ``swiglu_mx_quant_kernel``: SwigluMxQuantWithDualAxis (forward, FP8/FP4 dual-axis MX);
- ``swiglu_bwd_mx_quant_kernel``: SwigluBackwardMxQuantWithDualAxis (backward, FP8 dual-axis MX).

The pieces, mirroring the C backend (``cpu/csrc/glu.h``, ``mx.h``, ``numerics.h``):

- the math, one functor per direction in each CANN operator's operation order (``_glu_fwd``,
  ``_glu_bwd``: plain SwiGLU, clipped SwiGLU clamp_mode 0 / 1; ``_group_grad_fn``), built on the activations
  of A alone (``_silu``, ``_sigmoid``); ``swiglu_ops.numerics.glu`` is the readable version;
- the layout: ``_load_pairs`` / ``_store_pairs`` take A and B from a row's two halves or its even/odd
  elements (constexpr ``INTERLEAVED``: one contiguous vector load split in registers), A being the first or
  the second (``a_index``), for the elementwise tiles and the MX tiles alike;
- the MX quantisation of a tile of 32 rows x 32-column blocks along both axes (``_mx_row_block``,
  ``_mx_quantize``: scale codes, element codes, FP4 nibble packing), shared by both MX kernels; the
  element encoder transcribes ``mx.encode`` in exact fp32 arithmetic for FP8 and FP4 alike
  (``_elem_code``; for FP8 ``HW_CVT`` converts instead).

Every numeric rule mirrors :mod:`swiglu_ops.numerics.mx` and the reference backend, written so that it
computes the same bits on a GPU and under ``TRITON_INTERPRET=1``:

- Roundings are correctly rounded conversions. On the GPU, with ``HW_CVT``, they are single PTX
  instructions: ``cvt.rn.bf16x2.f32`` for bf16, ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` for the FP8 codes
  (NaN blocks are zeroed before the cast: the hardware would give 0x7F where the contract wants 0x00), and
  the backward's reciprocals and quotients take a branch-free fast path whose tile is recomputed exactly
  where it may be inexact (``_recip_ge1``, ``_div_ge1``). By default, and always in the interpreter (no
  inline asm; its fp32->bf16 / fp8 casts truncate), the same rules run as integer arithmetic on IEEE bit
  patterns and ``div_rn``. The two paths differ only in NaN payloads of bf16 values, which the contract
  does not compare. FP4 codes have no hardware path (PTX has no floor / ties-away FP4 conversion).
- The forward activations' quotients ``a / (exp(-a) + 1)`` are ``div_rn`` (``div.rn.f32``), except in the
  MX forward with ``HW_CVT``, whose outputs are codes: there an approximate reciprocal within the
  contract's near-tie rule (``_quotient``), the one rule of these kernels that is not bit-exact beyond
  ``exp``.
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

from ...numerics import mx as _mx

#: Kernels are built for the interpreter when ``TRITON_INTERPRET=1`` is set at import time (Triton reads it
#: when ``@triton.jit`` runs); libdevice has no interpreter implementation.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_LIBDEVICE_EXP = tl.constexpr(not INTERPRETED)
_INTERPRETED = tl.constexpr(INTERPRETED)
# ``HW_CVT`` (a launch-time constexpr, ``swiglu_ops.backends.triton.HW_CONVERSIONS``): on the GPU, the
# correctly rounded conversions as single PTX instructions (``cvt.rn.bf16x2.f32``,
# ``cvt.rn.satfinite.e4m3x2.f32``) instead of their integer transcriptions, and the backward's fast
# reciprocals (``FAST`` below). The interpreter has no inline asm and its fp32->bf16 cast truncates, so it
# always runs the integer path.

#: Rows of one column-wise MX block (and of the dual-axis tile), columns of one row-wise block.
MX_BLOCK = tl.constexpr(32)

#: Element round modes (constexpr ``ROUND``), by ``swiglu_ops.numerics.mx.ROUND_MODES`` name: ties to even,
#: ties away from zero, towards -inf on the signed value. FP8 is always ``RINT``.
ROUND_RINT = tl.constexpr(0)
ROUND_HALF_AWAY = tl.constexpr(1)
ROUND_FLOOR = tl.constexpr(2)
ROUND_MODES = {"rint": 0, "round": 1, "floor": 2}


# --------------------------------------------------------------------------------- numeric helpers


# libdevice's ``__nv_expf`` as PTX, with its saturation fused into the first fma: libdevice rounds
# ``fma.rn.ftz`` and then saturates (``cvt.ftz.sat.f32.f32``), which ptxas leaves as two instructions;
# ``fma.rn.ftz.sat.f32`` is, by PTX's definition, the same rounding, flush and clamp to [0, 1] (NaN -> +0)
# in one. Every other operation and constant is libdevice's own (t: the scaled, clamped argument; j: the
# rounded exponent, in the low bits of 2**23 + 2**22 + 1; f = x * log2(e) - (j - 2**23 - 2**22 - 127) in two
# parts; 2**f times j's exponent field), so the result is libdevice's, bit for bit: 9 instructions instead
# of 10. On the opt-in GPU path (``_exp``'s ``ASM``).
_EXP_ASM = tl.constexpr("""{ .reg .f32 t, j, u, f, e;
.reg .b32 s;
fma.rn.ftz.sat.f32 t, $1, 0f3BBB989D, 0f3F000000;
fma.rm.ftz.f32 j, t, 0f437C0000, 0f4B400001;
sub.rn.f32 u, 0f4B40007F, j;
fma.rn.ftz.f32 f, $1, 0f3FB8AA3B, u;
fma.rn.ftz.f32 f, $1, 0f32A57060, f;
ex2.approx.ftz.f32 e, f;
shl.b32 s, j, 23;
mul.rn.f32 $0, e, s;
}""")


@triton.jit
def _exp(v, ASM: tl.constexpr):
    """``exp(v)``: libdevice's ``__nv_expf`` on the GPU (with ``ASM``: the same in PTX, one instruction
    shorter, above), NumPy's ``exp`` in the interpreter."""
    if not _LIBDEVICE_EXP:
        return tl.exp(v)
    elif ASM:
        return tl.inline_asm_elementwise(_EXP_ASM, "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1)
    else:
        return libdevice.exp(v)


# Correctly rounded reciprocals and quotients of operands ``d >= 1`` (or NaN) in the backward kernels: the
# sigmoids' ``1 / (1 + exp(..))`` and clamp_mode 1's ``a / (exp(-a) + 1)``. Two implementations, selected by
# the constexpr ``FAST``:
#
# - exact (``FAST`` false: the integer path, the interpreter, and the PTX path's redo): ``div_rn``
#   (``div.rn.f32``), whose ptxas expansion tests and branches per element;
# - fast (the PTX path): ptxas's own fast path of ``rcp.rn.f32`` (``MUFU.RCP`` + one Newton step with two
#   FMAs: the correctly rounded reciprocal wherever ptxas takes that path, i.e. for a normal operand with
#   a normal reciprocal) and, for quotients, Markstein's correction (``q = n * r``, ``m = n - d * q``,
#   ``q' = q + r * m`` with FMAs: the correctly rounded quotient when ``r`` is the correctly rounded
#   reciprocal, ``q`` a faithful quotient and nothing underflows or overflows), without a branch. Each
#   element also yields a key (``_rcp_key``, ``_div_key``: uint32) that is at least ``SLOW_KEY`` wherever
#   those conditions might not hold. The kernels reduce the keys of a tile and, in the rare tile where
#   one reaches ``SLOW_KEY``, recompute the whole tile on the exact path and store it again. (Per-element
#   branches split the code into regions that ptxas cannot schedule across, which costs registers and
#   instructions; the branch-free fast path has none.)
SLOW_KEY = tl.constexpr(0x7E800000)  # fp32 bits of 2**126
_DIV_TINY = 0x0D800000  # fp32 bits of 2**-100: smaller quotients (but zero) leave the fast path
_DIV_KEY_TINY = tl.constexpr(0x7E800000 + _DIV_TINY - 1)


def _rcp_fast_x4() -> tl.constexpr:
    """PTX: ``$i = 1 / $(4+i)`` for four operands, ptxas's fast path of ``rcp.rn.f32``."""
    body = ["{ .reg .f32 r<4>, e<4>;"]
    for i in range(4):
        y = f"${4 + i}"
        body += [
            f"rcp.approx.ftz.f32 r{i}, {y};",
            f"neg.f32 e{i}, {y};",
            f"fma.rn.f32 e{i}, e{i}, r{i}, 0f3F800000;",
            f"fma.rn.f32 ${i}, r{i}, e{i}, r{i};",
        ]
    return tl.constexpr("\n".join(body + ["}"]))


def _div_fast_x4() -> tl.constexpr:
    """PTX: ``$i = $(4+i) / $(8+i)`` for four quotients: the fast reciprocal, Markstein's correction, and
    the numerator's sign on the result (``-0 / d`` is -0, where the correction step gives +0; elsewhere
    the quotient already has the numerator's sign, d being positive)."""
    body = ["{ .reg .f32 r<4>, e<4>, m<4>, q<4>; .reg .b32 s<4>;"]
    for i in range(4):
        n, d = f"${4 + i}", f"${8 + i}"
        body += [
            f"rcp.approx.ftz.f32 r{i}, {d};",
            f"neg.f32 e{i}, {d};",
            f"fma.rn.f32 m{i}, e{i}, r{i}, 0f3F800000;",
            f"fma.rn.f32 r{i}, r{i}, m{i}, r{i};",
            f"mul.rn.f32 q{i}, {n}, r{i};",
            f"fma.rn.f32 m{i}, e{i}, q{i}, {n};",
            f"fma.rn.f32 q{i}, r{i}, m{i}, q{i};",
            f"and.b32 s{i}, {n}, 0x80000000;",
            f"or.b32 ${i}, q{i}, s{i};",
        ]
    return tl.constexpr("\n".join(body + ["}"]))


_RCP_FAST_X4 = _rcp_fast_x4()
_DIV_FAST_X4 = _div_fast_x4()


@triton.jit
def _fast_emulated(exact, key):
    """The fast reciprocal / quotient in the interpreter (which has no inline asm), so that the kernels' fast
    formulation, its keys and the exact redo run in CI: the exact value where the key says the PTX gives
    it, NaN wherever it might not (worse than the PTX, which is close there: a missing redo shows)."""
    return tl.where(key < SLOW_KEY, exact, float("nan"))


@triton.jit
def _recip_ge1(y, FAST: tl.constexpr):
    """``1 / y`` correctly rounded for ``y >= 1`` or NaN (fast: exact for ``y < 2**126``, see above)."""
    if FAST and _INTERPRETED:  # the emulation (see _fast_emulated)
        return _fast_emulated(tl.math.div_rn(1.0, y), _rcp_key(y))
    elif FAST:
        return tl.inline_asm_elementwise(
            _RCP_FAST_X4, "=r,=r,=r,=r,r,r,r,r", [y], dtype=tl.float32, is_pure=True, pack=4
        )
    else:
        return tl.math.div_rn(1.0, y)


@triton.jit
def _div_ge1(n, d, FAST: tl.constexpr):
    """``n / d`` correctly rounded for ``d >= 1`` or NaN (fast: exact where ``_div_key`` < SLOW_KEY)."""
    if FAST and _INTERPRETED:  # the emulation (see _fast_emulated)
        q = tl.math.div_rn(n, d)
        return _fast_emulated(q, _div_key(n, d, q))
    elif FAST:
        return tl.inline_asm_elementwise(
            _DIV_FAST_X4, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [n, d], dtype=tl.float32, is_pure=True, pack=4
        )
    else:
        return tl.math.div_rn(n, d)


@triton.jit
def _div_key(n, d, q):
    """The fast quotient's key: at least SLOW_KEY unless ``1 <= d < 2**126`` (a normal reciprocal), the
    numerator is finite and below 2**126 in magnitude, and the quotient is zero... or at least 2**-100 in
    magnitude (so that nothing in the correction underflows). uint32: max(d, |n|, K - |q|)."""
    dk = d.to(tl.uint32, bitcast=True)
    nk = n.to(tl.uint32, bitcast=True) & 0x7FFFFFFF
    qk = q.to(tl.uint32, bitcast=True) & 0x7FFFFFFF
    return tl.maximum(tl.maximum(dk, nk), _DIV_KEY_TINY - qk)


@triton.jit
def _cold_path_marker(v):
    """Marks the exact path's redo of a tile for the SASS instruction count (benchmarks/sass_budget.py
    counts a branch arm that contains it as cold): ``pmevent 7``, a performance-monitor event that does
    nothing else. Returns ``v``."""
    if _INTERPRETED:
        return v
    else:
        return tl.inline_asm_elementwise(
            "pmevent 7;\nmov.b32 $0, $1;", "=r,r", [v], dtype=v.dtype, is_pure=False, pack=1
        )


@triton.jit
def _rcp_key(y):
    """The fast reciprocal's key: ``y``'s bits (>= SLOW_KEY for y >= 2**126, inf and NaN)."""
    return y.to(tl.uint32, bitcast=True)


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
    if v.dtype == tl.bfloat16 and _INTERPRETED:
        return (v.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif v.dtype == tl.bfloat16:
        # Two bf16 values in one 32-bit register: one shift or one and each (the cast extracts each half
        # and then shifts it: two instructions for the upper one).
        return tl.inline_asm_elementwise(
            "shl.b32 $0, $2, 16;\nand.b32 $1, $2, 0xFFFF0000;", "=r,=r,r", [v], dtype=tl.float32,
            is_pure=True, pack=2,
        )  # fmt: skip
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
    if HW_CVT and not _INTERPRETED:
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
    elif DTYPE == tl.bfloat16 and (not HW_CVT or _INTERPRETED):
        return (_bf16_bits_rne(v) << 16).to(tl.float32, bitcast=True)
    else:
        return _widen(_narrow(v, DTYPE, HW_CVT))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _max_nan_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


# ----------------------------------------------------------------------- the GLU family: the math


@triton.jit
def _sigmoid(v, FAST: tl.constexpr):
    """``(1 / (1 + exp(-v)), key)`` with an IEEE (correctly rounded) division: the backward's activation.
    ``key``: the fast reciprocal's (``_rcp_key``), unused on the exact path."""
    den = 1.0 + _exp(-v, FAST)
    return _recip_ge1(den, FAST), _rcp_key(den)


# The forward quotients ``n / (exp(x) + 1)`` (SiLU, ClippedSwiglu's glu) of the MX forward on the GPU path
# (constexpr ``APPROX``: the MX forward's ``HW_CVT``): ``(n * 0.25) * rcp((exp(x) + 1) * 0.25)`` with
# ``rcp.approx.ftz.f32`` (at most 1 ulp from 1/d), so at most 2 ulp from the correctly rounded quotient:
# 4 instructions where ``div.rn`` takes 11 with its per-element check and branch. Its outputs are FP8/FP4
# codes, which the contract compares by its near-tie rule, the rule that already covers the GPU's ``exp``
# (tests/test_mx_forward.py holds the rule under these error bounds). The quarter scaling keeps every
# operand in range: (e + 1) / 4 is at least 1/4 and below 2**126 for every finite e (the reciprocal stays
# normal, where ftz would flush 1/d for d >= 2**126), n / 4 times a reciprocal of at most 4 cannot
# overflow, and (e + 1) / 4 with one rounding by the fma is RN(e + 1) / 4. n / 4 is exact from |n| = 2**-100
# up (every widened bf16/fp16 value too); below, for fp32 subnormal numerators (fp32 inputs, or a clipped
# ``limit`` under 2**-100: the launcher's ``small_numerators``), it is not, and the ``SMALL`` form lets the
# reciprocal take the quarter instead, n * (r / 4): r / 4 is exact unless it is subnormal (d > 2**126),
# where the quotient of so small an n rounds to +-0 either way. inf / NaN: e = inf gives 1/d = 0 (n * 0 =
# +-0, or NaN for an infinite n, as the division), a NaN operand a NaN (|NaN| < 2**-100 is false).
_QUOTIENT_APPROX = tl.constexpr("""{ .reg .f32 d, r, n;
fma.rn.f32 d, $2, 0f3E800000, 0f3E800000;
rcp.approx.ftz.f32 r, d;
mul.rn.f32 n, $1, 0f3E800000;
mul.rn.f32 $0, n, r;
}""")
# The same where numerators may be fp32 subnormals (constexpr ``SMALL``): below |n| = 2**-100 the reciprocal
# takes the quarter instead (one compare, two predicated multiplies: 2 SASS instructions more).
_QUOTIENT_APPROX_SMALL = tl.constexpr("""{ .reg .f32 d, r, n, t; .reg .pred p;
fma.rn.f32 d, $2, 0f3E800000, 0f3E800000;
rcp.approx.ftz.f32 r, d;
abs.f32 t, $1;
setp.lt.f32 p, t, 0f0D800000;
mov.f32 n, $1;
@!p mul.rn.f32 n, n, 0f3E800000;
@p mul.rn.f32 r, r, 0f3E800000;
mul.rn.f32 $0, n, r;
}""")


@triton.jit
def _quotient(n, x, APPROX: tl.constexpr, SMALL: tl.constexpr = False):
    """``n / (exp(x) + 1)``: ``div.rn``, or with ``APPROX`` the quarter-scaled approximate reciprocal above,
    with ``SMALL`` its form for numerators that may be fp32 subnormals (in the interpreter, which has no
    inline asm, the same formulations with a correctly rounded reciprocal, so that their scalings and
    special values run in CI)."""
    e = _exp(x, APPROX)
    if APPROX and _INTERPRETED:
        r = tl.math.div_rn(1.0, (e + 1.0) * 0.25)
        if SMALL:
            return tl.where(tl.abs(n) < 7.888609052210118e-31, n * (r * 0.25), (n * 0.25) * r)  # 2**-100
        return (n * 0.25) * r
    elif APPROX and SMALL:
        return tl.inline_asm_elementwise(
            _QUOTIENT_APPROX_SMALL, "=r,r,r", [n, e], dtype=tl.float32, is_pure=True, pack=1
        )
    elif APPROX:
        return tl.inline_asm_elementwise(
            _QUOTIENT_APPROX, "=r,r,r", [n, e], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.math.div_rn(n, e + 1.0)


@triton.jit
def _silu(a, APPROX: tl.constexpr, SMALL: tl.constexpr = False):
    """SiLU in the forward operators' order, ``a / (exp(a * -1) + 1)`` (a division, no sigmoid formed)."""
    return _quotient(a, a * -1.0, APPROX, SMALL)


@triton.jit
def _glu_fwd(
    a, b, alpha, limit, bias, CLIPPED: tl.constexpr, MODE: tl.constexpr, APPROX: tl.constexpr,
    SMALL: tl.constexpr = False,
):  # fmt: skip
    """The forward's fp32 result from the widened halves (``reference.glu.forward``):

    - plain SwiGLU (SwigluMxQuantWithDualAxis 2.2): ``(a / (exp(a * -1) + 1)) * b``;
    - clipped, clamp_mode 0 (ClippedSwiglu 3.1): ``A~ = min(a, L)``,
      ``(A~ / (exp(A~ * -alpha) + 1)) * (clip(b, L) + bias)``;
    - clipped, clamp_mode 1 (3.2): ``min(a / (exp(a * -1) + 1), L) * clip(b, L)``.

    The quotient (``_quotient``) is ``div.rn`` (ptxas: a fast path and a per-element branch), or with
    ``APPROX`` (the MX forward's GPU path, whose outputs are codes) the approximate reciprocal. The
    elementwise forward stores bf16/fp16/fp32 values and keeps ``div.rn``: the backward's exact fast
    quotient with its key and redo (``_div_ge1``) costs more instructions there (benchmarks/sass_budget.py:
    46 against 50 per pair, sm_90), and an approximate one would leave fp32 results 2 ulp further from the
    reference on top of the ``exp``'s.
    """
    if not CLIPPED:
        y = _silu(a, APPROX, SMALL) * b
    elif MODE == 0:
        at = _min_nan(a, limit)
        y = _quotient(at, at * -alpha, APPROX, SMALL) * (_clip(b, limit) + bias)
    else:
        y = _min_nan(_silu(a, APPROX, SMALL), limit) * _clip(b, limit)
    return y


@triton.jit
def _glu_bwd(
    a, b, dy, alpha, limit, bias, CLIPPED: tl.constexpr, MODE: tl.constexpr, FAST: tl.constexpr,
    DEN_KEY: tl.constexpr,
):  # fmt: skip
    """``(grad_a, grad_b, key)`` in fp32 from the widened halves and dy (``reference.glu.backward``), and
    the key of its reciprocal / division (unused on the exact path):

    - plain SwiGLU (SwigluBackwardMxQuantWithDualAxis 2.2): ``s = 1 / (1 + exp(-a))``,
      ``t = ((-s) + 1) * a + 1``, ``(((t * b) * s) * dy, (s * dy) * a)``;
    - clipped, clamp_mode 0 (ClippedSwigluGrad, clipped_swiglu.md 4) and the clamp_mode-1 extension
      (section 10): closed masks on the raw inputs, applied by a select (a masked position is +0.0).

    ``DEN_KEY`` (clamp_mode 0, fast path; the launcher's ``den_key``: L finite in fp32 and alpha not
    negative): the reciprocal's operand alone keys the redo. A~ = min(a, L) is then never +inf, and an
    A~ of -inf or NaN makes exp(A~ * -alpha) + 1 infinite or NaN, whose key reaches SLOW_KEY by itself.
    """
    if not CLIPPED:
        s, key = _sigmoid(a, FAST)
        t = ((-s) + 1.0) * a + 1.0
        da = ((t * b) * s) * dy
        db = (s * dy) * a
    else:
        if MODE == 0:
            at = _min_nan(a, limit)
            # s = (A~ * 0 + 1) / (exp(A~ * -alpha) + 1): the numerator is exactly 1 (NaN for an infinite or
            # NaN A~), so its product with the correctly rounded reciprocal is that same IEEE quotient.
            den = _exp(at * -alpha, FAST) + 1.0
            if FAST:
                # The numerator is 1 unless A~ is +-inf or NaN; the key, den + |A~| (at least den), is inf
                # or NaN there, so those tiles take the exact redo too (DEN_KEY: den is, see above).
                s = _recip_ge1(den, FAST)
                if DEN_KEY:
                    key = _rcp_key(den)
                else:
                    key = _rcp_key(den + tl.abs(at))
            else:
                s = (at * 0.0 + 1.0) * _recip_ge1(den, FAST)
                key = _rcp_key(den)
            db = (dy * at) * s
            t = (s * -1.0) + 1.0
            t = ((((t * at) * alpha) + 1.0) * s) * (_clip(b, limit) + bias)
            da = t * dy
            a_ok = a <= limit
        else:
            den = _exp(a * -1.0, FAST) + 1.0
            silu = _div_ge1(a, den, FAST)
            s = _recip_ge1(den, FAST)
            key = _div_key(a, den, silu)  # covers the reciprocal's operand too
            db = dy * _min_nan(silu, limit)
            t = ((((s * -1.0) + 1.0) * a + 1.0) * s) * _clip(b, limit)
            da = t * dy
            a_ok = silu <= limit
        da = tl.where(a_ok, da, 0.0)
        db = tl.where(tl.abs(b) <= limit, db, 0.0)  # -L <= b <= L (false for NaN)
    return da, db, key


@triton.jit
def _group_grad_fn(
    dy, g, u, w, m_r, clamp, hi, cmp, has_clamp, HAS_WEIGHT: tl.constexpr, HAS_MASK: tl.constexpr,
    FAST: tl.constexpr,
):  # fmt: skip
    """SwigluGroupGrad (swiglu_group_grad.md 3) in its operation order: ``(grad_gate, grad_up, key)``.

    Open-interval masks from the raw inputs, **multiplied** (a mask of 1.0 is bit-identical to skipping the
    multiply, so the clamp is a runtime argument: ``has_clamp``, ``hi`` = clamp or +inf, ``cmp`` = clamp
    or NaN), the routing weight ``w`` and the row mask ``m_r`` multiplied too (a masked inf/NaN stays NaN).
    The gate's mask is one compare against ``cmp`` (NaN without a clamp, so that every gate passes); it
    differs from the spec's ``~(g < clamp)`` only for a NaN gate, whose gradient is NaN either way.

    ``FAST`` (the fast reciprocal; ``key``: at least SLOW_KEY wherever this formulation may differ from the
    exact one, whose redo then replaces the rows): the sigmoid's operand ``den`` must be below 2**126 (a
    gate below -87.3, -inf or NaN is not), and the gate finite, which ``den + f`` checks at once (``f`` =
    g * s is +inf for g = +inf and at least -0.28 otherwise), so the infinite gates' fixes go.
    """
    m_g = tl.where(g >= cmp, 0.0, 1.0)
    m_u = tl.where(has_clamp & ~(tl.abs(u) < clamp), 0.0, 1.0)
    # NaN-propagating min/max against [lo, hi] (+-inf without clamp): one min.NaN/max.NaN each on sm_80+.
    g = _min_nan(g, hi)
    u = _clip(u, hi)
    s, key = _sigmoid(g, FAST)
    if FAST:
        f = g * s
        sp = (s + f) - (f * s)
        key = (key.to(tl.float32, bitcast=True) + f).to(tl.uint32, bitcast=True)
    else:
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
    return dg, du, key


# --------------------------------------------------------------------- the GLU family: the layout


@triton.jit
def _cols(K: tl.constexpr, VEC: tl.constexpr):
    """``[0, K)``, hinted contiguous in runs of ``VEC`` (0: no hint): the MX tiles give every thread one
    vector of VEC columns this way (see MX_R4)."""
    if VEC == 0:
        return tl.arange(0, K)
    else:
        return tl.max_contiguous(tl.arange(0, K), VEC)


@triton.jit
def _load_halves(ptr, row_off, j, mask, half, a_index, b_pad):
    """The raw A and B elements of the pairs ``j`` from a row's two halves (A the left one for ``a_index``
    0); masked positions load A = 1.0 and B = ``b_pad`` (0.0, or -bias for the clipped MX forward: the
    padding's values, see ``swiglu_ops.backends.triton.padding``; A = 1 keeps the fast quotient's key low,
    where a zero numerator would send the tile to the exact path; ``b_pad`` None: any values, for callers that
    select them away). ``mask`` None: plain loads."""
    if mask is None:
        a = tl.load((ptr + a_index * half) + (row_off + j))
        b = tl.load((ptr + (1 - a_index) * half) + (row_off + j))
    elif b_pad is None:  # the padding is selected away after the GLU: any values
        a = tl.load((ptr + a_index * half) + (row_off + j), mask=mask)
        b = tl.load((ptr + (1 - a_index) * half) + (row_off + j), mask=mask)
    else:
        a = tl.load((ptr + a_index * half) + (row_off + j), mask=mask, other=1.0)
        b = tl.load((ptr + (1 - a_index) * half) + (row_off + j), mask=mask, other=b_pad)
    return a, b


@triton.jit
def _lane_pairs_in_order(v, K: tl.constexpr, R: tl.constexpr):
    """``[NV, R4, NB, R8, K/NV]`` (vector h, element pair c // 2 of _load_pairs' multi-vector load) ->
    ``[R4, NB, R8, K]`` in pair order NV R/2 * (c // R) + R/2 * h + (c // 2) % (R/2): a register
    renaming."""
    NV: tl.constexpr = v.shape[0]
    by_lane: tl.constexpr = v.shape[:-1] + [2 * K // (NV * R), R // 2]
    return tl.reshape(tl.permute(tl.reshape(v, by_lane), (1, 2, 3, 4, 0, 5)), v.shape[1:4] + [K])


@triton.jit
def _load_pairs(
    ptr, row_off, jb, rows_ok, bound, half, a_index, b_pad, K: tl.constexpr, INTERLEAVED: tl.constexpr,
    VEC: tl.constexpr,
):  # fmt: skip
    """A and B of the pairs ``jb + [0, K)`` of rows of ``2 * half`` elements that start at element
    ``row_off``, widened to fp32; pairs from ``bound`` on (``half``, or what is left of it after ``ptr``)
    and rows not ``rows_ok`` load the padding of ``_load_halves`` (A = 1.0, B = ``b_pad``; ``b_pad`` None:
    any values, for callers that select them away). ``rows_ok`` None: plain loads (no predicates, no
    padding moves), for callers whose addresses all exist.

    Chunked: A and B are the two halves (``_load_halves``). Interleaved: A and B are the even and odd
    elements (A the even one for ``a_index`` 0): one contiguous load of the 2K elements, widened (two
    values per 32-bit register, one instruction each) and then split in registers (vector loads; two loads
    of stride 2 would be scalar). ``row_off``, ``jb`` and ``rows_ok`` broadcast against the trailing
    ``[K]``; ``VEC``: the contiguity hint of the pairs (``_cols``; interleaved: of the 2K elements, 2 VEC).
    """
    if INTERLEAVED:
        a_first = a_index == 0
        # The MX tiles (4-D, VEC pairs per thread = 2 VEC elements, NV 16-byte vectors; the MX forward's
        # 8 pairs, the fp32 backward's 4): a load of [2 VEC] elements per thread would get one vector per
        # lane and NV times the lanes per block-row from Triton's layout (fewer output columns per lane
        # than the codes' stores and the other operand have: another shuffle level in the row amax and a
        # layout conversion through shared memory). So the block-row's 2K elements go on a new outermost
        # axis h as NV vectors per lane: element NV R * (c // R) + R * h + c % R for column c (R: elements
        # per vector), i.e. lane l holds elements [NV R l, NV R (l + 1)) = pairs [VEC l, VEC (l + 1)).
        # After the split, the pair axis (h, c // 2) is permuted back into pair order: the registers stay
        # where they are.
        R: tl.constexpr = 128 // ptr.dtype.element_ty.primitive_bitwidth
        NV: tl.constexpr = 2 * VEC // R
        MULTI_VECTOR: tl.constexpr = NV > 1
        if MULTI_VECTOR:
            c = tl.arange(0, 2 * K // NV)[None, None, None, None, :]
            off = (c // R) * (NV * R) + tl.arange(0, NV)[:, None, None, None, None] * R + c % R
            xc = 2 * jb[None] + tl.max_contiguous(tl.multiple_of(off, [1, 1, 1, 1, R]), [1, 1, 1, 1, R])
            row_off = row_off[None]
            if rows_ok is not None:
                rows_ok = rows_ok[None]
        else:
            xc = 2 * jb + _cols(2 * K, 2 * VEC)
            c = xc
        if rows_ok is None:
            pair = _widen(tl.load(ptr + row_off + xc))
        else:
            if b_pad is None:
                pair = _widen(tl.load(ptr + row_off + xc, mask=rows_ok & (xc < 2 * bound)))
            else:
                pad = tl.where((c % 2 == 0) == a_first, 1.0, b_pad)
                pair = _widen(tl.load(ptr + row_off + xc, mask=rows_ok & (xc < 2 * bound), other=pad))
        even, odd = tl.split(tl.reshape(pair, pair.shape[:-1] + [pair.shape[-1] // 2, 2]))
        if MULTI_VECTOR:
            even, odd = _lane_pairs_in_order(even, K, R), _lane_pairs_in_order(odd, K, R)
        return tl.where(a_first, even, odd), tl.where(a_first, odd, even)
    else:
        j = jb + _cols(K, VEC)
        mask = None if rows_ok is None else rows_ok & (j < bound)
        a, b = _load_halves(ptr, row_off, j, mask, half, a_index, b_pad)
        return _widen(a), _widen(b)


@triton.jit
def _store_pairs(
    ptr, row_off, jb, rows_ok, bound, half, a_index, va, vb, K: tl.constexpr, INTERLEAVED: tl.constexpr,
    HW_CVT: tl.constexpr,
):  # fmt: skip
    """Stores A's and B's fp32 results, rounded to the output dtype, at the columns ``_load_pairs`` read
    (interleaved: joined in registers, one contiguous store)."""
    DTYPE: tl.constexpr = ptr.dtype.element_ty
    va = _narrow(va, DTYPE, HW_CVT)
    vb = _narrow(vb, DTYPE, HW_CVT)
    if INTERLEAVED:
        xc = 2 * jb + tl.arange(0, 2 * K)
        a_first = a_index == 0
        pair = tl.join(tl.where(a_first, va, vb), tl.where(a_first, vb, va))
        pair = tl.reshape(pair, [pair.shape[0], 2 * K])
        tl.store(ptr + row_off + xc, pair, mask=rows_ok & (xc < 2 * bound))
    else:
        j = jb + tl.arange(0, K)
        mask = rows_ok & (j < bound)
        tl.store((ptr + a_index * half) + (row_off + j), va, mask=mask)
        tl.store((ptr + (1 - a_index) * half) + (row_off + j), vb, mask=mask)


# ---------------------------------------------------------- ClippedSwiglu / ClippedSwigluGrad


@triton.jit
def _clipped_tile(
    x_ptr, dy_ptr, out_ptr, r, row_ok, live, p0, half, a_index, alpha, limit, bias,
    BACKWARD: tl.constexpr, INTERLEAVED: tl.constexpr, MODE: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr, FAST: tl.constexpr, DEN_KEY: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """One tile of ``clipped_swiglu_kernel``; returns the keys of its fast quotients (0 if exact).

    Addresses are a pointer per row at the tile's first pair (64-bit arithmetic once per row: the tensor
    may hold 2**31 elements or more; a row holds fewer, ``MAX_ROW_ELEMENTS`` of the launcher, so ``2 * half``
    and ``2 * p0`` fit 32 bits) plus 32-bit offsets within the tile, bounded by ``rem``, the pairs left in
    the row. Rows past ``valid_rows`` (not ``live``, with ``HAS_MASK``) get +0.0 from a second, predicated
    store of zeros (instead of a select per element: every functor is not +0.0 on the padding)."""
    DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    rem = tl.minimum(half - p0, BLOCK).to(tl.int32)
    x_row = x_ptr + r * (2 * half)
    xp = x_row + 2 * p0 if INTERLEAVED else x_row + p0
    a, b = _load_pairs(xp, 0, 0, live, rem, half, a_index, 0.0, BLOCK, INTERLEAVED, 0)
    if INTERLEAVED:  # dy and y in the split's register layout: the x vector's pairs per thread
        KVEC: tl.constexpr = 64 // x_ptr.dtype.element_ty.primitive_bitwidth
        j = tl.max_contiguous(tl.arange(0, BLOCK), KVEC)
    else:
        j = tl.arange(0, BLOCK)
    if HAS_MASK:
        dead = row_ok & ~live
    if BACKWARD:
        dy = _widen(tl.load((dy_ptr + r * half + p0) + j, mask=live & (j < rem), other=0.0))
        da, db, key = _glu_bwd(a, b, dy, alpha, limit, bias, True, MODE, FAST, DEN_KEY)
        op = out_ptr + 2 * p0 if INTERLEAVED else out_ptr + p0
        op = op + r * (2 * half)
        _store_pairs(op, 0, 0, live, rem, half, a_index, da, db, BLOCK, INTERLEAVED, HW_CVT)
        if HAS_MASK:
            zero = tl.zeros_like(da)
            _store_pairs(op, 0, 0, dead, rem, half, a_index, zero, zero, BLOCK, INTERLEAVED, HW_CVT)
    else:
        y = _narrow(_glu_fwd(a, b, alpha, limit, bias, True, MODE, False), DTYPE, HW_CVT)
        yp = (out_ptr + r * half + p0) + j
        tl.store(yp, y, mask=live & (j < rem))
        if HAS_MASK:
            tl.store(yp, tl.zeros_like(y), mask=dead & (j < rem))
    if FAST:
        return key
    else:
        return 0


@triton.jit(do_not_specialize=["rows", "chunk0", "n_chunks"])
def clipped_swiglu_kernel(
    x_ptr, dy_ptr, valid_ptr, out_ptr,
    rows, half, chunk0, n_chunks, alpha, limit, bias,
    A_INDEX: tl.constexpr, BACKWARD: tl.constexpr, INTERLEAVED: tl.constexpr, MODE: tl.constexpr,
    HAS_MASK: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
    DEN_KEY: tl.constexpr, HW_CVT: tl.constexpr,
):  # fmt: skip
    """``ROWS`` rows x ``CHUNKS`` chunks of ``BLOCK`` pairs of ClippedSwiglu (y = the forward, rounded) or,
    with ``BACKWARD``, ClippedSwigluGrad (grad_x at x's positions): row tile ``program_id(0)``, the chunks
    from ``CHUNKS * (chunk0 + program_id(1))`` on (of the ``n_chunks`` of a row), in a loop: the rows'
    setup and the fast path's reduction of its keys are paid once per program.
    Rows at or past ``valid_rows`` are not loaded and are written as +0.0. ``A_INDEX`` (which half is
    activated) is a constexpr: a runtime value costs a select per element and half in the interleaved
    layout.
    ``HW_CVT``: the hardware conversions and, in the backward, the fast reciprocals and quotients, with the
    tile again on the exact path if one of them may be inexact (the forward keeps ``div.rn``: _glu_fwd)."""
    FAST: tl.constexpr = HW_CVT and BACKWARD
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    c0 = (chunk0 + tl.program_id(1)).to(tl.int64) * CHUNKS
    c1 = tl.minimum(c0 + CHUNKS, n_chunks)
    row_ok = r < rows
    if HAS_MASK:
        live = row_ok & (r < tl.load(valid_ptr))
    else:
        live = row_ok
    if FAST:  # the largest key per position of the tile
        kmax = tl.zeros([ROWS, BLOCK], dtype=tl.uint32)
    for c in range(c0, c1):
        key = _clipped_tile(
            x_ptr, dy_ptr, out_ptr, r, row_ok, live, c * BLOCK, half, A_INDEX, alpha, limit, bias,
            BACKWARD, INTERLEAVED, MODE, HAS_MASK, BLOCK, FAST, DEN_KEY, HW_CVT,
        )  # fmt: skip
        if FAST:
            kmax = tl.maximum(kmax, key)
    if FAST:
        worst = tl.max(kmax)
        if worst >= SLOW_KEY:
            _cold_path_marker(worst)
            for c in range(c0, c1):
                _clipped_tile(
                    x_ptr, dy_ptr, out_ptr, r, row_ok, live, c * BLOCK, half, A_INDEX, alpha, limit, bias,
                    BACKWARD, INTERLEAVED, MODE, HAS_MASK, BLOCK, False, DEN_KEY, HW_CVT,
                )  # fmt: skip


# ---------------------------------------------------------------------------------- swiglu_group_grad


#: The hidden-dim loop unrolled by 2: the prefetched chunk's registers then alternate between two sets
#: instead of being copied into the current chunk's each iteration (2.75 MOVs per pair in fp32, 1.4 PRMTs in
#: bf16; benchmarks/sass_budget.py counts the unrolled body as GROUP_GRAD_UNROLL iterations).
GROUP_GRAD_UNROLL = tl.constexpr(2)


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
    g, u = _load_halves(
        x_ptr, r[:, None] * (2 * hidden), h[None, :], rows_ok & (h < hidden)[None, :], hidden, 0, 0.0
    )
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
    cmp = tl.where(has_clamp, clamp, float("nan"))
    w = 1.0
    m_r = 1.0
    if HAS_WEIGHT:
        w = tl.load(w_ptr + r, mask=row_ok, other=0.0)[:, None]
        gw = tl.zeros([ROWS], dtype=tl.float32)
    if HAS_MASK:
        m_r = tl.where(r < tl.load(valid_ptr), 1.0, 0.0)[:, None]
    if HW_CVT:  # the largest key of the fast reciprocals, per position of the chunk
        kmax = tl.zeros([ROWS, BLOCK_H], dtype=tl.uint32)
    if PREFETCH:
        n_dy, n_g, n_u, n_yo = _group_grad_loads(
            dy_ptr, x_ptr, yo_ptr, r, row_ok, 0, hidden, BLOCK_H, HAS_WEIGHT
        )
    for h0 in tl.range(0, hidden, BLOCK_H, loop_unroll_factor=GROUP_GRAD_UNROLL):
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
        dg, du, key = _group_grad_fn(
            dy, _widen(raw_g), _widen(raw_u), w, m_r, clamp, hi, cmp, has_clamp, HAS_WEIGHT, HAS_MASK, HW_CVT
        )
        if HW_CVT:
            kmax = tl.maximum(kmax, key)
        _store_pairs(
            gx_ptr, r[:, None] * (2 * hidden), h0, row_ok[:, None], hidden, hidden, 0, dg, du, BLOCK_H, False,
            HW_CVT,
        )  # fmt: skip
        if HAS_WEIGHT:
            gw += tl.sum(dy * _widen(raw_yo), axis=1)
    if HAS_WEIGHT:
        tl.store(gw_ptr + r, 0.0 + gw, mask=row_ok)
    if HW_CVT:
        # Rare: a reciprocal outside the fast path's range (gate < -87.3, or -inf) in these rows. grad_x of
        # the rows again, on the exact path (grad_weight does not depend on it).
        worst = tl.max(kmax)
        if worst >= SLOW_KEY:
            _cold_path_marker(worst)
            for h0 in range(0, hidden, BLOCK_H):
                raw_dy, raw_g, raw_u, _ = _group_grad_loads(
                    dy_ptr, x_ptr, yo_ptr, r, row_ok, h0, hidden, BLOCK_H, False
                )
                dg, du, _ = _group_grad_fn(
                    _widen(raw_dy), _widen(raw_g), _widen(raw_u), w, m_r, clamp, hi, cmp, has_clamp,
                    HAS_WEIGHT, HAS_MASK, False,
                )  # fmt: skip
                _store_pairs(
                    gx_ptr, r[:, None] * (2 * hidden), h0, row_ok[:, None], hidden, hidden, 0, dg, du,
                    BLOCK_H, False, HW_CVT,
                )  # fmt: skip


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
    if SCALE_ALG == 1:
        # RCEIL: the biased exponent of p = amax * fp32(1/max), rounded up when p's fraction is non-zero
        # ((p + 0x7FFFFF) >> 23 for a normal p); a subnormal p rounds up to code 1 only above 2**-127, which
        # adding 0x400000 less gives. On the unsigned bits an inf p gives 0xFF and a NaN p more, so one
        # min makes every non-finite block 0xFF (finite blocks stay below: p < 2**128).
        p = (amax.to(tl.float32, bitcast=True) * inv_max).to(tl.uint32, bitcast=True)
        round_up = tl.where(p < 0x800000, 0x3FFFFF, 0x7FFFFF).to(tl.uint32)
        code = tl.minimum((p + round_up) >> 23, 0xFF).to(tl.int32)
        recip = (254 - code) << 23
    else:
        # OCP floor: max(Ef - emax, 0); amax zero or fp32-subnormal (Ef == 0) is a zero block: multiplier 0.
        ef = amax >> 23
        code = tl.maximum(ef - emax, 0)
        recip = (254 - code) << 23
        if FP4:
            recip = tl.where(code >= 254, 0x00400000, recip)
        recip = tl.where(ef == 0, 0, recip)
        code = tl.where(amax < 0x7F800000, code, 0xFF)
    return code, recip.to(tl.float32, bitcast=True)


@triton.jit
def _elem_code(t, mbits, bias, max_code, x_max, SIGN_SHIFT: tl.constexpr, ROUND: tl.constexpr):
    """``mx.encode`` of fp32 ``t`` into an element code (int32): FP8 (E4M3, E5M2: ``SIGN_SHIFT`` 24, the
    sign in bit 7, ``ROUND`` RINT) or an FP4 nibble (E2M1, E1M2: ``SIGN_SHIFT`` 28, sign 0x8, any round
    mode). ``t`` is rounded on the format's grid (quantum ``2**(max(e, emin) - mbits)``, emin = 1 - bias),
    finite magnitudes past the largest code and +-inf saturate (``x_max``: a magnitude from which every
    value saturates), the sign bit is t's (-0 and negative values that round to 0 keep it), NaN -> 0.

    Exact fp32 arithmetic, so the same bits for every fp32 ``t`` on a GPU and in the interpreter
    (tests/test_triton_backend.py checks every 16-bit pattern, every code's value and every tie with its
    neighbours, in each format and round mode). With ``p`` the power of two of ``x = min(|t|, x_max)`` (its
    exponent bits; 0 for an fp32 subnormal) and ``q = max(p, 2**emin)``, the quantum is
    ``Q = q * 2**-mbits`` and ``(x + c) - c`` with ``c = 1.5 * 2**23 * Q`` is ``x`` rounded to a multiple
    of Q, ties to even: the sum lies in ``[2**23 Q, 2**24 Q)``, whose fp32 step is Q, and the difference
    is exact. Ties away from zero add Q where ``x`` lay exactly half-way (``x - rv`` is exact); ``floor``
    (the signed value rounded down: a negative value's magnitude goes up) rounds ``x`` carrying t's sign
    and steps down by Q where that went up. A normal result's code is its fp32 bits shifted down to
    ``mbits`` mantissa bits less the exponent's rebias; a subnormal one's, those of ``2**emin + rv`` less
    one binade more; a carry into the next binade lands on its first code."""
    bits = t.to(tl.int32, bitcast=True)
    nan = t != t
    x = tl.where(nan, 0.0, tl.minimum(tl.abs(t), x_max))
    two_emin = tl.cast(tl.cast((128 - bias) << 23, tl.int32), tl.float32, bitcast=True)
    q = tl.maximum((x.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True), two_emin)
    step = tl.cast(
        tl.cast((127 - mbits) << 23, tl.int32), tl.float32, bitcast=True
    )  # 2**-mbits: Q = q * step
    c = q * (step * _RNE_MAGIC)
    if ROUND == ROUND_FLOOR:  # the signed value
        x = (x.to(tl.int32, bitcast=True) | (bits & -0x80000000)).to(tl.float32, bitcast=True)
    rv = (x + c) - c
    if ROUND == ROUND_HALF_AWAY:
        rv += tl.where(x - rv == q * (step * 0.5), q * step, 0.0)
    elif ROUND == ROUND_FLOOR:
        rv = tl.abs(rv - tl.where(rv > x, q * step, 0.0))
    sub = rv < two_emin
    w = tl.where(sub, rv + two_emin, rv).to(tl.int32, bitcast=True)
    code = (w >> (23 - mbits)) - (tl.where(sub, 128 - bias, 127 - bias) << mbits)
    code = tl.minimum(code, max_code)
    return tl.where(nan, 0, code | ((bits >> SIGN_SHIFT) & (0x8 if SIGN_SHIFT == 28 else 0x80)))


#: 1.5 * 2**23: ``(y + _RNE_MAGIC * Q) - _RNE_MAGIC * Q`` is ``y`` rounded to a multiple of the power of two
#: Q, ties to even, for |y| < 2**22 * Q (the sum lies in [2**23 Q, 2**24 Q), where the fp32 step is Q).
_RNE_MAGIC = tl.constexpr(12582912.0)

#: The element formats' constants, compile-time (taken at run time they cost the GPT-OSS MX backward a
#: register spill on sm_100), from ``swiglu_ops.numerics.mx``'s format table, the one place they are written.
#: ``*_SATURATED``: a magnitude from which every finite value saturates, in every format of the family.
_E4M3_MBITS = tl.constexpr(_mx.E4M3FN.mbits)
_E4M3_BIAS = tl.constexpr(_mx.E4M3FN.bias)
_E4M3_MAX_CODE = tl.constexpr(_mx.E4M3FN.max_code)
_E5M2_MBITS = tl.constexpr(_mx.E5M2.mbits)
_E5M2_BIAS = tl.constexpr(_mx.E5M2.bias)
_E5M2_MAX_CODE = tl.constexpr(_mx.E5M2.max_code)
_FP8_SATURATED = tl.constexpr(2.0 ** (max(_mx.E4M3FN.emax, _mx.E5M2.emax) + 1))
assert _mx.E2M1.bias == _mx.E1M2.bias and _mx.E2M1.max_code == _mx.E1M2.max_code  # (mbits: an argument)
_FP4_BIAS = tl.constexpr(_mx.E2M1.bias)
_FP4_MAX_CODE = tl.constexpr(_mx.E2M1.max_code)
_FP4_SATURATED = tl.constexpr(2.0 ** (max(_mx.E2M1.emax, _mx.E1M2.emax) + 1))


@triton.jit
def _fp8_code(t, E5M2: tl.constexpr):
    """:func:`_elem_code` for E4M3 or (``E5M2``) E5M2, ties to even."""
    if E5M2:
        return _elem_code(t, _E5M2_MBITS, _E5M2_BIAS, _E5M2_MAX_CODE, _FP8_SATURATED, 24, ROUND_RINT)
    else:
        return _elem_code(t, _E4M3_MBITS, _E4M3_BIAS, _E4M3_MAX_CODE, _FP8_SATURATED, 24, ROUND_RINT)


@triton.jit
def _fp4_code(t, mbits, ROUND: tl.constexpr):
    """:func:`_elem_code` for FP4 E2M1 (``mbits`` 1) or E1M2 (``mbits`` 2), by ``ROUND``."""
    return _elem_code(t, mbits, _FP4_BIAS, _FP4_MAX_CODE, _FP4_SATURATED, 28, ROUND)


def _cvt_fp8x2(fmt: str) -> str:
    """The PTX conversion of two fp32 values to FP8 codes (``e4m3`` or ``e5m2``) on the ``HW_CVT`` path:
    RNE, saturating to the largest finite (:func:`_mx_codes` says why it is the encode's rule)."""
    return f"cvt.rn.satfinite.{fmt}x2.f32"


def _cvt_fp8x4_asm(fmt: str, masked: bool) -> tl.constexpr:
    """PTX converting four fp32 values ($1..$4) to FP8 codes packed into one 32-bit register ($0), value
    $1 in the lowest byte: each ``cvt ... d, a, b`` puts ``a`` in the upper and ``b`` in the lower byte, and
    ``mov.b32 $0, {lo, hi}`` puts ``lo`` in the lower half. ``masked``: the four values share one block,
    whose scale code is $5 (= $6..$8); a non-finite block's (0xFF) codes are all 0x00: one compare and
    select per four codes instead of a select per value before the conversion."""
    cvt = _cvt_fp8x2(fmt)
    if not masked:
        body = f"{cvt} lo, $2, $1;\n{cvt} hi, $4, $3;\nmov.b32 $0, {{lo, hi}};"
        return tl.constexpr("{ .reg .b16 lo, hi;\n" + body + " }")
    body = f"{cvt} lo, $2, $1;\n{cvt} hi, $4, $3;\nmov.b32 c, {{lo, hi}};"
    body += "\nsetp.eq.u32 p, $5, 255;\nselp.b32 $0, 0, c, p;"
    return tl.constexpr("{ .reg .b16 lo, hi; .reg .b32 c; .reg .pred p;\n" + body + " }")


_CVT_E4M3X4 = _cvt_fp8x4_asm("e4m3", False)
_CVT_E5M2X4 = _cvt_fp8x4_asm("e5m2", False)
_CVT_E4M3X4_MASKED = _cvt_fp8x4_asm("e4m3", True)
_CVT_E5M2X4_MASKED = _cvt_fp8x4_asm("e5m2", True)


def _y2_token_asm(fmt: str, row: int) -> tl.constexpr:
    """PTX of one code of the token-contiguous y2 (``TRANSPOSE_Y2`` on the ``HW_CVT`` path): the fp32 value $2
    to its FP8 code (``cvt.rn.satfinite``, as ``_cvt_fp8x4_asm``: its low byte) stored as a byte at
    $1 + ``row`` where $3 (int32) is not 0. $0 is a dummy output. The row offset is an immediate, so one
    address serves the rows of a column that a thread holds."""
    return tl.constexpr(
        "{ .reg .b16 h; .reg .pred p;\n"
        f"{_cvt_fp8x2(fmt)} h, 0f00000000, $2;\n"
        f"setp.ne.b32 p, $3, 0;\n@p st.global.b8 [$1+{row}], h;\nmov.u32 $0, 0; }}"
    )


_Y2_E4M3_0, _Y2_E4M3_1, _Y2_E4M3_2, _Y2_E4M3_3 = (_y2_token_asm("e4m3", row) for row in range(4))
_Y2_E5M2_0, _Y2_E5M2_1, _Y2_E5M2_2, _Y2_E5M2_3 = (_y2_token_asm("e5m2", row) for row in range(4))


@triton.jit
def _y2_token_row(ptr, q, ok, ROW: tl.constexpr, E5M2: tl.constexpr):
    """``_y2_token_asm`` of one row held in registers (``ROW``: its offset from ``ptr``)."""
    if E5M2:
        asm: tl.constexpr = (_Y2_E5M2_0, _Y2_E5M2_1, _Y2_E5M2_2, _Y2_E5M2_3)[ROW]
    else:
        asm: tl.constexpr = (_Y2_E4M3_0, _Y2_E4M3_1, _Y2_E4M3_2, _Y2_E4M3_3)[ROW]
    # q goes in as its bits: Triton 3.6 and older broadcast inline-asm operands pairwise with the pointer's
    # type check, which refuses a float beside a pointer (the PTX reads the same 32-bit register either way)
    q_bits = q.to(tl.int32, bitcast=True)
    tl.inline_asm_elementwise(asm, "=r,l,r,r", [ptr, q_bits, ok], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _row_halves(t):
    """``[2, ..]`` -> its two halves along axis 0 (moved last and split: a renaming where each thread holds
    both halves in registers)."""
    if len(t.shape) == 5:
        return tl.split(tl.permute(t, (1, 2, 3, 4, 0)))
    else:
        return tl.split(tl.permute(t, (1, 2, 3, 0)))


@triton.jit
def _store_y2_tokens(ptr, q, ok, E5M2: tl.constexpr):
    """Stores the FP8 codes of ``q`` ``[R4, NB, R8, 32]`` (the column-wise products, non-finite blocks'
    already +0) where ``ok`` at ``ptr`` (same shape: token-contiguous y2, tokens consecutive along R4), by
    PTX (``_y2_token_asm``) rather than ``tl.store``: Triton's coalescing would give each thread runs of
    consecutive tokens through a layout conversion in shared memory, while each thread already holds rows
    of its columns.

    Row ``4 * r8 + 2 * hi + lo`` of the block: the rows a thread holds are split into tensors of their own,
    so that one address per column (and ``lo``) serves them with immediate offsets. Where the warps cover
    the NB blocks (NB >= 4 for the launcher's 4 warps) a thread holds all four rows in registers and the
    splits are renamings; with NB = 2 the warps split ``lo``, which stays a tensor axis (an address per
    column and ``lo``), and the split of ``hi`` costs a layout conversion (still cheaper, measured, than an
    address per code)."""
    NB: tl.constexpr = q.shape[1]
    shape5: tl.constexpr = [2, 2] + q.shape[1:]  # [hi, lo, NB, R8, 32]
    okb = tl.broadcast_to(ok, q.shape).to(tl.int32)
    q_h0, q_h1 = _row_halves(tl.reshape(q, shape5))  # [lo, NB, R8, 32]
    p_h0, _p_h1 = _row_halves(tl.reshape(ptr, shape5))
    o_h0, o_h1 = _row_halves(tl.reshape(okb, shape5))
    if NB >= 4:
        q00, q01 = _row_halves(q_h0)
        q10, q11 = _row_halves(q_h1)
        p00, _p01 = _row_halves(p_h0)
        o00, o01 = _row_halves(o_h0)
        o10, o11 = _row_halves(o_h1)
        _y2_token_row(p00, q00, o00, 0, E5M2)
        _y2_token_row(p00, q01, o01, 1, E5M2)
        _y2_token_row(p00, q10, o10, 2, E5M2)
        _y2_token_row(p00, q11, o11, 3, E5M2)
    else:
        _y2_token_row(p_h0, q_h0, o_h0, 0, E5M2)
        _y2_token_row(p_h0, q_h1, o_h1, 2, E5M2)


@triton.jit
def _cvt_fp8x4(q, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,r,r,r,r", [q], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def _cvt_fp8x4_masked(q, code, ASM: tl.constexpr):
    code = tl.broadcast_to(code, q.shape)
    return tl.inline_asm_elementwise(
        ASM, "=r,r,r,r,r,r,r,r,r", [q, code], dtype=tl.uint8, is_pure=True, pack=4
    )


@triton.jit
def _mx_products(v, recip, code_s):
    """``v * recip``, +0 for every element of a non-finite block (scale code ``code_s`` 0xFF): what the
    element codes are formed from (:func:`_mx_codes`)."""
    return tl.where(code_s == 0xFF, 0.0, v * recip)


@triton.jit
def _mx_codes(
    v, recip, code_s, mbits, FP4: tl.constexpr, E5M2: tl.constexpr, ROUND: tl.constexpr,
    HW_CVT: tl.constexpr, ROW_VEC: tl.constexpr,
):  # fmt: skip
    """Element codes of ``v * recip``, the element rule of ``mx.quantize_blocks``: ``mx.encode`` of the exact
    product, and 0 for every element of a NaN/inf block (scale code ``code_s`` 0xFF, where recip is not
    used). FP8: uint8 codes; FP4: int32 nibbles (packed by :func:`_store_codes`). ``ROW_VEC``: every four
    consecutive registers of a thread are four columns of one block (row-wise blocks of a tile whose
    loads are vectorised: the launcher's ``ROW_VEC``, 16-byte aligned tensors and N a multiple of 16; the
    compile test checks the layout).

    The fp32 product is exact unless it underflows, far below every format's smallest step: the codes are
    the same, except under FP4 ``floor`` where a negative ``v`` whose product underflows to -0 still gives
    -q (0x9), unless the block's multiplier is 0 (a zero block: +-0) or the block is not finite (0).

    FP8 on the GPU with ``HW_CVT``: ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``, four elements per asm block packed
    into one 32-bit register. For non-NaN inputs it is exactly the encode's rule: IEEE RNE into the format
    (subnormals included, no flush: an fp32 subnormal rounds to a signed zero either way), the sign of zero
    kept, magnitudes past the largest finite (and +-inf) saturate to +-max. It turns NaN into 0x7F/0xFF,
    but a NaN product only comes from a non-finite block (finite block: finite ``v`` times a finite power
    of two), and those elements are replaced by +0.0 before the cast (in both paths), which encodes as
    0x00 (``ROW_VEC``: the four codes of one asm block are zeroed after the cast instead; which four
    elements an asm block gets follows the tile's register layout, so only there). Otherwise
    (and in the interpreter, and for FP4 always) :func:`_elem_code`, ``mx.encode`` in exact fp32 arithmetic.
    """
    nonfinite = code_s == 0xFF
    if HW_CVT and not _INTERPRETED and ROW_VEC and not FP4:
        if E5M2:
            return _cvt_fp8x4_masked(v * recip, code_s, _CVT_E5M2X4_MASKED)
        else:
            return _cvt_fp8x4_masked(v * recip, code_s, _CVT_E4M3X4_MASKED)
    q = _mx_products(v, recip, code_s)
    if FP4:
        code = _fp4_code(q, mbits, ROUND)
        if ROUND == ROUND_FLOOR:
            code = tl.where((q == 0.0) & (v < 0.0) & (recip > 0.0) & ~nonfinite, 0x9, code)
    elif HW_CVT and not _INTERPRETED:
        if E5M2:
            code = _cvt_fp8x4(q, _CVT_E5M2X4)
        else:
            code = _cvt_fp8x4(q, _CVT_E4M3X4)
    else:
        code = _fp8_code(q, E5M2).to(tl.uint8)
    return code


@triton.jit
def _store_codes(ptr, codes, mask, FP4: tl.constexpr):
    """Stores element codes ``[.., 32]`` (the columns of 32-column blocks). FP8: a byte each, at ``ptr``
    ``[.., 32]``. FP4: two per byte, element 2j in bits 3:0, at ``ptr`` ``[.., 16]`` (one per byte)."""
    if FP4:
        lo, hi = tl.split(tl.reshape(codes, codes.shape[:-1] + [MX_BLOCK // 2, 2]))
        tl.store(ptr, (lo | (hi << 4)).to(tl.uint8), mask=mask)
    else:
        tl.store(ptr, codes, mask=mask)


# The dual-axis tile: ``[MX_R4, NB, MX_R8, K]``, 32 rows x NB column blocks; row ``MX_R4 * r8 + r4`` of the
# 32-row block (r4 on dim 0, r8 on dim 2), column ``K * block + c``. The columns' contiguity is hinted to
# the vector width (``_block_cols``), so Triton's coalescing gives every thread a 16-byte vector of
# consecutive columns in each of MX_R4 consecutive rows, spreads the lanes over the columns of a block and
# the 8 row groups, and the warps over the blocks (with more warps than blocks, over the rows): a 32 x 32
# block lies in one warp (or two), and both amax reductions are a few registers plus lane shuffles (the old
# [32, NB, 32] tile put the rows of a block across all warps). Addresses are a 64-bit base per program
# (the block's first row) plus 32-bit offsets within the block (``WIDE``: 64-bit, for rows of 2**26
# elements or more): the loop over the tiles keeps a few 32-bit row offsets instead of a 64-bit pointer
# per row and tensor.
MX_R4 = tl.constexpr(4)
MX_R8 = tl.constexpr(8)


@triton.jit
def _block_rows():
    """``[MX_R4, 1, MX_R8, 1]``: the rows 0..31 of a block in the tile layout."""
    return tl.arange(0, MX_R8)[None, None, :, None] * MX_R4 + tl.arange(0, MX_R4)[:, None, None, None]


@triton.jit
def _block_cols(K: tl.constexpr, VEC: tl.constexpr):
    """``[1, 1, 1, K]``: the columns of a block, hinted contiguous in runs of VEC (the vector width)."""
    return _cols(K, VEC)[None, None, None, :]


@triton.jit
def _mx_row_block(ends_ptr, m, num_groups, blocks_per_slice, s2_rows, width, GROUPED: tl.constexpr,
                  GROUP_CHUNK: tl.constexpr, WIDE: tl.constexpr):  # fmt: skip
    """The 32-row block of this program (axis 0: batch slice x row-block), shared by both MX kernels.

    Returns ``(row0, rl, rows_ok, live, last, dead, first, s2_base, s2_cols, nonempty)``: the block's first
    flattened [B*M] row (int64), its rows ``[MX_R4, 1, MX_R8, 1]`` relative to row0 (int32; int64 if
    ``WIDE``), which of them exist (are stored), which are loaded (rows of a group; the tail past the last
    clamped group end loads nothing, so its y1, mxscale1 and y2 come out as zeros), the last row that
    exists (int32 scalar), whether the block is such a tail block (scalar), the slice's first flattened
    row, the element offset of the block's mxscale2 slot (``[B, R, width, 2]``: row ``base + t // 2``, slot
    ``t % 2``, column 0), the columns of mxscale2 to write (0 for the tail: those slots stay as the caller
    zero-filled them), and whether the program has a block at all.
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
    first = batch.to(tl.int64) * m  # first flattened row of the slice
    rl = _block_rows()
    if WIDE:
        rl = rl.to(tl.int64)
    rows = tl.minimum(end - row0, MX_BLOCK).to(tl.int32)
    rows_ok = rl < rows
    live = rl < tl.minimum(tl.maximum(load_end - row0, 0), MX_BLOCK).to(tl.int32)
    s2_base = ((batch.to(tl.int64) * s2_rows + base + t // 2) * width) * 2 + t % 2
    return first + row0, rl, rows_ok, live, rows - 1, load_end <= row0, first, s2_base, s2_cols, row0 < end


@triton.jit
def _max_u16x2(a, b):
    """Both 16-bit halves' unsigned maxima (``max.u16x2``, one instruction on sm_90+; integer ops in the
    interpreter)."""
    if _INTERPRETED:
        return tl.maximum(a & 0xFFFF, b & 0xFFFF) | tl.maximum(a & -65536, b & -65536)
    else:
        return tl.inline_asm_elementwise(
            "max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1
        )


@triton.jit
def _reduce_u16x2(packed, axis: tl.constexpr):
    """Both 16-bit halves' maxima along ``axis``. The interpreter runs a reduction with a jitted combine
    function element by element in Python (minutes for these tests), so there each half is reduced by the
    builtin max: the packing around it is still checked."""
    if _INTERPRETED:
        return tl.max(packed & 0xFFFF, axis=axis) | tl.max(packed & -65536, axis=axis)
    else:
        return tl.reduce(packed, axis, _max_u16x2)


_BF16X2_ROUND = tl.constexpr("""{ .reg .b32 p;
cvt.rn.bf16x2.f32 p, $4, $3;
and.b32 p, p, $5;
shl.b32 $0, p, 16;
and.b32 $1, p, 0xFFFF0000;
and.b32 $2, p, 0x7FFF7FFF;
}""")


@triton.jit
def _round_bf16_pairs(v, keep):
    """The GPU path (``HW_CVT``) of the bf16 rounding in :func:`_mx_quantize`: fp32 ``v`` ``[.., 32]``
    rounded to bf16 (RNE) and widened back, and the rounded magnitudes' bits two columns per register
    (:func:`_pack_bf16x2`'s result): one ``cvt.rn.bf16x2.f32`` per two columns is that register itself
    (its sign bits cleared by one ``and``), so the reductions need no packing. ``keep`` (None, or a
    per-column mask that broadcasts to ``v``): the columns where it is false come out as +0.0, by one
    ``and`` per two columns of the rounded register (a mask formed once per column pair) instead of a
    select per element."""
    even, odd = tl.split(tl.reshape(v, v.shape[:-1] + [v.shape[-1] // 2, 2]))
    if keep is None:
        mask = tl.full([1] * len(v.shape), -1, tl.int32)
    else:
        cols = tl.broadcast_to(keep, [1, v.shape[1], 1, v.shape[-1]])
        ke, ko = tl.split(tl.reshape(cols, [1, v.shape[1], 1, v.shape[-1] // 2, 2]))
        mask = tl.where(ke, 0xFFFF, 0) | tl.where(ko, -65536, 0)
    we, wo, packed = tl.inline_asm_elementwise(
        _BF16X2_ROUND, "=r,=r,=r,r,r,r", [even, odd, mask], dtype=(tl.float32, tl.float32, tl.int32),
        is_pure=True, pack=1,
    )  # fmt: skip
    return tl.reshape(tl.join(we, wo), v.shape), packed


@triton.jit
def _pack_bf16x2(w):
    """The magnitudes' bits of widened bf16 values ``w`` ``[.., 32]`` with two columns per 32-bit register
    (``[.., 16]`` int32: column 2k in the low half, 2k + 1 in the high half; the bf16 magnitudes' bits
    order like the magnitudes, NaN above inf, as the fp32 bits do): what :func:`_amax_bf16x2` reduces.
    A shift and one three-input logic op per two columns."""
    lo, hi = tl.split(tl.reshape(w.to(tl.uint32, bitcast=True), w.shape[:-1] + [w.shape[-1] // 2, 2]))
    return (((lo >> 16) | hi) & 0x7FFF7FFF).to(tl.int32, bitcast=True)


@triton.jit
def _amax_bf16x2(packed):
    """The row-wise and column-wise block amax of a tile of bf16 values, from their magnitudes' bits with
    two columns per 32-bit register (``packed`` ``[R4, NB, R8, 16]``, :func:`_pack_bf16x2`): each
    reduction step and shuffle serves two columns. Returns the magnitudes' fp32 bits ``[R4, NB, R8]``
    (rows) and ``[NB, 32]`` (columns)."""
    rows = _reduce_u16x2(packed, 3)
    rows = tl.maximum(rows << 16, rows & -65536)
    cols = _reduce_u16x2(_reduce_u16x2(packed, 0), 1)  # [NB, 16]
    cols = tl.reshape(tl.join(cols << 16, cols & -65536), [cols.shape[0], MX_BLOCK])
    return rows, cols


@triton.jit
def _tile_edges(rl, last, jb, n, K: tl.constexpr, PLAIN_LOADS: tl.constexpr):
    """The rows and the first pairs of K-pair blocks that an MX tile loads: with ``PLAIN_LOADS`` the rows
    past the block's ``last`` row read that row again and the blocks past N the last block (copies:
    ``_mx_quantize``'s ``COPIES``), so that every address exists and the loads need no mask; else the rows
    ``rl`` and blocks ``jb`` themselves, whose loads are masked to the padding."""
    if PLAIN_LOADS:
        return tl.minimum(rl, last), tl.minimum(jb, n - K)
    else:
        return rl, jb


@triton.jit
def _mx_quantize(
    v, rl, rows_ok, dead, ob, ob0, ob_ok, width, s1_stride, y1_ptr, s1_ptr, y2_ptr, s2_ptr, s2_cols, m,
    inv_max, emax, mbits,
    FP4: tl.constexpr, E5M2: tl.constexpr, SCALE_ALG: tl.constexpr, ROUND: tl.constexpr,
    TRANSPOSE_Y2: tl.constexpr, HW_CVT: tl.constexpr, DTYPE: tl.constexpr, COPIES: tl.constexpr,
    ROW_VEC: tl.constexpr, keep=None,
):  # fmt: skip
    """Both MX quantisations of a tile ``v`` ``[MX_R4, NB, MX_R8, 32]`` (the stage-1 values in fp32,
    rounded here to ``DTYPE``, x's dtype; +0.0 in the columns where ``keep``, a per-column mask, is false):
    output columns ``32 * ob + [0, 32)`` (``ob`` ``[1, NB, 1, 1]``, the row-wise block index, from
    the scalar ``ob0`` on;
    ``ob_ok``: the mxscale1 slots to write, pad slots included) of the block's rows ``rl`` (relative to the
    block's first row, where ``y1_ptr``, ``s1_ptr`` and ``y2_ptr`` point; y rows have ``width`` codes, FP4
    ``width / 2`` bytes).

    Outside the data ``v`` holds zeros, or with ``COPIES`` (the tiles' plain loads, ``PLAIN_LOADS``) copies
    of the block's own values: rows past the block's last row repeat that row, 32-column blocks past the
    data repeat the last one. A copy of a value already in a block never changes the block's amax, and a
    copy's own codes and scales are never stored, so two things remain: a block ``dead`` (rows past the
    last group end: zeros in the spec) takes scale code 0xFF for its codes (:func:`_mx_codes` writes 0x00
    for it; under RCEIL through a NaN ``inv_max``, one scalar select, else one select per block) and
    stores scale 0, and an mxscale1 pad slot (a block past the data) stores 0.

    From the same registers: the row-wise blocks (axis 3: 32 columns of a row -> y1, mxscale1 slot ``ob``)
    and the column-wise blocks (axes 0 and 2: the 32 rows of a column, zero padded -> y2, mxscale2 at
    ``s2_ptr + 2 * column`` for columns below ``s2_cols``). With ``TRANSPOSE_Y2`` (FP8), y2 is
    token-contiguous: row ``rl`` of column ``c`` at ``y2_ptr + c * m + rl``. bf16 values: the amax
    reductions take two columns per register (:func:`_pack_bf16x2`; on the GPU path straight from the
    rounding, :func:`_round_bf16_pairs`).
    """
    if DTYPE == tl.bfloat16 and HW_CVT and not _INTERPRETED:  # the select folded into the rounding
        v, packed = _round_bf16_pairs(v, keep)
    else:
        if keep is not None:
            v = tl.where(keep, v, 0.0)
        v = _round_to_dtype(v, DTYPE, HW_CVT)
        if DTYPE == tl.bfloat16:
            packed = _pack_bf16x2(v)
    # |v| as fp32 bits: they order like the magnitudes (NaN above inf), and the exact widening of a 16-bit
    # value is monotonic, so their integer max is the widened 16-bit amax of the spec.
    bits = v.to(tl.int32, bitcast=True)
    ok = rows_ok & ob_ok
    col = ob * MX_BLOCK + _block_cols(MX_BLOCK, 8)  # [1, NB, 1, 32]
    if FP4:  # byte columns (the width is even)
        y_col = ob * (MX_BLOCK // 2) + _block_cols(MX_BLOCK // 2, 4)
        y_ok = ok & (2 * y_col < width)
        y_off = rl * (width // 2) + y_col
    else:
        y_ok = ok & (col < width)
        y_off = rl * width + col
    if DTYPE == tl.bfloat16:  # two columns per register
        amax1, amax2 = _amax_bf16x2(packed)
    elif HW_CVT and not _INTERPRETED:
        # A NaN-propagating float max of |v| (the abs is an operand modifier of FMNMX: no instruction of its
        # own): the same bits, except a NaN block's amax is the canonical NaN (its scale code is 0xFF too).
        mag = tl.abs(v)
        amax1 = tl.reduce(mag, 3, _max_nan_combine).to(tl.int32, bitcast=True)
        amax2 = tl.reduce(tl.reduce(mag, 0, _max_nan_combine), 1, _max_nan_combine).to(tl.int32, bitcast=True)
    else:
        mag = bits & 0x7FFFFFFF
        amax1 = tl.max(mag, axis=3)
        amax2 = tl.max(tl.max(mag, axis=0), axis=1)
    # Row-wise: 32 consecutive columns of one row.
    if COPIES and SCALE_ALG == 1:  # RCEIL: a NaN multiplier makes every code of a dead block 0xFF
        inv_max = tl.where(dead, float("nan"), inv_max)
    code1, recip1 = _scale_code(amax1, inv_max, emax, SCALE_ALG, FP4)  # [R4, NB, R8]
    s1_code = code1[:, :, :, None]
    if COPIES:
        s1_code = tl.where(dead | (ob * MX_BLOCK >= width), 0, s1_code)
        if SCALE_ALG == 0:
            code1 = tl.where(dead, 0xFF, code1)
    y1 = _mx_codes(v, recip1[:, :, :, None], code1[:, :, :, None], mbits, FP4, E5M2, ROUND, HW_CVT, ROW_VEC)
    _store_codes(y1_ptr + y_off, y1, y_ok, FP4)
    tl.store(s1_ptr + rl * s1_stride + ob, s1_code.to(tl.uint8), mask=ok)
    # Column-wise: 32 rows of one column (rows past the block end are zeros = the padding); the registers'
    # rows (axis 0) first, then the lanes' (axis 2 before, 1 after the first reduction).
    code2, recip2 = _scale_code(amax2, inv_max, emax, SCALE_ALG, FP4)  # [NB, 32]
    if COPIES and SCALE_ALG == 0:
        code2 = tl.where(dead, 0xFF, code2)
    if TRANSPOSE_Y2 and HW_CVT and not _INTERPRETED:
        q2 = _mx_products(v, recip2[None, :, None, :], code2[None, :, None, :])
        # (the copies' blocks of PLAIN_LOADS lie past N, a multiple of 32: one test per block)
        y2_ok = rows_ok & ob_ok & ((ob * MX_BLOCK if COPIES else col) < width)
        # the tile's first column as a 64-bit scalar, the rest as offsets that do not change from tile to
        # tile (32-bit unless WIDE: the launcher sets it where 128 * M reaches 2**31)
        local = (ob - ob0) * MX_BLOCK + _block_cols(MX_BLOCK, 8)
        y2_tile = y2_ptr + (ob0 * MX_BLOCK).to(tl.int64) * m
        _store_y2_tokens(y2_tile + (local.to(rl.dtype) * m + rl), q2, y2_ok, E5M2)
    else:
        y2 = _mx_codes(
            v, recip2[None, :, None, :], code2[None, :, None, :], mbits, FP4, E5M2, ROUND,
            HW_CVT, False,
        )  # fmt: skip
        if TRANSPOSE_Y2:
            y2_off = col.to(tl.int64) * m + rl
        else:
            y2_off = y_off
        _store_codes(y2_ptr + y2_off, y2, y_ok, FP4)
    NB: tl.constexpr = v.shape[1]
    col2 = tl.reshape(ob, [NB, 1]) * MX_BLOCK + tl.arange(0, MX_BLOCK)[None, :]  # [NB, 32]
    s2_ok = tl.reshape(ob_ok, [NB, 1]) & (col2 < s2_cols)
    tl.store(s2_ptr + 2 * col2, code2.to(tl.uint8), mask=s2_ok)


@triton.jit
def _mx_out_bases(y1_ptr, s1_ptr, y2_ptr, s2_ptr, row0, first, s2_base, y_width, s1_width,
                  TRANSPOSE_Y2: tl.constexpr):  # fmt: skip
    """The block's output pointers, shared by both MX kernels: y1 and mxscale1 at row ``row0`` (rows of
    ``y_width`` codes / bytes and ``s1_width`` scales), y2 the same or, with ``TRANSPOSE_Y2``, at token
    ``row0 - first`` of its slice's ``[width, M]`` matrix, and the block's mxscale2 slot."""
    if TRANSPOSE_Y2:
        y2b = y2_ptr + first * y_width + (row0 - first)
    else:
        y2b = y2_ptr + row0 * y_width
    return y1_ptr + row0 * y_width, s1_ptr + row0 * s1_width, y2b, s2_ptr + s2_base


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
    "m", "num_groups", "blocks_per_slice", "s2_rows", "emax", "mbits",
    "n_tiles", "tiles_per_program",
]  # fmt: skip


@triton.jit
def _mx_fwd_tile(
    xb, wb, y1b, s1b, y2b, s2b, tile, rl, rows_ok, live, last, dead, s2_cols,
    m, n, s1_slots, a_index, alpha, limit, glu_bias, b_pad_bits, inv_max, emax, mbits,
    BLOCK_N: tl.constexpr, INTERLEAVED: tl.constexpr, CLIPPED: tl.constexpr, MODE: tl.constexpr,
    FP4: tl.constexpr, E5M2: tl.constexpr, SCALE_ALG: tl.constexpr, ROUND: tl.constexpr,
    TRANSPOSE_Y2: tl.constexpr, PAD_SELECT: tl.constexpr, PLAIN_LOADS: tl.constexpr, HW_CVT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ROW_VEC: tl.constexpr, SMALL_NUM: tl.constexpr,
):  # fmt: skip
    """One tile (32 rows x BLOCK_N output columns) of the forward. ``PLAIN_LOADS`` (N a multiple of 32,
    16-byte aligned tensors): loads without predicates, whose rows past the block's ``last`` row and blocks
    past N read copies (clamped addresses; ``_mx_quantize``'s ``COPIES``); else masked loads of the
    padding (``_load_pairs``). ``HAS_WEIGHT``: the activation times the row's routing weight (``wb``: the
    block's first row's), the last fp32 operation (spec 7.1); the padding stays +0.0 whatever the weight
    (rows not loaded take weight 1, the columns past N are selected away)."""
    NB: tl.constexpr = BLOCK_N // MX_BLOCK
    DTYPE: tl.constexpr = xb.dtype.element_ty
    # pairs (= output columns) per thread and row: 8 interleaved (the codes' 8-byte stores), else a vector
    VEC: tl.constexpr = 8 if INTERLEAVED else 128 // DTYPE.primitive_bitwidth
    ob = tile * NB + tl.arange(0, NB)[None, :, None, None]  # row-wise block, [1, NB, 1, 1]
    # The padding's B in x's dtype from its bits (swiglu_ops.backends.triton.padding): no conversion
    # instruction.
    if DTYPE == tl.float32:
        b_pad = b_pad_bits.to(tl.float32, bitcast=True)
    else:
        b_pad = b_pad_bits.to(tl.int16).to(DTYPE, bitcast=True)
    if PAD_SELECT:
        # The padding's values are not +0.0 (swiglu_ops.backends.triton.padding): they are selected away
        # after the GLU, so the loads need no padding values, and the rows past the block's last one read
        # copies of it (clamped, as with plain loads: never stored, the amax unchanged); the columns past N
        # are masked, and those and a dead block's rows selected away.
        xr, jb = tl.minimum(rl, last), ob * MX_BLOCK
        rows = tl.full([1, 1, 1, 1], 1, tl.int1)
        pad = None
    else:
        xr, jb = _tile_edges(rl, last, ob * MX_BLOCK, n, MX_BLOCK, PLAIN_LOADS)
        rows = None if PLAIN_LOADS else live
        pad = b_pad
    a, b = _load_pairs(xb, xr * (2 * n), jb, rows, n, n, a_index, pad, MX_BLOCK, INTERLEAVED, VEC)
    # APPROX: the codes' GPU path (SMALL_NUM: numerators that may be fp32 subnormals, the launcher's call)
    act = _glu_fwd(a, b, alpha, limit, glu_bias, CLIPPED, MODE, HW_CVT, SMALL_NUM)
    keep = (ob * MX_BLOCK + _block_cols(MX_BLOCK, VEC) < n) & (not dead) if PAD_SELECT else None
    if HAS_WEIGHT:
        if PAD_SELECT or PLAIN_LOADS:  # the rows loaded (copies past the last row): their own weights
            act = act * tl.load(wb + xr)
        else:  # the padding's rows: weight 1; its columns: selected away below
            act = act * tl.load(wb + rl, mask=live, other=1.0)
            keep = (ob * MX_BLOCK + _block_cols(MX_BLOCK, VEC) < n) & (not dead)
    _mx_quantize(
        act, rl, rows_ok, dead, ob, tile * NB, ob < s1_slots, n, s1_slots, y1b, s1b, y2b, s2b, s2_cols, m,
        inv_max, emax, mbits, FP4, E5M2, SCALE_ALG, ROUND, TRANSPOSE_Y2, HW_CVT,
        DTYPE, PLAIN_LOADS, ROW_VEC, keep,
    )  # fmt: skip


@triton.jit(do_not_specialize=[*_MX_NOT_SPECIALIZED, "s1_slots"])
def swiglu_mx_quant_kernel(
    x_ptr, ends_ptr, y1_ptr, s1_ptr, y2_ptr, s2_ptr, w_ptr,
    m, n, num_groups, blocks_per_slice, s2_rows, s1_slots, alpha, limit, glu_bias, b_pad_bits,
    inv_max, emax, mbits, n_tiles, tiles_per_program, A_INDEX: tl.constexpr,
    PAD_SELECT: tl.constexpr, PLAIN_LOADS: tl.constexpr,
    GROUPED: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_CHUNK: tl.constexpr, INTERLEAVED: tl.constexpr,
    CLIPPED: tl.constexpr, MODE: tl.constexpr, FP4: tl.constexpr, E5M2: tl.constexpr,
    SCALE_ALG: tl.constexpr, ROUND: tl.constexpr, TRANSPOSE_Y2: tl.constexpr, WIDE: tl.constexpr,
    HW_CVT: tl.constexpr, HAS_WEIGHT: tl.constexpr = False, ROW_VEC: tl.constexpr = False,
    SMALL_NUM: tl.constexpr = False,
):  # fmt: skip
    """One 32-row block of one batch slice of the forward operator, ``tiles_per_program`` tiles of
    ``BLOCK_N`` output columns (= pairs) from tile ``tiles_per_program * program_id(1)`` on (of ``n_tiles``).

    Stage 1 (``_glu_fwd``) rounded to x's dtype (fp32 x: not rounded), then ``_mx_quantize``. Output columns
    past N are zeros (a partial last block is scaled from its real columns); the mxscale1 slots up to
    ``s1_slots`` are written, so the pad slot of an odd block count comes out as code 0 (the launcher's
    tiles cover it). ``HAS_WEIGHT``: stage 1 times ``w_ptr[row]`` (fp32, one per flattened row), last.
    """
    row0, rl, rows_ok, live, last, dead, first, s2_base, s2_cols, nonempty = _mx_row_block(
        ends_ptr, m, num_groups, blocks_per_slice, s2_rows, n, GROUPED, GROUP_CHUNK, WIDE
    )
    if not nonempty:
        return
    if FP4:
        y_width = n // 2
    else:
        y_width = n
    xb = x_ptr + row0 * (2 * n)
    y1b, s1b, y2b, s2b = _mx_out_bases(
        y1_ptr, s1_ptr, y2_ptr, s2_ptr, row0, first, s2_base, y_width, s1_slots, TRANSPOSE_Y2
    )
    if HAS_WEIGHT:
        wb = w_ptr + row0
    else:
        wb = w_ptr  # None
    t0 = tl.program_id(1) * tiles_per_program
    for tile in range(t0, tl.minimum(t0 + tiles_per_program, n_tiles)):
        _mx_fwd_tile(
            xb, wb, y1b, s1b, y2b, s2b, tile, rl, rows_ok, live, last, dead, s2_cols,
            m, n, s1_slots, A_INDEX, alpha, limit, glu_bias, b_pad_bits, inv_max, emax, mbits,
            BLOCK_N, INTERLEAVED, CLIPPED, MODE, FP4, E5M2, SCALE_ALG, ROUND, TRANSPOSE_Y2, PAD_SELECT,
            PLAIN_LOADS, HW_CVT, HAS_WEIGHT, ROW_VEC, SMALL_NUM,
        )  # fmt: skip


# ---------------------------------------------------------- SwigluBackwardMxQuantWithDualAxis (backward)


@triton.jit
def _mx_bwd_tile(
    xb, dyb, wb, y1b, s1b, y2b, s2b, tile, rl, rows_ok, live, last, dead, s2_cols,
    m, n, a_index, alpha, limit, glu_bias, inv_max, emax, mbits,
    BLOCK_N: tl.constexpr, INTERLEAVED: tl.constexpr, CLIPPED: tl.constexpr, MODE: tl.constexpr,
    E5M2: tl.constexpr, SCALE_ALG: tl.constexpr, TRANSPOSE_Y2: tl.constexpr, PAD_SELECT: tl.constexpr,
    PLAIN_LOADS: tl.constexpr, FAST: tl.constexpr, DEN_KEY: tl.constexpr, HW_CVT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ROW_VEC: tl.constexpr,
):  # fmt: skip
    """One tile (32 rows x BLOCK_N pairs) of the backward; returns its largest key (0 if exact) and, with
    ``HAS_WEIGHT``, the tile's part of grad_weight: per row (``[MX_R4, 1, MX_R8, 1]``) the sum of
    ``dy * act16`` over the tile's pairs (``tl.sum``: a fixed tree), act16 the forward's unweighted stage 1
    (exact quotient) rounded to x's dtype. Loads as in ``_mx_fwd_tile``; with ``HAS_WEIGHT`` the masked
    loads also read the rows past the last group end (grad_weight covers every row), whose gradients are
    then selected to +0.0, as are the columns past N (the gradients times the weight)."""
    c = 2 * n
    K: tl.constexpr = MX_BLOCK // 2 if INTERLEAVED else MX_BLOCK  # pairs per 32-column output block
    NB: tl.constexpr = BLOCK_N // K
    DTYPE: tl.constexpr = xb.dtype.element_ty
    VEC: tl.constexpr = 128 // DTYPE.primitive_bitwidth
    # pairs per thread and row: interleaved 4 (8 columns: the codes' 8-byte stores, as in the forward;
    # fp32 loads them as two vectors), chunked a vector
    KVEC: tl.constexpr = 4 if INTERLEAVED else VEC
    blk = tile * NB + tl.arange(0, NB)[None, :, None, None]  # [1, NB, 1, 1]
    xr, jb = _tile_edges(rl, last, blk * K, n, K, PLAIN_LOADS)
    j = jb + _block_cols(K, KVEC)  # pairs, [1, NB, 1, K]
    ok = live & (j < n)
    loaded = rows_ok if HAS_WEIGHT else live  # rows read (masked loads)
    a, b = _load_pairs(
        xb, xr * c, jb, None if PLAIN_LOADS else loaded, n, n, a_index, 0.0, K, INTERLEAVED, KVEC
    )
    if PLAIN_LOADS:
        dy = _widen(tl.load(dyb + xr * n + jb + _block_cols(K, KVEC)))
    else:
        dy = _widen(tl.load(dyb + xr * n + j, mask=loaded & (j < n), other=0.0))
    ga, gb, key = _glu_bwd(a, b, dy, alpha, limit, glu_bias, CLIPPED, MODE, FAST, DEN_KEY)
    if HAS_WEIGHT:
        if PLAIN_LOADS:  # the rows loaded (copies past the last row): their own weights
            w = tl.load(wb + xr)
        else:
            w = tl.load(wb + rl, mask=rows_ok, other=1.0)
        ga = ga * w
        gb = gb * w
        # grad_weight's part: pairs past N (copies or padding) excluded
        act16 = _round_to_dtype(_glu_fwd(a, b, alpha, limit, glu_bias, CLIPPED, MODE, False), DTYPE, HW_CVT)
        prod = tl.where(blk * K + _block_cols(K, KVEC) < n, dy * act16, 0.0)
        part = tl.sum(tl.sum(prod, axis=3, keep_dims=True), axis=1, keep_dims=True)
    else:
        part = 0.0
    # the padding is not +0.0 (swiglu_ops.backends.triton.padding)
    if PAD_SELECT or (HAS_WEIGHT and not PLAIN_LOADS):
        ga = tl.where(ok, ga, 0.0)
        gb = tl.where(ok, gb, 0.0)
    if INTERLEAVED:
        a_first = a_index == 0
        v = tl.reshape(
            tl.join(tl.where(a_first, ga, gb), tl.where(a_first, gb, ga)), [MX_R4, NB, MX_R8, MX_BLOCK]
        )
        _mx_quantize(
            v, rl, rows_ok, dead, blk, tile * NB, blk * K < n, c, c // MX_BLOCK, y1b, s1b, y2b, s2b, s2_cols,
            m, inv_max, emax, mbits, False, E5M2, SCALE_ALG, ROUND_RINT, TRANSPOSE_Y2, HW_CVT,
            DTYPE, PLAIN_LOADS, ROW_VEC,
        )  # fmt: skip
    else:
        blk_ok = blk * MX_BLOCK < n
        half_blocks = n // MX_BLOCK
        for half in tl.static_range(2):
            if half == 0:
                v = ga
                shift = a_index * half_blocks
            else:
                v = gb
                shift = (1 - a_index) * half_blocks
            _mx_quantize(
                v, rl, rows_ok, dead, blk + shift, tile * NB + shift, blk_ok, c, c // MX_BLOCK, y1b, s1b, y2b,
                s2b, s2_cols, m, inv_max, emax, mbits, False, E5M2, SCALE_ALG, ROUND_RINT,
                TRANSPOSE_Y2, HW_CVT, DTYPE, PLAIN_LOADS, ROW_VEC,
            )  # fmt: skip
    if FAST:
        return tl.max(key), part
    else:
        return 0, part


@triton.jit(do_not_specialize=_MX_NOT_SPECIALIZED)
def swiglu_bwd_mx_quant_kernel(
    x_ptr, dy_ptr, ends_ptr, y1_ptr, s1_ptr, y2_ptr, s2_ptr, w_ptr, gw_ptr,
    m, n, num_groups, blocks_per_slice, s2_rows, alpha, limit, glu_bias,
    inv_max, emax, mbits, n_tiles, tiles_per_program, A_INDEX: tl.constexpr,
    PAD_SELECT: tl.constexpr, PLAIN_LOADS: tl.constexpr,
    GROUPED: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_CHUNK: tl.constexpr, INTERLEAVED: tl.constexpr,
    CLIPPED: tl.constexpr, MODE: tl.constexpr, E5M2: tl.constexpr, SCALE_ALG: tl.constexpr,
    TRANSPOSE_Y2: tl.constexpr, WIDE: tl.constexpr, DEN_KEY: tl.constexpr, HW_CVT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr = False, GW_DIRECT: tl.constexpr = True, ROW_VEC: tl.constexpr = False,
):  # fmt: skip
    """One 32-row block of one batch slice of the backward operator, ``tiles_per_program`` tiles of
    ``BLOCK_N`` pairs from tile ``tiles_per_program * program_id(1)`` on (of ``n_tiles``).

    Loads x and dy once, computes both halves' gradients (``_glu_bwd``), rounds them to x's dtype and
    quantises them at x's columns: chunked, as two tiles (A's and B's half, 32 pairs per block); interleaved,
    as one tile of 32-column blocks of 16 pairs, split from and joined back to x's order in registers.
    ``HW_CVT``: fast reciprocals, and a tile again on the exact path if one may be inexact.

    ``HAS_WEIGHT`` (spec 7.1): the gradients times ``w_ptr[row]`` (fp32, one per flattened row), last; and
    grad_weight: the program adds its tiles' parts in tile order and stores, for each of its rows, ``0.0 +``
    that sum in ``gw_ptr[row]`` (``GW_DIRECT``: one program per row block, ``program_id(1)`` 0) or the sum
    in ``gw_ptr[row, program_id(1)]`` of a ``[B * M, num_programs(1)]`` array, which
    ``mx_grad_weight_kernel`` adds up in order. Deterministic: no atomics, the same order for any device.
    """
    c = 2 * n
    row0, rl, rows_ok, live, last, dead, first, s2_base, s2_cols, nonempty = _mx_row_block(
        ends_ptr, m, num_groups, blocks_per_slice, s2_rows, c, GROUPED, GROUP_CHUNK, WIDE
    )
    if not nonempty:
        return
    xb = x_ptr + row0 * c
    dyb = dy_ptr + row0 * n
    y1b, s1b, y2b, s2b = _mx_out_bases(
        y1_ptr, s1_ptr, y2_ptr, s2_ptr, row0, first, s2_base, c, c // MX_BLOCK, TRANSPOSE_Y2
    )
    if HAS_WEIGHT:
        wb = w_ptr + row0
    else:
        wb = w_ptr  # None
    t0 = tl.program_id(1) * tiles_per_program
    t1 = tl.minimum(t0 + tiles_per_program, n_tiles)
    worst = tl.zeros((), dtype=tl.uint32)
    gw = tl.zeros([MX_R4, 1, MX_R8, 1], dtype=tl.float32)
    for tile in range(t0, t1):
        key, part = _mx_bwd_tile(
            xb, dyb, wb, y1b, s1b, y2b, s2b, tile, rl, rows_ok, live, last, dead, s2_cols,
            m, n, A_INDEX, alpha, limit, glu_bias, inv_max, emax, mbits,
            BLOCK_N, INTERLEAVED, CLIPPED, MODE, E5M2, SCALE_ALG, TRANSPOSE_Y2, PAD_SELECT, PLAIN_LOADS,
            HW_CVT, DEN_KEY, HW_CVT, HAS_WEIGHT, ROW_VEC,
        )  # fmt: skip
        worst = tl.maximum(worst, key)
        gw += part
    if HAS_WEIGHT:
        if GW_DIRECT:
            tl.store(gw_ptr + (row0 + rl), 0.0 + gw, mask=rows_ok)
        else:
            tl.store(gw_ptr + (row0 + rl) * tl.num_programs(1) + tl.program_id(1), gw, mask=rows_ok)
    if HW_CVT:
        # Rare: some fast reciprocal of these tiles may be inexact. All of them again on the exact path, in
        # tiles of 32 pairs (the exact path's branches need more registers: at 64 pairs the chunked tile's
        # redo alone takes ptxas past 255 registers).
        SPLIT: tl.constexpr = (BLOCK_N + 31) // 32  # BLOCK_N a power of 2: max(BLOCK_N // 32, 1)
        if worst >= SLOW_KEY:
            _cold_path_marker(worst)
            for tile in range(SPLIT * t0, SPLIT * t1):  # (grad_weight's parts do not depend on FAST)
                _mx_bwd_tile(
                    xb, dyb, wb, y1b, s1b, y2b, s2b, tile, rl, rows_ok, live, last, dead, s2_cols,
                    m, n, A_INDEX, alpha, limit, glu_bias, inv_max, emax, mbits,
                    BLOCK_N // SPLIT, INTERLEAVED, CLIPPED, MODE, E5M2, SCALE_ALG, TRANSPOSE_Y2, PAD_SELECT,
                    PLAIN_LOADS, False, DEN_KEY, HW_CVT, HAS_WEIGHT, ROW_VEC,
                )  # fmt: skip


@triton.jit(do_not_specialize=["rows", "n_parts"])
def mx_grad_weight_kernel(parts_ptr, gw_ptr, rows, n_parts, BLOCK: tl.constexpr):
    """grad_weight of the weighted MX backward whose rows span several programs: ``gw_ptr[r] = 0.0 +``
    the sum of ``parts_ptr[r, :n_parts]`` (``[rows, n_parts]`` fp32), added in order (deterministic)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = r < rows
    acc = tl.load(parts_ptr + r * n_parts, mask=ok, other=0.0)
    for j in range(1, n_parts):
        acc += tl.load(parts_ptr + r * n_parts + j, mask=ok, other=0.0)
    tl.store(gw_ptr + r, 0.0 + acc, mask=ok)
