"""Scalar numerics shared by the CPU kernels, written so that LLVM vectorises the loops that call them.

Everything is fp32 / 32-bit integer arithmetic with selects (plus LLVM's ``fma`` and ``fpext``/``fptrunc
half``, which vectorise to single instructions), no libm calls and no branches that depend on data, so a
loop over elements compiles to SIMD code. Conversions work on the IEEE bit patterns:

- 16-bit storage (bf16, fp16) is passed as ``uint16`` arrays and fp32 as ``uint32`` arrays; ``kind``
  (``BF16``/``FP16``/``FP32``) says how to read and write them. Narrowing is round-to-nearest-even with
  overflow to inf, exactly like ``torch.Tensor.to`` (bf16 NaN becomes PyTorch's canonical 0x7FC0). fp16
  uses the CPU's conversion instructions where it has them (:data:`HW_HALF`), else integer arithmetic.
- :func:`exp_f32` is a Cody-Waite range reduction plus a degree-6 polynomial evaluated with fused
  multiply-adds, within ~1 ulp of ``torch.exp`` over the whole fp32 range (checked in
  ``tests/test_cpu_backend.py``).
- The MX rules (E8M0 scale codes, FP8 encoding) are :mod:`swiglu_ops.mx` re-expressed per element and tested
  bit-exactly against it.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

BF16, FP16, FP32 = 0, 1, 2
#: fp16 through the integer transcriptions even where hardware conversions exist (the tests keep that
#: fallback checked on every machine).
FP16_SOFT = 3

#: fp16 <-> fp32 conversions in hardware (``fpext``/``fptrunc half``) where the CPU has them: F16C on
#: x86-64, always on AArch64. They round like ``Tensor.to`` (RNE, overflow to inf, subnormals kept) and
#: differ from the integer transcriptions below only in NaN payloads. Without them LLVM would call a
#: soft-float helper, so the integer path stays as the fallback.
HW_HALF = (
    platform.machine().lower() in ("aarch64", "arm64") or "+f16c" in llvm.get_host_cpu_features().flatten()
)

#: A hash of this package's sources. Every kernel captures it as a closure constant, and Numba's on-disk
#: cache key includes closure constants: editing a helper here (inlined into the kernels) therefore
#: invalidates the cached kernels, which Numba's own check (the kernel file's timestamp) would miss.
SOURCE_TAG = int.from_bytes(
    hashlib.sha256(b"".join(f.read_bytes() for f in sorted(Path(__file__).parent.glob("*.py")))).digest()[:7],
    "little",
)

_U32 = np.uint32


@intrinsic
def f32_from_bits(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as fp32 (Numba widens integer arithmetic to 64 bits)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        (value,) = args
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif bits.bitwidth < 32:
            value = builder.zext(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def fma_f32(typingctx, a, b, c):
    """``a * b + c`` with one rounding (``llvm.fma.f32``; vectorises to ``vfmadd`` on x86 with FMA)."""
    if not all(v == types.float32 for v in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def f32_from_f16_bits(typingctx, bits):
    """fp32 value of the fp16 bit pattern in the low 16 bits of an integer (``fpext half``: F16C's
    ``vcvtph2ps`` on x86-64, ``fcvt`` on AArch64). Exact; NaNs come out quiet."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        (value,) = args
        if bits.bitwidth > 16:
            value = builder.trunc(value, ir.IntType(16))
        return builder.fpext(builder.bitcast(value, ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def f16_bits_from_f32(typingctx, value):
    """fp16 bit pattern (as ``uint32``) of fp32 ``value`` rounded to nearest even (``fptrunc``: F16C's
    ``vcvtps2ph`` / AArch64 ``fcvt``): overflow to inf, subnormals kept, NaN stays a (quiet) NaN."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        half = builder.fptrunc(args[0], ir.HalfType())
        return builder.zext(builder.bitcast(half, ir.IntType(16)), ir.IntType(32))

    return types.uint32(value), codegen


@intrinsic
def bits_from_f32(typingctx, value):
    """Reinterpret an fp32 as ``uint32``."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(value), codegen


# ---------------------------------------------------------------------------------------- conversions


@njit(inline="always")
def widen(bits, kind):
    """fp32 value of a stored element (``bits``: uint16 for bf16/fp16, uint32 for fp32). Exact."""
    b = _U32(bits)
    if kind == FP32:
        return f32_from_bits(b)
    if kind == BF16:
        return f32_from_bits(_U32(b << _U32(16)))
    if kind == FP16 and HW_HALF:
        return f32_from_f16_bits(b)
    # fp16: move exponent and mantissa into place and rebias; inf/NaN get the top exponent, subnormals are
    # renormalised with one exact fp32 subtraction (2**-14 * (1 + m/1024) - 2**-14 = m * 2**-24).
    o = _U32((b & _U32(0x7FFF)) << _U32(13))
    e = o & _U32(0x0F800000)
    o = _U32(o + _U32(0x38000000))
    if e == _U32(0x0F800000):
        o = _U32(o + _U32(0x38000000))
    mag = f32_from_bits(o)
    if e == _U32(0):
        mag = f32_from_bits(_U32(o + _U32(0x00800000))) - f32_from_bits(_U32(0x38800000))
    return f32_from_bits(bits_from_f32(mag) | _U32((b & _U32(0x8000)) << _U32(16)))


@njit(inline="always")
def narrow(value, kind):
    """Storage bits (uint32) of fp32 ``value`` rounded to ``kind``: RNE, overflow -> inf, NaN stays NaN."""
    u = bits_from_f32(value)
    if kind == FP32:
        return u
    a = u & _U32(0x7FFFFFFF)
    if kind == BF16:
        r = _U32(_U32(u + _U32(0x7FFF) + ((u >> _U32(16)) & _U32(1))) >> _U32(16))
        return _U32(0x7FC0) if a > _U32(0x7F800000) else r
    if kind == FP16 and HW_HALF:
        return f16_bits_from_f32(value)
    sign = (u >> _U32(16)) & _U32(0x8000)
    if a >= _U32(0x47800000):  # >= 65536 (or inf/NaN): inf, NaN -> quiet NaN
        h = _U32(0x7E00) if a > _U32(0x7F800000) else _U32(0x7C00)
    elif a < _U32(0x38800000):  # below 2**-14: the fp32 add of 0.5 rounds to a multiple of 2**-24 (RNE)
        h = _U32(bits_from_f32(f32_from_bits(a) + np.float32(0.5)) - _U32(0x3F000000))
    else:  # normal: rebias and round the 13 dropped mantissa bits to nearest even (carry may reach inf)
        h = _U32(_U32(a - _U32(0x38000000) + _U32(0xFFF) + ((a >> _U32(13)) & _U32(1))) >> _U32(13))
    return h | sign


# ------------------------------------------------------------------------------------------------ exp

_LOG2E = np.float32(1.442695040888963407359924681001892137)
_RINT_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds |v| < 2**22 to an integer (RNE)
_NLN2_HI = np.float32(-0.693145751953125)  # -ln2 in two parts: 15 significant bits, then the rest
_NLN2_LO = np.float32(-1.428606765330187045e-06)
_P0 = np.float32(0.000198527617612853646278381)
_P1 = np.float32(0.00139304355252534151077271)
_P2 = np.float32(0.00833336077630519866943359)
_P3 = np.float32(0.0416664853692054748535156)
_P4 = np.float32(0.166666671633720397949219)
_P5 = np.float32(0.5)
_EXP_OVERFLOW = np.float32(88.72283935546875)  # above: exp > FLT_MAX
_EXP_UNDERFLOW = np.float32(-104.0)  # below: exp < 2**-150 rounds to 0


@njit(inline="always")
def _pow2i(k):
    """2**k as fp32 for int32-range k in [-126, 127]."""
    return f32_from_bits(_U32((k + 127) << 23))


@njit(inline="always")
def exp_f32(x):
    """exp(x) in fp32 without libm: x = k*ln2 + r, |r| <= ln2/2, exp(r) by polynomial, times 2**k.

    The range reduction and the polynomial use fused multiply-adds (:func:`fma_f32`): fewer instructions
    and less rounding than separate multiplies and adds. This is the only place the kernels use FMA; the
    spec's own operations are never contracted.
    """
    xc = min(x, _EXP_OVERFLOW)  # clamped (NaN kept: min/max return x when it is NaN) so that k stays in
    xc = max(xc, _EXP_UNDERFLOW)  # range: no garbage exponents, no slow subnormal paths
    t = fma_f32(xc, _LOG2E, _RINT_MAGIC)
    kf = t - _RINT_MAGIC
    k = np.int32(np.int32(bits_from_f32(t)) - np.int32(0x4B400000))
    r = fma_f32(kf, _NLN2_HI, xc)
    r = fma_f32(kf, _NLN2_LO, r)
    p = fma_f32(_P0, r, _P1)
    p = fma_f32(p, r, _P2)
    p = fma_f32(p, r, _P3)
    p = fma_f32(p, r, _P4)
    p = fma_f32(p, r, _P5)
    p = fma_f32(r * r, p, r) + np.float32(1.0)
    h = np.int32(k >> 1)  # two factors keep both powers normal down to 2**-150 (subnormal results)
    y = (p * _pow2i(h)) * _pow2i(k - h)
    if x > _EXP_OVERFLOW:
        y = np.float32(np.inf)
    if x < _EXP_UNDERFLOW:
        y = np.float32(0.0)
    return y


@njit(inline="always")
def sigmoid_f32(x):
    """The kernels' sigmoid, ``1 / (1 + exp(-x))`` in fp32 (both operators' specs write it so). The SIMD
    kernels read it from a table of this function's values (``_native.sigmoid_table``)."""
    return np.float32(1.0) / (np.float32(1.0) + exp_f32(-x))


# ------------------------------------------------------------------------------------------------- MX


@njit(inline="always")
def scale_code(amax, scale_alg, emax, inv_max):
    """E8M0 code of a block from the fp32 magnitude bits of its amax (mx.scale_codes, one block)."""
    if scale_alg == 1:  # RCEIL: 127 + ceil(log2(amax / max)), via the exponent of amax * fp32(1/max)
        p = bits_from_f32(f32_from_bits(amax) * inv_max)
        e = p >> _U32(23)
        mf = p & _U32(0x7FFFFF)
        up = (e > _U32(0) and e < _U32(254) and mf > _U32(0)) or (e == _U32(0) and mf > _U32(0x400000))
        code = _U32(e + _U32(1)) if up else e
        zero = amax == _U32(0)
    else:  # OCP floor: biased exponent of amax minus emax, at least 0; fp32-subnormal amax counts as zero
        ef = np.int32(amax >> _U32(23))
        code = _U32(max(ef - np.int32(emax), np.int32(0)))
        zero = ef == np.int32(0)
    if amax >= _U32(0x7F800000):
        return _U32(0xFF)
    return _U32(0) if zero else code


@njit(inline="always")
def scale_reciprocal(code, amax, scale_alg):
    """The fp32 factor 2**(127 - code) applied to the block's elements; 0 for zero blocks, NaN for 0xFF."""
    if amax >= _U32(0x7F800000):
        return np.float32(np.nan)
    zero = amax == _U32(0) if scale_alg == 1 else (amax >> _U32(23)) == _U32(0)
    if zero:
        return np.float32(0.0)
    if code >= _U32(254):
        return f32_from_bits(_U32(0x00200000))  # 2**-127, the only subnormal factor
    return f32_from_bits(_U32((_U32(254) - code) << _U32(23)))


@njit(inline="always")
def fp8_encode(value, mbits, bias, max_code, sub_magic):
    """FP8 code of fp32 ``value``: RNE, saturating, NaN -> 0x00, sign of zero kept (mx.fp8_encode).

    ``sub_magic`` is the fp32 bit pattern of 2**(emin - mbits + 23): adding it to a magnitude below the
    smallest normal 2**emin rounds that magnitude to the subnormal quantum, and its low bits are the code.
    """
    u = bits_from_f32(value)
    a = _U32(u & _U32(0x7FFFFFFF))  # every intermediate cast back to 32 bits: Numba widens to 64
    shift = _U32(23 - mbits)
    if a < _U32(_U32(128 - bias) << _U32(23)):  # below the smallest normal 2**(1 - bias): subnormal codes
        code = _U32(bits_from_f32(f32_from_bits(a) + f32_from_bits(_U32(sub_magic))) - _U32(sub_magic))
    else:  # RNE on the dropped mantissa bits (a carry moves into the exponent), then rebias
        odd = _U32(_U32(a >> shift) & _U32(1))
        rounded = _U32(a + _U32(_U32(_U32(1) << _U32(shift - 1)) - _U32(1)) + odd)
        code = _U32(_U32(rounded >> shift) - _U32(_U32(127 - bias) << _U32(mbits)))
    code = min(code, _U32(max_code))
    if a > _U32(0x7F800000):
        return _U32(0)
    return _U32(code | _U32(_U32(u >> _U32(24)) & _U32(0x80)))
