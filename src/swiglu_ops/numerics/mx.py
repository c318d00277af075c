"""MX (OCP microscaling) numerics, written once.

Everything here follows ``docs/operators.md`` sections 2 and 4 (cited below by the section numbers of the
operator studies, ``swiglu_backward_mx_quant.md`` and ``swiglu_mx_quant.md``, mapped there): section 3 of
both (element formats, E8M0 scale rules, element encoding with its round modes) and section 4 of both
(Ascend's paired block layouts, FP4 nibble packing). The functions operate on whole tensors with integer
arithmetic on the IEEE bit patterns, so they are bit-exact by construction and never depend on PyTorch's
float->fp8 casts (whose NaN/saturation behaviour differs between versions and formats; PyTorch has no
float->fp4 cast at all).

Element formats (:class:`ElementFormat`): the FP8 formats E4M3FN and E5M2 (:class:`FP8Format`) and the FP4
formats E2M1 and E1M2 (:class:`FP4Format`). One encoder serves all four (:func:`encode`): the exact value is
rounded on the format's grid with the round mode (FP8: only ``rint``; FP4: ``rint``, ``round``, ``floor``),
saturated to +-max, NaN -> code 0, the sign of zero kept.

The reference backend is built from these pieces; the fast backends re-express the same rules in their own
languages and are tested bit-exactly against them.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import torch

__all__ = [
    "BLOCK",
    "ElementFormat",
    "FP8Format",
    "FP4Format",
    "E4M3FN",
    "E5M2",
    "E2M1",
    "E1M2",
    "FLOAT4_E1M2FN_X2",
    "ROUND_MODES",
    "check_round_mode",
    "fp8_format",
    "element_format",
    "dst_from_name",
    "dst_name",
    "encode",
    "decode",
    "fp8_encode",
    "fp8_decode",
    "fp4_encode",
    "fp4_decode",
    "pack_fp4",
    "unpack_fp4",
    "amax_bits",
    "scale_codes",
    "scale_reciprocal",
    "quantize_blocks",
    "mxscale1_shape",
    "mxscale1_slots",
    "mxscale2_rows",
    "clamp_group_ends",
    "group_row_base",
    "column_block_groups",
    "dequantize",
    "format_of_dtype",
    "element_table",
    "e8m0_table",
    "lookup",
]

#: MX block size along either axis.
BLOCK = 32

#: The E1M2 destination "dtype": PyTorch has no FP4 E1M2 dtype, so the format is named by this string (the
#: name of torch_npu's ``float4_e1m2fn_x2``, dtype code 297); its results are ``torch.uint8`` tensors packed
#: like ``torch.float4_e2m1fn_x2``. Exported as ``swiglu_ops.float4_e1m2fn_x2``.
FLOAT4_E1M2FN_X2 = "float4_e1m2fn_x2"


#: How a value is rounded onto the element grid (``swiglu_mx_quant.md`` 1.3 / 3.5), by CANN's names (its
#: ``GetRoundMode`` parses exactly these): "rint" to nearest, ties to even (the only mode for FP8); "round" to
#: nearest, ties away from zero; "floor" towards -inf, on the signed value.
ROUND_MODES = ("rint", "round", "floor")


def check_round_mode(name) -> str:
    """``name`` if it is one of :data:`ROUND_MODES`, else a ``ValueError`` naming ``round_mode``."""
    if not isinstance(name, str) or name not in ROUND_MODES:
        raise ValueError(f"round_mode must be one of {ROUND_MODES}, got {name!r}")
    return name


@dataclass(frozen=True)
class ElementFormat:
    """An MX element format: sign bit, ``ebits`` exponent bits (``bias``), ``mbits`` mantissa bits, with
    subnormals; finite magnitudes saturate at ``max_code``.

    ``torch_dtype`` is the dtype of the quantised tensors (y1/y2) the operators return: the FP8 dtype,
    ``torch.float4_e2m1fn_x2``, or ``torch.uint8`` for E1M2 (PyTorch has no such dtype).
    """

    name: str
    torch_dtype: torch.dtype
    ebits: int
    mbits: int
    bias: int
    max_code: int  # largest finite magnitude code (sign bit clear)
    max_value: float
    emax: int  # exponent of the largest normal (OCP "emax_elem"), used by the OCP scale rule

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def packed(self) -> bool:
        """Two elements per byte (FP4): element 2j in bits 3:0, element 2j+1 in bits 7:4."""
        return self.bits == 4

    @property
    def min_normal_exp(self) -> int:
        return 1 - self.bias


@dataclass(frozen=True)
class FP8Format(ElementFormat):
    """An FP8 element format. ``inv_max_bits`` is the RCEIL multiplier INV (spec 3.1)."""

    inv_max_bits: int  # fp32 bits of fp32(1 / max_value), spec 3.1 INV

    def __post_init__(self):
        # Decoded once here, not in the property: torch.compile traces the reference through `inv_max`,
        # and Dynamo's `struct.pack` polyfill recurses without end (torch 2.13).
        object.__setattr__(self, "_inv_max", struct.unpack("<f", struct.pack("<I", self.inv_max_bits))[0])

    @property
    def inv_max(self) -> float:
        """``fp32(1 / max_value)`` exactly (the value of ``inv_max_bits``), the RCEIL multiplier."""
        return self._inv_max


@dataclass(frozen=True)
class FP4Format(ElementFormat):
    """An FP4 element format (no inf/NaN codes). Only the OCP scale rule applies (CANN has no RCEIL
    constant for FP4)."""


E4M3FN = FP8Format("e4m3fn", torch.float8_e4m3fn, 4, 3, 7, 0x7E, 448.0, 8, 0x3B124925)
E5M2 = FP8Format("e5m2", torch.float8_e5m2, 5, 2, 15, 0x7B, 57344.0, 15, 0x37924925)
#: OCP MX FP4: {0, 0.5, 1, 1.5, 2, 3, 4, 6} = codes 0..7 (``swiglu_mx_quant.md`` 3.4).
E2M1 = FP4Format("e2m1", torch.float4_e2m1fn_x2, 2, 1, 1, 0x7, 6.0, 2)
#: Ascend's FP4 E1M2: {0, 0.25, ..., 1.75}, code = 4 * |value| (``swiglu_mx_quant.md`` 3.4).
E1M2 = FP4Format("e1m2", torch.uint8, 1, 2, 1, 0x7, 1.75, 0)

_FORMATS = {torch.float8_e4m3fn: E4M3FN, torch.float8_e5m2: E5M2}
_DESTINATIONS = {**_FORMATS, torch.float4_e2m1fn_x2: E2M1, FLOAT4_E1M2FN_X2: E1M2}
_DST_BY_NAME = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float4_e2m1fn_x2": torch.float4_e2m1fn_x2,
    FLOAT4_E1M2FN_X2: FLOAT4_E1M2FN_X2,
}
_DST_DESCRIPTION = (
    "torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2 or swiglu_ops.float4_e1m2fn_x2"
)


def fp8_format(dtype: torch.dtype) -> FP8Format:
    """The :class:`FP8Format` of a torch fp8 dtype (``float8_e4m3fn`` or ``float8_e5m2``)."""
    try:
        return _FORMATS[dtype]
    except (KeyError, TypeError):
        raise TypeError(f"dst_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}") from None


def element_format(dst) -> ElementFormat:
    """The element format of a destination: a torch FP8 dtype, ``torch.float4_e2m1fn_x2``, or the E1M2
    sentinel :data:`FLOAT4_E1M2FN_X2`. Anything else is a ``TypeError``."""
    try:
        return _DESTINATIONS[dst]
    except (KeyError, TypeError):
        raise TypeError(f"dst_dtype must be {_DST_DESCRIPTION}, got {dst!r}") from None


def format_of_dtype(dtype: torch.dtype) -> ElementFormat | None:
    """The element format whose quantised tensors have ``dtype`` (the FP8 dtypes, ``float4_e2m1fn_x2``), or
    None (uint8 codes name no format by themselves: E1M2, or raw codes)."""
    return next((f for f in _DESTINATIONS.values() if f.torch_dtype == dtype and dtype != torch.uint8), None)


def dst_name(dst) -> str:
    """The name of a destination (``"float8_e4m3fn"``, ..., ``"float4_e1m2fn_x2"``): how the custom op's
    schema carries it (``str dst_dtype``), since the E1M2 sentinel is no ``ScalarType``."""
    element_format(dst)
    return dst if isinstance(dst, str) else str(dst).removeprefix("torch.")


def dst_from_name(name) -> torch.dtype | str:
    """Inverse of :func:`dst_name`."""
    if not isinstance(name, str) or name not in _DST_BY_NAME:
        raise TypeError(f"dst_dtype must be one of {tuple(_DST_BY_NAME)}, got {name!r}")
    return _DST_BY_NAME[name]


# ------------------------------------------------------------------------------------- element codec

_F64_MANT = 52
_F64_ABS = 0x7FFFFFFFFFFFFFFF
_F64_INF = 0x7FF0000000000000


def _f32_bits(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bits_to_f32(bits: torch.Tensor) -> torch.Tensor:
    b = bits.to(torch.int64) & 0xFFFFFFFF
    b = torch.where(b >= 0x80000000, b - 0x100000000, b)
    return b.to(torch.int32).view(torch.float32)


def _shift_round(mant, shift, negative, mode: str) -> torch.Tensor:
    """``mant / 2**shift`` rounded to an integer by ``mode`` (on the signed value ``-mant`` where
    ``negative``), returned as a magnitude. ``mant`` >= 0 (< 2**53), ``shift`` >= 1."""
    shift = shift.clamp(max=62)  # beyond 53 every mantissa is below half a unit
    q = mant >> shift
    rem = mant - (q << shift)
    half = torch.ones_like(shift) << (shift - 1)
    if mode == "rint":
        up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    elif mode == "round":
        up = rem >= half
    elif mode == "floor":
        up = negative & (rem > 0)  # floor of a negative value moves its magnitude up
    else:
        raise ValueError(f"unknown round mode {mode!r}")
    return q + up.to(torch.int64)


def encode(v: torch.Tensor, fmt: ElementFormat, round_mode: str = "rint") -> torch.Tensor:
    """Element codes (uint8; FP4 codes in the low nibble, unpacked) of the values ``v`` (any float dtype,
    taken exactly via float64).

    The value is rounded on the format's grid (quantum ``2**(max(floor(log2|v|), emin) - mbits)``) by
    ``round_mode``; finite magnitudes above max and +-inf saturate to +-max; NaN (either sign) gives code 0;
    the sign bit is the sign bit of ``v``, so -0 and negative values that round to zero give -0.

    - FP8 with ``rint`` is the cast of spec section 3.2 (CAST_RINT + SatMode::SAT, with the repository
      golden's NaN -> +0).
    - FP4 (``swiglu_mx_quant.md`` 3.5): ``rint`` (ties to even), ``round`` (ties away from zero), ``floor``
      (towards -inf: a negative value below the first step gives -q, never 0).
    """
    bits = v.to(torch.float64).contiguous().view(torch.int64)
    negative = bits < 0
    a = bits & _F64_ABS
    exp_field = a >> _F64_MANT
    normal = exp_field > 0
    mant = (a & ((1 << _F64_MANT) - 1)) | torch.where(normal, 1 << _F64_MANT, 0)
    e = torch.where(normal, exp_field - 1023, torch.full_like(exp_field, -1022))
    # Value = mant * 2**(e - 52). Quantum of the target: 2**(max(e, emin) - mbits).
    emin = fmt.min_normal_exp
    q_exp = torch.clamp(e, min=emin) - fmt.mbits
    q = _shift_round(mant, q_exp - (e - _F64_MANT), negative, round_mode)  # may carry into the next binade
    # Code = (biased exponent << mbits) + fraction; for normals q in [2**mbits, 2**(mbits+1)].
    code = torch.where(e >= emin, ((e + fmt.bias - 1) << fmt.mbits) + q, q)
    code = torch.clamp(code, max=fmt.max_code)  # saturate (also covers +-inf: huge e)
    code = code | torch.where(negative, fmt.sign_bit, 0)
    code = torch.where(a > _F64_INF, torch.zeros_like(code), code)  # NaN -> +0
    return code.to(torch.uint8)


def decode(codes: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Decode element codes (uint8; FP4: unpacked nibbles) to fp32. E4M3FN 0x7F/0xFF and E5M2 inf/NaN codes
    decode to inf/NaN; FP4 has none."""
    c = codes.to(torch.int64) & ((1 << fmt.bits) - 1)
    sign = torch.where((c & fmt.sign_bit) != 0, -1.0, 1.0)
    mag = c & (fmt.sign_bit - 1)
    e = mag >> fmt.mbits
    f = mag & ((1 << fmt.mbits) - 1)
    frac = f.to(torch.float64) / (1 << fmt.mbits)
    val = torch.where(
        e == 0,
        frac * 2.0**fmt.min_normal_exp,
        (1.0 + frac) * torch.pow(2.0, (e - fmt.bias).to(torch.float64)),
    )
    if fmt is E4M3FN:
        val = torch.where(mag == 0x7F, torch.nan, val)
    elif fmt is E5M2:
        top = (1 << fmt.ebits) - 1
        val = torch.where((e == top) & (f == 0), torch.inf, val)
        val = torch.where((e == top) & (f != 0), torch.nan, val)
    return (sign * val).to(torch.float32)


def fp8_encode(v: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """FP8 codes (uint8) of ``v``: round-to-nearest-even, saturating, NaN -> 0x00, sign of zero kept
    (:func:`encode` with ``rint``)."""
    return encode(v, fmt, "rint")


def fp8_decode(codes: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """FP8 codes (uint8) -> fp32 (:func:`decode`)."""
    return decode(codes, fmt)


def fp4_encode(v: torch.Tensor, fmt: FP4Format, round_mode: str = "rint") -> torch.Tensor:
    """FP4 codes (uint8 nibbles 0..15, sign 0x8) of ``v`` with ``round_mode`` (:func:`encode`)."""
    return encode(v, fmt, round_mode)


def fp4_decode(codes: torch.Tensor, fmt: FP4Format) -> torch.Tensor:
    """FP4 nibbles -> fp32 (:func:`decode`)."""
    return decode(codes, fmt)


def pack_fp4(nibbles: torch.Tensor) -> torch.Tensor:
    """``[..., 2W]`` FP4 codes -> ``[..., W]`` uint8 bytes: element 2j in bits 3:0, 2j+1 in bits 7:4
    (``swiglu_mx_quant.md`` 4.2; PyTorch's ``float4_e2m1fn_x2`` order)."""
    n = nibbles.to(torch.uint8) & 0xF
    return n[..., 0::2] | (n[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """``[..., W]`` packed FP4 bytes (uint8 or ``float4_e2m1fn_x2``) -> ``[..., 2W]`` uint8 nibbles."""
    p = packed.view(torch.uint8)
    return torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


# -------------------------------------------------------------------------------------------- scales


def amax_bits(block_values: torch.Tensor, dim: int) -> torch.Tensor:
    """Block amax as fp32 bits (int64), spec 3: max of the magnitude bit patterns, so NaN beats inf.

    ``block_values`` is bf16, fp16 or fp32. The result is the bit pattern of the exact fp32 widening of the
    16-bit (or 32-bit) amax, with NaN canonicalised to 0x7FC00000.
    """
    if block_values.dtype == torch.float32:
        mag = block_values.contiguous().view(torch.int32).to(torch.int64) & 0x7FFFFFFF
        return mag.amax(dim=dim)
    mag16 = block_values.contiguous().view(torch.int16).to(torch.int32) & 0x7FFF
    m = mag16.amax(dim=dim).to(torch.int16).view(block_values.dtype)
    return _f32_bits(m.to(torch.float32))


def scale_codes(amax: torch.Tensor, fmt: ElementFormat, scale_alg: int) -> torch.Tensor:
    """E8M0 scale codes (int64 in [0, 255]) from block amax fp32 bits.

    ``scale_alg == 1``: RCEIL / "cuBLAS" rule (spec 3.1), FP8 only. ``scale_alg == 0``: OCP floor rule with
    the format's emax (spec 3.3; FP8 and FP4).
    """
    finite = amax < 0x7F800000
    nonzero = amax != 0
    if scale_alg == 1:
        if not isinstance(fmt, FP8Format):
            raise ValueError(f"scale_alg 1 (RCEIL) is defined for FP8 formats only, got {fmt.name}")
        p = _f32_bits(_bits_to_f32(amax) * torch.tensor(fmt.inv_max, dtype=torch.float32, device=amax.device))
        e = p >> 23
        mf = p & 0x7FFFFF
        up = ((e > 0) & (e < 254) & (mf > 0)) | ((e == 0) & (mf > 0x400000))
        code = e + up.to(torch.int64)
    elif scale_alg == 0:
        ef = amax >> 23  # biased exponent of amax (fp16 values widened exactly: subnormals become normal)
        code = torch.clamp(ef - fmt.emax, min=0)
        nonzero = nonzero & (ef != 0)  # amax zero or fp32-subnormal: code 0 (spec 3.3 "Ef == 0")
    else:
        raise ValueError(f"scale_alg must be 0 or 1, got {scale_alg}")
    code = torch.where(finite, code, torch.full_like(code, 0xFF))
    code = torch.where(nonzero | ~finite, code, torch.zeros_like(code))
    return code


def scale_reciprocal(codes: torch.Tensor, amax: torch.Tensor, scale_alg: int) -> torch.Tensor:
    """The fp32 multiplier applied to each element of a block: 2**(127 - code), 0 for zero blocks, NaN for
    NaN/inf blocks (spec 3.1 "recip", 3.3 "recip bits"; code 254 gives 2**-127, an fp32 subnormal)."""
    exp = (127 - codes).to(torch.float64)
    recip = torch.pow(2.0, exp).to(torch.float32)
    zero = amax == 0
    if scale_alg == 0:
        zero = zero | ((amax >> 23) == 0)
    recip = torch.where(zero, torch.zeros_like(recip), recip)
    recip = torch.where(amax >= 0x7F800000, torch.full_like(recip, torch.nan), recip)
    return recip


def quantize_blocks(
    values: torch.Tensor, dim: int, fmt: ElementFormat, scale_alg: int, round_mode: str = "rint"
):
    """Quantise blocks laid along ``dim`` (whose length is the block, zero padding already applied).

    Returns ``(codes uint8 like values, scale codes int64 with dim reduced)``; FP4 codes are unpacked
    nibbles. The element code is :func:`encode` of the **exact** product ``v * 2**(127 - E)`` (spec 3.2 /
    3.5; computed in float64, where it is exact for every fp32 ``v``, so a tiny negative value under
    ``floor`` gives -q even where an fp32 product would underflow); a NaN/inf block has scale 0xFF and every
    element 0x00; an all-zero block has scale 0 and elements +-0.
    """
    amax = amax_bits(values, dim)
    codes = scale_codes(amax, fmt, scale_alg)
    recip = scale_reciprocal(codes, amax, scale_alg).unsqueeze(dim)
    y = encode(values.to(torch.float64) * recip.to(torch.float64), fmt, round_mode)
    return y, codes


# ---------------------------------------------------------------------------------------------- layouts


def mxscale1_shape(x_shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """Row-wise (-1 axis) scale shape for quantised values ``[*batch, M, C]``: ``[*batch, M, ceil(C/64), 2]``
    (spec 4.1). The flat row is block order; when ``ceil(C/32)`` is odd its last slot is a pad (code 0)."""
    *lead, c = x_shape
    return (*lead, -(-c // 64), 2)


def mxscale1_slots(c: int) -> int:
    """Scale slots of one mxscale1 row for ``c`` quantised columns: ``2 * ceil(c / 64)`` 32-column blocks,
    the last ones (past ``c``) computed from zero padding."""
    return 2 * -(-c // 64)


def mxscale2_rows(m: int, num_groups: int | None) -> int:
    """Rows R of the column-wise scale tensor ``[*batch, R, C, 2]`` (spec 1.2 / 4.2)."""
    if num_groups is None:
        return -(-m // 64)
    return m // 64 + num_groups


def clamp_group_ends(group_ends: torch.Tensor, m: int) -> list[tuple[int, int]]:
    """Group row ranges ``[(start, end)]`` from cumulative row ends, each end clamped into [previous end, M].

    For valid input (non-decreasing, last == M) this is the identity. Device kernels apply the same clamp so
    that no value can cause an out-of-bounds access (contract section 2).
    """
    ranges = []
    prev = 0
    for e in group_ends.tolist():
        e = min(max(int(e), prev), m)
        ranges.append((prev, e))
        prev = e
    return ranges


def group_row_base(group: int, start: int) -> int:
    """First mxscale2 row of a group: ``floor(start / 64) + group`` (spec 4.2)."""
    return start // 64 + group


def column_block_groups(group_ends: torch.Tensor | None, m: int):
    """The token-axis block walk of one [M, C] slice: ``(ranges, bases)`` where 32-row blocks restart at
    each ``ranges[g] = (start, end)`` and block t of group g has scale slot ``2 * bases[g] + t``.

    Without groups the whole slice is one group at base 0. Rows from ``ranges[-1][1]`` to M belong to no
    group (only possible for invalid device-side ends, see :func:`clamp_group_ends`).
    """
    if group_ends is None:
        return [(0, m)], [0]
    ranges = clamp_group_ends(group_ends, m)
    return ranges, [group_row_base(g, start) for g, (start, _) in enumerate(ranges)]


# ---------------------------------------------------------------------------------------------- dequant


def dequantize(
    data: torch.Tensor,
    scale: torch.Tensor,
    fmt: ElementFormat,
    *,
    axis: int = -1,
    group_index: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of the MX quantisation: ``value = element(data) * 2**(scale - 127)`` (the rule only: the
    arguments are validated by :func:`swiglu_ops.mx_dequantize`, the public function built on this one).

    - ``axis=-1``: ``data`` is ``y1`` and ``scale`` is ``mxscale1`` ``[*batch, M, ceil(N/64), 2]`` (element j
      of a row uses block j // 32; N need not be a multiple of 32).
    - ``axis=-2``: ``data`` is ``y2`` and ``scale`` is ``mxscale2`` ``[*batch, R, N, 2]``; ``group_index``
      the cumulative row ends that produced them (each end clamped into [previous end, M]; rows past the
      last end read as code 0, like an unused slot).

    ``data`` holds ``fmt``'s codes (FP4 packed two per byte), ``scale`` E8M0 codes (``float8_e8m0fnu`` or
    uint8). The result is ``[*batch, M, N]`` (FP4 unpacked) in ``dtype``; scale code 0xFF (NaN block) gives
    NaN.
    """
    codes = unpack_fp4(data) if fmt.packed else data
    *lead, m, n = codes.shape
    # fp32 is exact here (elements have <= 4 significant bits, scales are powers of two >= 2**-127), so
    # only a float64 request needs float64; the per-element work is two table lookups and one multiply.
    work = torch.float64 if dtype == torch.float64 else torch.float32
    vals = lookup(element_table(fmt, work, data.device), codes)
    if axis == -1:
        factor = lookup(e8m0_table(work, data.device), scale).view(*lead, m, mxscale1_slots(n))
        if n % BLOCK == 0:
            factor = factor[..., : n // BLOCK].unsqueeze(-1)
            return (vals.view(*lead, m, n // BLOCK, BLOCK) * factor).view(codes.shape).to(dtype)
        block = torch.arange(n, device=data.device) // BLOCK  # partial last block
        return (vals * factor.index_select(-1, block)).to(dtype)
    rows = scale.shape[-3]
    table = e8m0_table(work, data.device)
    slots = lookup(table, scale).movedim(-1, -2).reshape(*lead, rows * 2, n)  # 32-row block slots
    ranges, bases = column_block_groups(group_index, m)
    out = torch.empty_like(vals)
    covered = ranges[-1][1]  # rows of no group (past the last end) read as code 0, like an unused slot
    out[..., covered:, :] = vals[..., covered:, :] * table[0]
    for (s, e), base in zip(ranges, bases, strict=True):
        if e > s:
            slot = 2 * base + torch.arange(e - s, device=data.device) // BLOCK
            out[..., s:e, :] = vals[..., s:e, :] * slots[..., slot, :]
    return out.to(dtype)


@functools.cache
def element_table(fmt: ElementFormat, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Code -> value for every uint8 code (FP4: the low nibble; codes are unpacked before the lookup)."""
    return decode(torch.arange(256, dtype=torch.uint8, device="cpu"), fmt).to(dtype=dtype, device=device)


@functools.cache
def e8m0_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """E8M0 code -> 2**(code - 127); 0xFF is NaN (the scale of a NaN/inf block)."""
    table = torch.pow(2.0, torch.arange(256, dtype=torch.float64, device="cpu") - 127)
    table[0xFF] = torch.nan
    return table.to(dtype=dtype, device=device)


def lookup(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``table[codes]`` for a uint8 / fp8 / e8m0 code tensor, with 4-byte indices."""
    flat = codes.reshape(-1).view(torch.uint8).to(torch.int32)
    return table.index_select(0, flat).view(codes.shape)
