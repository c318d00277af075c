"""The FP4 numerics of ``swiglu_ops.mx`` (``swiglu_mx_quant.md`` 3.3-3.5, 4.2) and the generalised encoder,
checked against independent oracles: an exhaustive float64 grid search per round mode, the values written out
in the spec, plain-loop dequantisation. No backend is involved (the fused op is tested in
``test_mx_forward.py``).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from _compare import assert_exact
from _fwd_oracles import DST_IDS, DSTS, FORMATS, FP4, grid_decode, grid_encode

import swiglu_ops
from swiglu_ops.numerics import mx

E1M2 = swiglu_ops.float4_e1m2fn_x2
MODES = ["rint", "round", "floor"]
MX_FORMAT = {torch.float4_e2m1fn_x2: mx.E2M1, E1M2: mx.E1M2}


def all_16bit(dtype) -> torch.Tensor:
    """Every bit pattern of a 16-bit float dtype, as float64."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).double()


def ties_and_neighbours(fmt) -> torch.Tensor:
    """Every midpoint of two neighbouring grid values (and the midpoint past max), both signs, with its
    fp32 and float64 neighbours."""
    grid = fmt.grid
    mids = torch.cat([(grid[:-1] + grid[1:]) / 2, (grid[-1:] * 2 + grid[-1:] / 3) / 2])
    out = [mids]
    for dtype in (torch.float32, torch.float64):
        m = mids.to(dtype)
        out += [torch.nextafter(m, m * 2).double(), torch.nextafter(m, torch.zeros_like(m)).double()]
    v = torch.cat(out)
    return torch.cat([v, -v])


SPECIALS = torch.tensor(
    [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), 2.0**-149, -(2.0**-149)]
    + [2.0**-276, -(2.0**-276), -(2.0**-1074), 1e300, -1e300, 7.999, -7.999, 8.0, -8.0, 1.9999, -1.9999],
    dtype=torch.float64,
)


# --------------------------------------------------------------------------------- encoder vs oracle


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dst", FP4, ids=["e2m1", "e1m2"])
def test_fp4_encode_matches_grid_search_exhaustively(dst, mode):
    """Every bf16 and fp16 value, every tie of the grid with its fp32/float64 neighbours, and special
    values (inf, NaN, -0, values far below the first step, whose floor is -q for negatives): the codes
    of ``mx.encode`` equal a float64 search of the grid."""
    fmt = FORMATS[dst]
    v = torch.cat([all_16bit(torch.bfloat16), all_16bit(torch.float16), ties_and_neighbours(fmt), SPECIALS])
    expected = grid_encode(v, fmt, mode)
    got = mx.encode(v, MX_FORMAT[dst], mode)
    bad = got != expected
    assert not bad.any(), (
        f"{int(bad.sum())} codes differ, e.g. {v[bad][:5].tolist()} -> {got[bad][:5].tolist()} "
        f"(oracle {expected[bad][:5].tolist()})"
    )


@pytest.mark.parametrize("dst", DSTS[:2], ids=DST_IDS[:2])
def test_generalised_encoder_keeps_fp8_rint(dst):
    """The one encoder serves FP8 too: every bf16/fp16 value and the grid's ties against the grid search
    (FP8 accepts only rint)."""
    fmt = FORMATS[dst]
    v = torch.cat([all_16bit(torch.bfloat16), all_16bit(torch.float16), ties_and_neighbours(fmt), SPECIALS])
    assert torch.equal(
        mx.fp8_encode(v.float(), mx.fp8_format(dst)), grid_encode(v.float().double(), fmt, "rint")
    )


def codes_of(values, dst, mode):
    return mx.encode(torch.tensor(values, dtype=torch.float64), MX_FORMAT[dst], mode)


# (dst, mode, t values, expected codes) -- spec 3.5's examples and section 8's tie lists, written out
SPEC_CASES = [
    ("e2m1", "rint", [0.25, 0.75, 1.75, 5.0, 7.0], [0x0, 0x2, 0x4, 0x6, 0x7]),
    ("e2m1", "round", [0.25, 5.0], [0x1, 0x7]),
    ("e2m1", "floor", [-0.3, -5.0, 5.9], [0x9, 0xF, 0x6]),
    # E2M1 ties t in {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7}: rint -> even code, round -> away, floor -> down
    ("e2m1", "rint", [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7], [0, 2, 2, 4, 4, 6, 6, 7]),
    ("e2m1", "round", [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7], [1, 2, 3, 4, 5, 6, 7, 7]),
    ("e2m1", "floor", [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7], [0, 1, 2, 3, 4, 5, 6, 7]),
    ("e2m1", "rint", [-0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -7], [8, 10, 10, 12, 12, 14, 14, 15]),
    ("e2m1", "round", [-0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -7], [9, 10, 11, 12, 13, 14, 15, 15]),
    ("e2m1", "floor", [-0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -7], [9, 10, 11, 12, 13, 14, 15, 15]),
    # E1M2 ties t = (2k+1)/8, code = 4|value|
    ("e1m2", "rint", [(2 * k + 1) / 8 for k in range(8)], [0, 2, 2, 4, 4, 6, 6, 7]),
    ("e1m2", "round", [(2 * k + 1) / 8 for k in range(8)], [1, 2, 3, 4, 5, 6, 7, 7]),
    ("e1m2", "floor", [(2 * k + 1) / 8 for k in range(8)], [0, 1, 2, 3, 4, 5, 6, 7]),
    ("e1m2", "floor", [-(2 * k + 1) / 8 for k in range(8)], [9, 10, 11, 12, 13, 14, 15, 15]),
    # saturation (OCP blocks: E2M1 (6, 8) -> 6, E1M2 (1.75, 2) -> 1.75), NaN -> 0, signed zeros
    ("e2m1", "rint", [6.5, 7.99, -7.99, 1e30, float("inf"), float("-inf")], [7, 7, 15, 7, 7, 15]),
    ("e1m2", "rint", [1.8, 1.99, -1.99, 1e30], [7, 7, 15, 7]),
    ("e2m1", "rint", [float("nan"), -float("nan"), 0.0, -0.0, 0.2, -0.2], [0, 0, 0, 8, 0, 8]),
    ("e1m2", "round", [float("nan"), 0.0, -0.0, -0.1], [0, 0, 8, 8]),
    # floor on the signed value: a negative value below the first step gives -q, -0 stays -0
    ("e2m1", "floor", [-1e-30, -(2.0**-200), -0.0, 1e-30], [9, 9, 8, 0]),
    ("e1m2", "floor", [-1e-30, -(2.0**-276), -0.0, 0.2], [9, 9, 8, 0]),
]


@pytest.mark.parametrize(
    ("dst", "mode", "values", "codes"),
    [(torch.float4_e2m1fn_x2 if c[0] == "e2m1" else E1M2, *c[1:]) for c in SPEC_CASES],
    ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(SPEC_CASES)],
)
def test_fp4_encode_spec_values(dst, mode, values, codes):
    assert codes_of(values, dst, mode).tolist() == codes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dst", FP4, ids=["e2m1", "e1m2"])
def test_fp4_decode_and_round_trip(dst, mode):
    """The 16 codes decode to the spec's grid (E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}, E1M2 k/4, sign bit 0x8),
    and every code survives decode -> encode in every round mode."""
    fmt = MX_FORMAT[dst]
    codes = torch.arange(16, dtype=torch.uint8)
    grid = FORMATS[dst].grid.tolist()
    expected = torch.tensor(grid + [-g for g in grid], dtype=torch.float32)
    assert_exact(mx.decode(codes, fmt), expected, "decoded")
    assert torch.equal(mx.encode(mx.decode(codes, fmt), fmt, mode), codes)


def test_fp4_packing_low_nibble_first():
    """Byte j holds element 2j in bits 3:0 and element 2j+1 in bits 7:4 (spec 4.2; 5.3: [4, -6] -> 0xF6)."""
    gen = torch.Generator().manual_seed(0)
    nibbles = torch.randint(0, 16, (3, 5, 8), generator=gen, dtype=torch.uint8)
    packed = mx.pack_fp4(nibbles)
    assert packed.shape == (3, 5, 4) and packed.dtype == torch.uint8
    for j in range(4):
        assert torch.equal(packed[..., j], nibbles[..., 2 * j] + 16 * nibbles[..., 2 * j + 1])
    assert torch.equal(mx.unpack_fp4(packed), nibbles)
    assert torch.equal(mx.unpack_fp4(packed.view(torch.float4_e2m1fn_x2)), nibbles)
    assert mx.pack_fp4(torch.tensor([0x6, 0xF], dtype=torch.uint8)).tolist() == [0xF6]


# -------------------------------------------------------------------------------------- scale rules


def _scale(value, dtype, fmt, scale_alg=0):
    amax = mx.amax_bits(torch.tensor([[value, 0.0]], dtype=dtype), dim=-1)
    return int(mx.scale_codes(amax, fmt, scale_alg)[0])


@pytest.mark.parametrize(
    ("fmt", "value", "dtype", "code"),
    [
        (mx.E2M1, 6.0, torch.bfloat16, 127),  # floor(log2 6) = 2 = emax
        (mx.E2M1, 7.5, torch.bfloat16, 127),  # (6, 8): saturates to 6
        (mx.E2M1, 8.0, torch.bfloat16, 128),
        (mx.E2M1, 120.0, torch.bfloat16, 131),  # spec 5.3 packing case: Ef(120) = 133
        (mx.E2M1, 0.73046875, torch.bfloat16, 124),  # spec 5.3: Ef = 126
        (mx.E2M1, 2.0**127, torch.bfloat16, 252),  # the largest E2M1 code (spec 3.3)
        (mx.E2M1, 3.0e38, torch.bfloat16, 252),
        (mx.E2M1, 0.25, torch.bfloat16, 123),  # max(Ef - emax, 0) ...
        (mx.E2M1, 2.0**-126, torch.bfloat16, 0),  # ... clamped at 0
        (mx.E2M1, 2.0**-24, torch.float16, 101),  # fp16 subnormal amax widens to a normal exponent
        (mx.E1M2, 1.75, torch.bfloat16, 127),
        (mx.E1M2, 1.99, torch.bfloat16, 127),
        (mx.E1M2, 2.0, torch.bfloat16, 128),
        (mx.E1M2, 0.73046875, torch.bfloat16, 126),
        (mx.E1M2, 2.0**127, torch.bfloat16, 254),  # reachable only for E1M2 (spec 3.3)
        (mx.E1M2, 65504.0, torch.float16, 142),
        (mx.E1M2, 2.0**-133, torch.bfloat16, 0),  # bf16-subnormal amax: Ef == 0
        (mx.E1M2, 2.0**-140, torch.float32, 0),  # fp32-subnormal amax
    ],
)
def test_ocp_scale_rule_with_fp4_emax(fmt, value, dtype, code):
    """OCP (spec 3.3): code = max(Ef - emax, 0) with emax 2 (E2M1) / 0 (E1M2); Ef == 0 gives 0."""
    assert _scale(value, dtype, fmt) == code


def test_ocp_special_blocks_and_multiplier():
    """NaN/inf blocks 0xFF (multiplier NaN), zero and subnormal blocks 0 (multiplier 0), code 254 gives the
    fp32-subnormal multiplier 2**-127."""
    values = torch.tensor(
        [[float("nan")], [float("inf")], [0.0], [2.0**-130], [2.0**127]], dtype=torch.bfloat16
    )
    amax = mx.amax_bits(values, dim=-1)
    codes = mx.scale_codes(amax, mx.E1M2, 0)
    assert codes.tolist() == [255, 255, 0, 0, 254]
    recip = mx.scale_reciprocal(codes, amax, 0)
    assert torch.isnan(recip[:2]).all() and recip[2:4].tolist() == [0.0, 0.0] and recip[4].item() == 2.0**-127


@pytest.mark.parametrize("fmt", [mx.E2M1, mx.E1M2], ids=lambda f: f.name)
def test_rceil_is_fp8_only(fmt):
    """RCEIL (scale_alg 1) has no FP4 constant in CANN: asking for it is an error, never garbage."""
    with pytest.raises(ValueError, match="FP8 formats only"):
        mx.scale_codes(torch.tensor([0x3F800000]), fmt, 1)


def test_floor_of_tiny_negatives_is_exact():
    """Spec 7 item 13 (exact arithmetic): an E1M2 block with amax 2**127 (code 254, multiplier 2**-127)
    and a value -2**-100 gives t = -2**-227, whose floor is -0.25 (0x9), although an fp32 product would
    underflow to -0 (0x8). rint/round give -0."""
    block = torch.tensor([[2.0**127, -(2.0**-100), -0.0, 2.0**-100]], dtype=torch.bfloat16)
    for mode, expected in (("floor", [4, 9, 8, 0]), ("rint", [4, 8, 8, 0]), ("round", [4, 8, 8, 0])):
        codes, scale = mx.quantize_blocks(block, -1, mx.E1M2, 0, mode)
        assert scale.tolist() == [254]
        assert codes[0].tolist() == expected, mode


def test_formats_table():
    """The constants of spec 3.4 and how the destinations name them."""
    rows = [
        (f.name, f.ebits, f.mbits, f.bias, f.max_code, f.max_value, f.emax, f.bits)
        for f in MX_FORMAT.values()
    ]
    assert rows == [("e2m1", 2, 1, 1, 7, 6.0, 2, 4), ("e1m2", 1, 2, 1, 7, 1.75, 0, 4)]
    assert (
        mx.element_format(torch.float4_e2m1fn_x2) is mx.E2M1 and mx.E2M1.torch_dtype == torch.float4_e2m1fn_x2
    )
    assert mx.element_format("float4_e1m2fn_x2") is mx.E1M2 and mx.E1M2.torch_dtype == torch.uint8
    assert swiglu_ops.float4_e1m2fn_x2 == "float4_e1m2fn_x2"
    for dst in DSTS:
        assert mx.dst_from_name(mx.dst_name(dst)) == dst
    assert [mx.dst_name(d) for d in DSTS] == [
        "float8_e4m3fn",
        "float8_e5m2",
        "float4_e2m1fn_x2",
        "float4_e1m2fn_x2",
    ]
    for bad in (torch.float16, torch.uint8, "float8_e4m3fn", 41, None):
        with pytest.raises(TypeError, match="dst_dtype"):
            mx.element_format(bad)
    assert mx.ROUND_MODES == ("rint", "round", "floor")  # CANN's GetRoundMode names
    for bad in ("ceil", "RINT", None, 4):
        with pytest.raises(ValueError, match="round_mode"):
            mx.check_round_mode(bad)


# ---------------------------------------------------------------------------------- dequantisation


def _dequant_oracle(codes, scales, dst, *, axis, group_ends=None):
    """Plain loops: element code -> grid value, times 2**(scale - 127) of its block (NaN for 0xFF)."""
    fmt = FORMATS[dst]
    m, n = codes.shape
    vals = grid_decode(codes, fmt)
    out = torch.empty(m, n, dtype=torch.float64)
    for i, j in itertools.product(range(m), range(n)):
        if axis == -1:
            s = int(scales[i, (j // 32) // 2, (j // 32) % 2])
        else:
            s = 0
            start = 0
            for g, end in enumerate(group_ends if group_ends is not None else [m]):
                if start <= i < end:
                    t = (i - start) // 32
                    base = 0 if group_ends is None else start // 64 + g
                    s = int(scales[base + t // 2, j, t % 2])
                start = end
        out[i, j] = float("nan") if s == 255 else float(vals[i, j]) * 2.0 ** (s - 127)
    return out


@pytest.mark.parametrize("dst", DSTS, ids=DST_IDS)
@pytest.mark.parametrize("n", [2, 20, 64, 100])
def test_dequantize_partial_blocks_and_fp4(dst, n):
    """mx_dequantize on both axes for N not a multiple of 32 and packed FP4 (E1M2 from uint8 data with
    dst_dtype named), against the plain-loop oracle; random codes and scales, 0xFF included."""
    gen = torch.Generator().manual_seed(n)
    fmt = FORMATS[dst]
    m, ends = 70, [10, 10, 45, 70]
    codes = torch.randint(0, 2 * (len(fmt.grid)), (m, n), generator=gen)
    codes = torch.where(codes >= len(fmt.grid), codes - len(fmt.grid) + fmt.sign, codes).to(torch.uint8)
    data = (codes[:, 0::2] + 16 * codes[:, 1::2]).to(torch.uint8) if fmt.fp4 else codes
    data = data.view(fmt.out_dtype)
    s1 = torch.randint(100, 150, (m, -(-n // 64), 2), generator=gen, dtype=torch.uint8)
    s1[3, 0, 0] = 255
    s2 = torch.randint(100, 150, (m // 64 + len(ends), n, 2), generator=gen, dtype=torch.uint8)
    s2[0, 1, 0] = 255
    kwargs = {"dst_dtype": dst} if dst == E1M2 else {}
    expected1 = _dequant_oracle(codes, s1, dst, axis=-1)
    got1 = swiglu_ops.mx_dequantize(data, s1.view(torch.float8_e8m0fnu), axis=-1, **kwargs)
    assert_exact(got1, expected1.float(), "axis -1")  # every value is exact in fp32
    got2 = swiglu_ops.mx_dequantize(data, s2, axis=-2, group_index=torch.tensor(ends), **kwargs)
    assert_exact(got2, _dequant_oracle(codes, s2, dst, axis=-2, group_ends=ends).float(), "axis -2")
    got64 = swiglu_ops.mx_dequantize(data, s1, axis=-1, dtype=torch.float64, **kwargs)
    torch.testing.assert_close(got64, expected1, rtol=0, atol=0, equal_nan=True)
    if fmt.fp4:  # uint8 data with the format named reads the same as the typed tensor
        raw = swiglu_ops.mx_dequantize(data.view(torch.uint8), s1, axis=-1, dst_dtype=dst)
        assert_exact(raw, got1, "raw uint8 codes")
