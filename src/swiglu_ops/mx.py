"""MX (OCP microscaling) numerics, written once.

Everything here follows ``shared/spec/swiglu_backward_mx_quant.md`` section 3 (scales and element casts) and
section 4 (Ascend's paired block layouts). The functions operate on whole tensors with integer arithmetic on
the IEEE bit patterns, so they are bit-exact by construction and never depend on PyTorch's float->fp8 casts
(whose NaN/saturation behaviour differs between versions and formats).

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
    "FP8Format",
    "E4M3FN",
    "E5M2",
    "fp8_format",
    "fp8_encode",
    "fp8_decode",
    "amax_bits",
    "scale_codes",
    "scale_reciprocal",
    "quantize_blocks",
    "mxscale1_shape",
    "mxscale2_rows",
    "clamp_group_ends",
    "group_row_base",
    "column_block_groups",
    "mx_dequantize",
]

#: MX block size along either axis.
BLOCK = 32


@dataclass(frozen=True)
class FP8Format:
    """An FP8 element format: IEEE-like sign/exponent/mantissa with saturating RNE encoding."""

    name: str
    torch_dtype: torch.dtype
    ebits: int
    mbits: int
    bias: int
    max_code: int  # largest finite magnitude code (sign bit clear)
    max_value: float
    emax: int  # exponent of the largest normal (OCP "emax_elem")
    inv_max_bits: int  # fp32 bits of fp32(1 / max_value), spec 3.1 INV

    @property
    def min_normal_exp(self) -> int:
        return 1 - self.bias

    def __post_init__(self):
        # Decoded once here, not in the property: torch.compile traces the reference through `inv_max`,
        # and Dynamo's `struct.pack` polyfill recurses without end (torch 2.13).
        object.__setattr__(self, "_inv_max", struct.unpack("<f", struct.pack("<I", self.inv_max_bits))[0])

    @property
    def inv_max(self) -> float:
        """``fp32(1 / max_value)`` exactly (the value of ``inv_max_bits``), the RCEIL multiplier."""
        return self._inv_max


E4M3FN = FP8Format("e4m3fn", torch.float8_e4m3fn, 4, 3, 7, 0x7E, 448.0, 8, 0x3B124925)
E5M2 = FP8Format("e5m2", torch.float8_e5m2, 5, 2, 15, 0x7B, 57344.0, 15, 0x37924925)

_FORMATS = {torch.float8_e4m3fn: E4M3FN, torch.float8_e5m2: E5M2}


def fp8_format(dtype: torch.dtype) -> FP8Format:
    """The :class:`FP8Format` of a torch fp8 dtype (``float8_e4m3fn`` or ``float8_e5m2``)."""
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise TypeError(f"dst_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}") from None


def _f32_bits(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _bits_to_f32(bits: torch.Tensor) -> torch.Tensor:
    b = bits.to(torch.int64) & 0xFFFFFFFF
    b = torch.where(b >= 0x80000000, b - 0x100000000, b)
    return b.to(torch.int32).view(torch.float32)


def _rshift_rne(mant: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Round-half-to-even of ``mant / 2**shift`` for non-negative int64 ``mant`` and ``shift`` >= 0."""
    shift = shift.clamp(max=40)
    q = mant >> shift
    rem = mant - (q << shift)
    half = torch.where(shift > 0, torch.ones_like(shift) << (shift - 1).clamp(min=0), torch.zeros_like(shift))
    up = (rem > half) | ((rem == half) & (shift > 0) & ((q & 1) == 1))
    return q + up.to(torch.int64)


def fp8_encode(v: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """Encode fp32 values to FP8 codes (uint8): round-to-nearest-even, saturating, NaN -> 0x00.

    Finite magnitudes above the format's max (and +-inf) saturate to +-max. The sign of zero is kept, also
    for tiny values that round to zero. This is the cast of spec section 3.2 (CAST_RINT + SatMode::SAT, with
    the repository golden's NaN -> +0).
    """
    bits = _f32_bits(v)
    sign = (bits >> 31) << 7
    a = bits & 0x7FFFFFFF
    exp_field = a >> 23
    mant = (a & 0x7FFFFF) | torch.where(exp_field > 0, 0x800000, 0)
    e = torch.where(exp_field > 0, exp_field - 127, torch.full_like(exp_field, -126))
    # Value = mant * 2**(e - 23). Quantum of the target: 2**(max(e, emin) - mbits).
    emin = fmt.min_normal_exp
    q_exp = torch.clamp(e, min=emin) - fmt.mbits
    shift = (q_exp - (e - 23)).clamp(min=0)  # e - 23 <= q_exp always holds for fp8 targets
    q = _rshift_rne(mant, shift)  # magnitude in units of 2**q_exp, may carry into the next binade
    # Code = (biased exponent << mbits) + fraction; for normals q in [2**mbits, 2**(mbits+1)].
    normal = e >= emin
    code = torch.where(normal, ((e + fmt.bias - 1) << fmt.mbits) + q, q)
    code = torch.clamp(code, max=fmt.max_code)  # saturate (also covers +-inf: huge e)
    code = torch.where(a > 0x7F800000, torch.zeros_like(code), code | sign)  # NaN -> +0
    return code.to(torch.uint8)


def fp8_decode(codes: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """Decode FP8 codes (uint8) to fp32. E4M3FN 0x7F/0xFF and E5M2 inf/NaN codes decode to inf/NaN."""
    c = codes.to(torch.int64)
    sign = torch.where((c & 0x80) != 0, -1.0, 1.0)
    mag = c & 0x7F
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
    else:
        top = (1 << fmt.ebits) - 1
        val = torch.where((e == top) & (f == 0), torch.inf, val)
        val = torch.where((e == top) & (f != 0), torch.nan, val)
    return (sign * val).to(torch.float32)


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


def scale_codes(amax: torch.Tensor, fmt: FP8Format, scale_alg: int) -> torch.Tensor:
    """E8M0 scale codes (int64 in [0, 255]) from block amax fp32 bits.

    ``scale_alg == 1``: RCEIL / "cuBLAS" rule (spec 3.1). ``scale_alg == 0``: OCP floor rule (spec 3.3).
    """
    finite = amax < 0x7F800000
    nonzero = amax != 0
    if scale_alg == 1:
        p = _f32_bits(_bits_to_f32(amax) * torch.tensor(fmt.inv_max, dtype=torch.float32))
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
    NaN/inf blocks (spec 3.1 "recip", 3.3 "recip bits")."""
    exp = (127 - codes).to(torch.float64)
    recip = torch.pow(2.0, exp).to(torch.float32)
    zero = amax == 0
    if scale_alg == 0:
        zero = zero | ((amax >> 23) == 0)
    recip = torch.where(zero, torch.zeros_like(recip), recip)
    recip = torch.where(amax >= 0x7F800000, torch.full_like(recip, torch.nan), recip)
    return recip


def quantize_blocks(values: torch.Tensor, dim: int, fmt: FP8Format, scale_alg: int):
    """Quantise blocks laid along ``dim`` (whose length is the block, zero padding already applied).

    Returns ``(codes uint8 like values, scale codes int64 with dim reduced)``. The element code is the
    saturating RNE cast of the exact product ``v * 2**(127 - E)`` (spec 3.2); a NaN/inf block has scale 0xFF
    and every element 0x00; an all-zero block has scale 0 and elements +-0.
    """
    amax = amax_bits(values, dim)
    codes = scale_codes(amax, fmt, scale_alg)
    recip = scale_reciprocal(codes, amax, scale_alg).unsqueeze(dim)
    y = fp8_encode(values.to(torch.float32) * recip, fmt)
    return y, codes


# ---------------------------------------------------------------------------------------------- layouts


def mxscale1_shape(x_shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """Row-wise (-1 axis) scale shape: ``[*batch, M, C/64, 2]`` (spec 4.1); the flat row is block order."""
    *lead, c = x_shape
    return (*lead, c // 64, 2)


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


def mx_dequantize(
    data: torch.Tensor,
    scale: torch.Tensor,
    *,
    axis: int = -1,
    group_index: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of the MX quantisation: ``value = fp8(data) * 2**(scale - 127)``.

    - ``axis=-1``: ``data`` is ``y1`` ``[*batch, M, C]`` and ``scale`` is ``mxscale1``
      ``[*batch, M, C/64, 2]``.
    - ``axis=-2``: ``data`` is ``y2`` and ``scale`` is ``mxscale2`` ``[*batch, R, C, 2]``; pass the same
      ``group_index`` (cumulative row ends) that produced them.

    Scale code 0xFF (NaN block) dequantises to NaN. ``data`` is a float8 tensor (e4m3fn or e5m2); ``scale``
    is ``float8_e8m0fnu`` or uint8 raw codes.
    """
    if not isinstance(data, torch.Tensor) or not isinstance(scale, torch.Tensor):
        raise TypeError("mx_dequantize: data and scale must be tensors")
    if data.dtype not in _FORMATS:
        raise TypeError(f"data must be float8_e4m3fn or float8_e5m2 (y1 / y2), got {data.dtype}")
    fmt = _FORMATS[data.dtype]
    if scale.dtype not in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        raise TypeError(f"scale must be float8_e8m0fnu or uint8 codes, got {scale.dtype}")
    if axis not in (-1, -2):
        raise ValueError(f"axis must be -1 (mxscale1) or -2 (mxscale2), got {axis}")
    if data.dim() < 2:
        raise ValueError(f"data must have rank >= 2, got shape {tuple(data.shape)}")
    *lead, m, c = data.shape
    # fp32 is exact here (FP8 values have <= 4 significant bits, scales are powers of two >= 2**-127), so
    # only a float64 request needs float64; the per-element work is two table lookups and one multiply.
    work = torch.float64 if dtype == torch.float64 else torch.float32
    vals = _lookup(_fp8_table(fmt, work, data.device), data)
    if axis == -1:
        if tuple(scale.shape) != mxscale1_shape(data.shape):
            raise ValueError(f"scale must have shape {mxscale1_shape(data.shape)}, got {tuple(scale.shape)}")
        factor = _lookup(_e8m0_table(work, data.device), scale).view(*lead, m, c // BLOCK, 1)
        return (vals.view(*lead, m, c // BLOCK, BLOCK) * factor).view(data.shape).to(dtype)
    g = None if group_index is None else int(group_index.numel())
    rows = mxscale2_rows(m, g)
    if tuple(scale.shape) != (*lead, rows, c, 2):
        raise ValueError(f"scale must have shape {(*lead, rows, c, 2)}, got {tuple(scale.shape)}")
    if group_index is not None and data.dim() != 2:
        raise ValueError("group_index is only supported with 2-D data")
    table = _e8m0_table(work, data.device)
    slots = _lookup(table, scale).movedim(-1, -2).reshape(*lead, rows * 2, c)  # 32-row block slots
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
def _fp8_table(fmt: FP8Format, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return fp8_decode(torch.arange(256, dtype=torch.uint8), fmt).to(dtype=dtype, device=device)


@functools.cache
def _e8m0_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """E8M0 code -> 2**(code - 127); 0xFF is NaN (the scale of a NaN/inf block)."""
    table = torch.pow(2.0, torch.arange(256, dtype=torch.float64) - 127)
    table[0xFF] = torch.nan
    return table.to(dtype=dtype, device=device)


def _lookup(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``table[codes]`` for a uint8 / fp8 / e8m0 code tensor, with 4-byte indices."""
    flat = codes.reshape(-1).view(torch.uint8).to(torch.int32)
    return table.index_select(0, flat).view(codes.shape)
