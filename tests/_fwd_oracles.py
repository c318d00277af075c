"""Independent oracles for the forward dual-axis MX operator (``swiglu_mx_quant.md``): nothing here calls
``swiglu_ops.mx`` or a backend, so tests built on them can fail on the reference backend too.

- element grids: FP8 from PyTorch's own fp8 dtypes, FP4 written out from spec 3.4;
- :func:`grid_encode`: a value -> code by searching the grid (vectorised, float64), per round mode;
- :func:`scale_code`: the E8M0 rules of spec 3.2 / 3.3 on Python floats with ``struct`` fp32 rounding;
- :func:`expected_forward`: the layouts of spec 4 as plain loops (blocks, pad slot, groups, row bases,
  clamped group ends, nibble packing);
- :func:`stage1` and :func:`known_inputs`: the SwiGLU of spec 2.2 (and the GPT-OSS variant) written from the
  spec, and inputs whose activation is known exactly (A = 32: ``exp(-32) + 1 == 1`` in fp32, so
  ``act = 32 * B``).
"""

from __future__ import annotations

import math
import struct

import torch

import swiglu_ops

E1M2 = swiglu_ops.float4_e1m2fn_x2
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP4 = (torch.float4_e2m1fn_x2, E1M2)
DSTS = [*FP8, *FP4]
DST_IDS = ["e4m3fn", "e5m2", "e2m1", "e1m2"]


class Fmt:
    """What the oracle knows about a destination format, from the spec's table 3.4."""

    def __init__(self, dst, grid, emax, inv_bits, out_dtype):
        self.dst = dst
        self.grid = torch.tensor(grid, dtype=torch.float64)  # value of magnitude code k, increasing
        self.max = grid[-1]
        self.emax = emax
        self.inv = None if inv_bits is None else struct.unpack("<f", struct.pack("<I", inv_bits))[0]
        self.fp4 = dst in FP4
        self.sign = 0x8 if self.fp4 else 0x80
        self.out_dtype = out_dtype


def _fp8_grid(dtype, max_code):
    return torch.arange(max_code + 1, dtype=torch.uint8).view(dtype).double().tolist()


FORMATS = {
    torch.float8_e4m3fn: Fmt(
        torch.float8_e4m3fn, _fp8_grid(torch.float8_e4m3fn, 0x7E), 8, 0x3B124925, torch.float8_e4m3fn
    ),
    torch.float8_e5m2: Fmt(
        torch.float8_e5m2, _fp8_grid(torch.float8_e5m2, 0x7B), 15, 0x37924925, torch.float8_e5m2
    ),
    torch.float4_e2m1fn_x2: Fmt(
        torch.float4_e2m1fn_x2, [0, 0.5, 1, 1.5, 2, 3, 4, 6], 2, None, torch.float4_e2m1fn_x2
    ),
    E1M2: Fmt(E1M2, [k / 4 for k in range(8)], 0, None, torch.uint8),
}


def default_alg(dst) -> int:
    return 0 if dst in FP4 else 1


# ----------------------------------------------------------------------------------------- elements


def grid_encode(t: torch.Tensor, fmt: Fmt, mode: str) -> torch.Tensor:
    """Codes (uint8, FP4 unpacked) of the float64 values ``t``: the grid value chosen by ``mode``
    ("rint": nearest, ties to the even code; "round": nearest, ties away from zero; "floor": the largest
    grid value <= t, signed), saturated to +-max; NaN -> 0; the sign bit is t's sign bit."""
    t = t.to(torch.float64)
    grid = fmt.grid
    a = t.abs()
    k = len(grid) - 1
    lo = (torch.searchsorted(grid, a, right=True) - 1).clamp(0, k)  # largest grid value <= |t|
    hi = torch.searchsorted(grid, a, right=False).clamp(max=k)  # smallest grid value >= |t| (or max)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    if mode == "floor":
        neg = torch.signbit(t)
        pick = torch.where(neg, hi, lo)
    else:
        tie_pick = hi if mode == "round" else torch.where(lo % 2 == 0, lo, hi)
        pick = torch.where(d_lo < d_hi, lo, torch.where(d_hi < d_lo, hi, tie_pick))
    pick = torch.where(a >= fmt.max, torch.full_like(pick, k), pick)  # saturation, +-inf included
    code = pick | torch.where(torch.signbit(t), fmt.sign, 0)
    return torch.where(torch.isnan(t), torch.zeros_like(code), code).to(torch.uint8)


def grid_decode(codes: torch.Tensor, fmt: Fmt) -> torch.Tensor:
    """float64 values of magnitude/sign codes (finite codes only)."""
    c = codes.to(torch.int64)
    mag = fmt.grid[c & (fmt.sign - 1)]
    return torch.where((c & fmt.sign) != 0, -mag, mag)


# ------------------------------------------------------------------------------------------- scales


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def scale_code(block: list[float], fmt: Fmt, alg: int) -> tuple[int, float]:
    """``(E8M0 code, multiplier m)`` of a block of (exact) values, zeros standing in for padding."""
    if any(math.isnan(v) or math.isinf(v) for v in block):
        return 0xFF, math.nan
    amax = max((abs(v) for v in block), default=0.0)
    if amax == 0.0:
        return 0, 0.0
    if alg == 1:
        p = _f32_bits(_f32(amax * fmt.inv))  # the double product is exact; one rounding to fp32
        e, mf = p >> 23, p & 0x7FFFFF
        if (0 < e < 254 and mf > 0) or (e == 0 and mf > 0x400000):
            e += 1
        return e, 2.0 ** (127 - e)
    ef = (_f32_bits(amax) >> 23) & 0xFF
    if ef == 0:  # fp32-subnormal amax: code 0, all elements +-0
        return 0, 0.0
    code = max(ef - fmt.emax, 0)
    return code, 2.0 ** (127 - code)


def quantize_block(values: torch.Tensor, fmt: Fmt, alg: int, mode: str) -> tuple[torch.Tensor, int]:
    """(codes, scale code) of up to 32 values (the rest of the block is zero padding)."""
    code, m = scale_code(values.double().tolist(), fmt, alg)
    if code == 0xFF:
        return torch.zeros(values.shape, dtype=torch.uint8), code
    return grid_encode(values.double() * m, fmt, mode), code  # v * 2**k is exact in float64


# ------------------------------------------------------------------------------------------ layouts


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Element 2j in the low nibble, 2j+1 in the high nibble."""
    c = codes.to(torch.int64)
    return (c[..., 0::2] + 16 * c[..., 1::2]).to(torch.uint8)


def group_ranges(m: int, group_index) -> list[tuple[int, int]]:
    """Each cumulative end clamped into [previous end, M] (the device-tensor contract)."""
    if group_index is None:
        return [(0, m)]
    ranges, start = [], 0
    for end in list(group_index):
        end = min(max(int(end), start), m)
        ranges.append((start, end))
        start = end
    return ranges


def _slice(act2d, group_index, fmt, alg, mode):
    m, n = act2d.shape
    slots = 2 * math.ceil(n / 64)
    y1 = torch.zeros(m, n, dtype=torch.uint8)
    s1 = torch.zeros(m, slots, dtype=torch.uint8)
    ranges = group_ranges(m, group_index)
    covered = ranges[-1][1]
    for row in range(covered):
        for k in range(slots):  # -1 axis: block k = columns [32k, 32k + 32) of the N, the rest padding
            cols = slice(32 * k, min(32 * k + 32, n))
            codes, scale = quantize_block(act2d[row, cols], fmt, alg, mode)
            y1[row, cols] = codes
            s1[row, k] = scale
    r = math.ceil(m / 64) if group_index is None else m // 64 + len(ranges)
    y2 = torch.zeros(m, n, dtype=torch.uint8)
    s2 = torch.zeros(r, n, 2, dtype=torch.uint8)
    for g, (start, end) in enumerate(ranges):
        base = 0 if group_index is None else start // 64 + g
        for t, r0 in enumerate(range(start, end, 32)):  # -2 axis: blocks restart at the group start
            r1 = min(r0 + 32, end)
            for c in range(n):
                codes, scale = quantize_block(act2d[r0:r1, c], fmt, alg, mode)
                y2[r0:r1, c] = codes
                s2[base + t // 2, c, t % 2] = scale
    return y1, s1, y2, s2


def expected_forward(act, group_index=None, *, dst=torch.float8_e4m3fn, scale_alg=None, round_mode="rint"):
    """``(y1, mxscale1, y2, mxscale2)`` for a known activation ``act`` ``[..., M, N]`` (in x's dtype)."""
    fmt = FORMATS[dst]
    alg = default_alg(dst) if scale_alg is None else scale_alg
    *lead, m, n = act.shape
    parts = [_slice(a, group_index, fmt, alg, round_mode) for a in act.reshape(-1, m, n)]
    y1, s1, y2, s2 = (torch.stack(p) if p else None for p in zip(*parts, strict=True))
    if fmt.fp4:
        y1, y2 = pack(y1), pack(y2)
    e8m0 = torch.float8_e8m0fnu
    return (
        y1.reshape(*lead, m, y1.shape[-1]).view(fmt.out_dtype),
        s1.reshape(*lead, m, s1.shape[-1] // 2, 2).view(e8m0),
        y2.reshape(*lead, m, y2.shape[-1]).view(fmt.out_dtype),
        s2.reshape(*lead, *s2.shape[1:]).view(e8m0),
    )


# ------------------------------------------------------------------------------------------ stage 1

#: exp(-32) < 2**-25: A / (exp(A * -1) + 1) == A exactly in fp32, so act = A * B = 32 * B exactly.
ACT = 32.0


def columns(cols: int, activate_left=True, interleaved=False) -> tuple[slice, slice]:
    """(A columns, B columns) of a row of ``cols`` elements."""
    half = cols // 2
    parts = (slice(0, cols, 2), slice(1, cols, 2)) if interleaved else (slice(0, half), slice(half, cols))
    return parts if activate_left else parts[::-1]


def known_inputs(b: torch.Tensor, *, activate_left=True, interleaved=False):
    """``(x, act)``: x with A = 32 and B = ``b`` in the chosen layout, and its exact activation
    ``act = 32 * b`` rounded to b's dtype (exact unless it overflows: fp16 |b| > 2047 gives inf)."""
    *lead, n = b.shape
    x = torch.empty(*lead, 2 * n, dtype=b.dtype)
    a_cols, b_cols = columns(2 * n, activate_left, interleaved)
    x[..., a_cols] = ACT
    x[..., b_cols] = b
    return x, (b.double() * ACT).to(b.dtype)


def stage1(x, *, activate_left=True, interleaved=False, limit=None, alpha=None, bias=None):
    """Spec 2.2 (plain SwiGLU) or clipped_swiglu.md 0 (GPT-OSS, clamp_mode 0) in fp32, one op at a time in
    CANN's order, then one rounding to x's dtype."""
    a_cols, b_cols = columns(x.shape[-1], activate_left, interleaved)
    a, b = x[..., a_cols].float(), x[..., b_cols].float()
    if limit is None:
        out = (a / (torch.exp(a * -1.0) + 1.0)) * b
    else:
        lim = torch.tensor(limit, dtype=torch.float32)
        at = torch.minimum(a, lim)
        glu = at / (torch.exp(at * -torch.tensor(alpha, dtype=torch.float32)) + 1.0)
        out = glu * (torch.maximum(torch.minimum(b, lim), -lim) + torch.tensor(bias, dtype=torch.float32))
    return out.to(x.dtype)


def random_values(shape, dtype, seed, scale=1.0, lo=-12, hi=8):
    """Values spanning several binades (so blocks get different scales), in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(lo, hi, shape, generator=gen).double())
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * mag * scale).to(dtype)


# --------------------------------------------------------------------------------------- comparison


def unpacked(t: torch.Tensor, dst) -> torch.Tensor:
    """Element codes as uint8 with the sign in bit 7 (FP4 nibbles unpacked), so that "one unit apart"
    comparisons see one element each."""
    u = t.view(torch.uint8)
    if dst not in FP4:
        return u
    n = torch.stack([u & 0xF, u >> 4], dim=-1).reshape(*u.shape[:-1], 2 * u.shape[-1])
    return (n & 0x7) | ((n & 0x8) << 4)


def assert_forward_matches(actual, expected, backend: str, dst) -> None:
    """All four outputs: dtypes and shapes equal, every element exactly (reference) or within the
    contract's near-tie rule (fast backends; FP4 per element, not per byte)."""
    from _compare import MX_NAMES, assert_matches_reference

    assert len(actual) == 4, f"expected 4 outputs, got {len(actual)}"
    for a, e, name in zip(actual, expected, MX_NAMES, strict=True):
        assert a.dtype == e.dtype, f"{name}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        if name.startswith("y"):
            a, e = unpacked(a, dst), unpacked(e, dst)
        assert_matches_reference(a, e, backend, name)
