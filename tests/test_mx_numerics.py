"""MX numerics: the FP8 encoder and the E8M0 scale rules of ``swiglu_ops.mx`` (spec 3.1-3.3), checked on
their own and, through inputs with a known gradient, through every backend's fused op.
"""

from __future__ import annotations

import pytest
import torch
from _compare import assert_exact, assert_mx_matches
from _oracles import expected_mx, known_gradient_inputs

import swiglu_ops
from swiglu_ops.numerics import mx

FORMATS = [mx.E4M3FN, mx.E5M2]
ALL_CODES = torch.arange(256).to(torch.uint8)


def finite_codes(fmt: mx.FP8Format) -> torch.Tensor:
    """Every code whose value is finite (both signs, both zeros)."""
    return ALL_CODES[(ALL_CODES.long() & 0x7F) <= fmt.max_code]


def encode(values, fmt: mx.FP8Format) -> torch.Tensor:
    return mx.fp8_encode(torch.as_tensor(values, dtype=torch.float32), fmt)


# ------------------------------------------------------------------------------------------ fp8 codec


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_decode_matches_torch_for_all_codes(fmt):
    assert_exact(mx.fp8_decode(ALL_CODES, fmt), ALL_CODES.view(fmt.torch_dtype).float(), "decoded")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_encode_decode_round_trip_all_codes(fmt):
    """Every finite code (256 minus NaN and inf codes) survives decode -> encode, the signed zeros too."""
    codes = finite_codes(fmt)
    assert codes.numel() == (254 if fmt is mx.E4M3FN else 248)
    assert torch.equal(mx.fp8_encode(mx.fp8_decode(codes, fmt), fmt), codes)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_ties_round_to_even_and_neighbours_round_to_nearest(fmt):
    """The midpoint of two neighbouring codes goes to the even code; one fp32 ulp off it, to the nearer."""
    for sign in (0, 0x80):
        lo = torch.arange(fmt.max_code) | sign  # magnitude k and k + 1, both finite
        hi = lo + 1
        mid = (
            mx.fp8_decode(lo.to(torch.uint8), fmt).double() + mx.fp8_decode(hi.to(torch.uint8), fmt).double()
        ) / 2
        mid32 = mid.float()
        assert torch.equal(mid32.double(), mid), "fp8 midpoints are exact in fp32"
        even = torch.where(lo % 2 == 0, lo, hi).to(torch.uint8)
        assert torch.equal(mx.fp8_encode(mid32, fmt), even)
        toward_zero = torch.nextafter(mid32, torch.zeros_like(mid32))
        away = torch.nextafter(mid32, mid32 * 2)
        assert torch.equal(mx.fp8_encode(toward_zero, fmt), lo.to(torch.uint8))
        assert torch.equal(mx.fp8_encode(away, fmt), hi.to(torch.uint8))


@pytest.mark.parametrize(
    ("fmt", "values"),
    [
        (mx.E4M3FN, [448.0, 463.99, 464.0, 480.0, 512.0, 1e6, 3.4e38, float("inf")]),
        (mx.E5M2, [57344.0, 61439.0, 61440.0, 65536.0, 1e9, 3.4e38, float("inf")]),
    ],
    ids=["e4m3fn", "e5m2"],
)
def test_saturation(fmt, values):
    """Finite magnitudes above max (even those whose RNE would round up past max) and inf saturate."""
    v = torch.tensor(values)
    assert torch.equal(encode(v, fmt), torch.full((len(values),), fmt.max_code, dtype=torch.uint8))
    assert torch.equal(encode(-v, fmt), torch.full((len(values),), fmt.max_code | 0x80, dtype=torch.uint8))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_nan_encodes_to_zero_and_zero_keeps_its_sign(fmt):
    """Spec 3.2: NaN (either sign) -> 0x00; +0 -> 0x00, -0 -> 0x80, tiny values keep their sign."""
    nan = torch.tensor([float("nan")])
    tiny = 2.0 ** (fmt.min_normal_exp - fmt.mbits - 2)  # a quarter of the smallest subnormal
    got = encode([nan.item(), -nan.item(), 0.0, -0.0, tiny, -tiny, 1e-45, -1e-45], fmt)
    assert got.tolist() == [0x00, 0x00, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_encode_matches_torch_cast_where_torch_is_trustworthy(fmt):
    """Dense sweep of fp32 bit patterns in [0, max] (stride 1009), both signs, plus every midpoint between
    codes and its fp32 neighbours, against torch's eager RNE cast (only finite |v| <= max)."""
    max_bits = int(torch.tensor(fmt.max_value).view(torch.int32))
    sweep = torch.arange(0, max_bits + 1, 1009, dtype=torch.int32).view(torch.float32)
    vals = mx.fp8_decode(finite_codes(fmt), fmt)
    pairs = torch.stack([vals[:-1], vals[1:]]).double()
    mids = pairs.mean(0).float()
    mids = mids[mids.abs() <= fmt.max_value]
    near = torch.cat([mids, torch.nextafter(mids, mids * 2), torch.nextafter(mids, torch.zeros_like(mids))])
    v = torch.cat([sweep, -sweep, near, torch.tensor([fmt.max_value, -fmt.max_value])])
    assert torch.equal(mx.fp8_encode(v, fmt), v.to(fmt.torch_dtype).view(torch.uint8))


# --------------------------------------------------------------------------------------- scale rules


def _scale(value, dtype, fmt, scale_alg):
    amax = mx.amax_bits(torch.tensor([[value, 0.0]], dtype=dtype), dim=-1)
    return int(mx.scale_codes(amax, fmt, scale_alg)[0])


def test_rceil_inverse_constants_are_fp32_reciprocals():
    """Spec 3.4: INV is fp32(1/max) and fp32(max * 2**k) * INV == 2**k exactly for |k| <= 20."""
    for fmt in FORMATS:
        inv = torch.tensor(fmt.inv_max_bits, dtype=torch.int32).view(torch.float32)
        assert inv.item() == torch.tensor(1 / fmt.max_value, dtype=torch.float32).item()
        k = torch.arange(-20, 21, dtype=torch.float32)
        assert torch.equal((fmt.max_value * 2.0**k) * inv, 2.0**k)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_scale_codes_of_powers_of_two_times_max(fmt):
    """RCEIL: amax = max * 2**k gives exactly 127 + k, one fp32 ulp above it 128 + k. OCP
    (floor(log2 amax) - emax + 127) gives 127 + k for both."""
    for k in range(-8, 9):
        v = fmt.max_value * 2.0**k
        assert _scale(v, torch.float32, fmt, 1) == 127 + k
        above = torch.nextafter(torch.tensor(v), torch.tensor(float("inf"))).item()
        assert _scale(above, torch.float32, fmt, 1) == 128 + k
        assert _scale(v, torch.float32, fmt, 0) == 127 + k  # max = 1.75 * 2**emax


# ------------------------------------------------ special values through the op (torchao's contract)

BF16_MAX = torch.finfo(torch.bfloat16).max
F16_MAX = torch.finfo(torch.float16).max
BF16_MIN_SUBNORMAL = 2.0**-133
THREE_HALVES_PLUS_ULP = torch.nextafter(torch.tensor(3.5), torch.tensor(4.0)).item()

# (id, x dtype, value, dst dtype, scale_alg, expected scale code, expected element code)
SPECIAL = [
    ("zero", torch.bfloat16, 0.0, torch.float8_e4m3fn, 1, 0, 0x00),
    ("negative_zero", torch.bfloat16, -0.0, torch.float8_e4m3fn, 1, 0, 0x80),
    ("nan", torch.bfloat16, float("nan"), torch.float8_e4m3fn, 1, 0xFF, 0x00),
    ("inf", torch.bfloat16, float("inf"), torch.float8_e4m3fn, 1, 0xFF, 0x00),
    ("minus_inf_ocp", torch.float16, float("-inf"), torch.float8_e4m3fn, 0, 0xFF, 0x00),
    ("bf16_max_rceil", torch.bfloat16, BF16_MAX, torch.float8_e4m3fn, 1, 247, 0x78),  # 255 -> 256
    ("bf16_max_ocp", torch.bfloat16, BF16_MAX, torch.float8_e4m3fn, 0, 246, 0x7E),  # 510 saturates
    ("fp16_max_rceil", torch.float16, F16_MAX, torch.float8_e4m3fn, 1, 135, 0x78),
    ("fp16_max_ocp", torch.float16, F16_MAX, torch.float8_e4m3fn, 0, 134, 0x7E),
    ("480_rceil", torch.bfloat16, 480.0, torch.float8_e4m3fn, 1, 128, 0x77),  # 240
    ("480_ocp", torch.bfloat16, 480.0, torch.float8_e4m3fn, 0, 127, 0x7E),  # 480 saturates to 448
    ("60_ocp", torch.bfloat16, 60.0, torch.float8_e4m3fn, 0, 124, 0x7E),  # (448, 512) * 2**-3
    ("-500_ocp", torch.bfloat16, -500.0, torch.float8_e4m3fn, 0, 127, 0xFE),
    ("3.5_rceil", torch.float32, 3.5, torch.float8_e4m3fn, 1, 120, 0x7E),
    ("3.5_plus_ulp_rceil", torch.float32, THREE_HALVES_PLUS_ULP, torch.float8_e4m3fn, 1, 121, 0x76),
    ("bf16_min_subnormal_rceil", torch.bfloat16, BF16_MIN_SUBNORMAL, torch.float8_e4m3fn, 1, 0, 0x08),
    ("bf16_min_subnormal_ocp", torch.bfloat16, BF16_MIN_SUBNORMAL, torch.float8_e4m3fn, 0, 0, 0x00),
    ("e5m2_max_rceil", torch.bfloat16, 57344.0, torch.float8_e5m2, 1, 127, 0x7B),
    ("e5m2_saturate_ocp", torch.bfloat16, 63488.0, torch.float8_e5m2, 0, 127, 0x7B),  # RNE -> 65536
    ("e5m2_saturate_ocp_negative", torch.bfloat16, -63488.0, torch.float8_e5m2, 0, 127, 0xFB),
    ("e5m2_rceil", torch.float16, 3.0, torch.float8_e5m2, 1, 113, 0x7A),  # 3 * 2**14 = 49152
]


@pytest.mark.parametrize(
    ("dtype", "value", "dst", "scale_alg", "scale", "code"),
    [case[1:] for case in SPECIAL],
    ids=[case[0] for case in SPECIAL],
)
def test_special_values(backend, dtype, value, dst, scale_alg, scale, code):
    """One special value at the top of a zero block, quantised by the fused op (M = 1, so the column block
    holds the same single value): the expected scale and element codes on both axes, and every other
    output as the layout oracle says."""
    values = torch.zeros(1, 32, dtype=dtype)
    values[0, 0] = value
    x, y_grad, grad = known_gradient_inputs(values)
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, y_grad, scale_alg=scale_alg, dst_dtype=dst, backend=backend
    )
    y1, s1, y2, s2 = (t.view(torch.uint8) for t in got)
    assert (int(s1[0, 0, 0]), int(y1[0, 0])) == (scale, code)
    assert (int(s2[0, 0, 0]), int(y2[0, 0])) == (scale, code)
    assert_mx_matches(got, expected_mx(grad, dst_dtype=dst, scale_alg=scale_alg), backend)


def test_format_constants_trace_under_torch_compile():
    """torch.compile traces the reference through FP8Format.inv_max (the format is an argument there);
    decoding the bits inside the traced property sent Dynamo's struct.pack polyfill into endless
    recursion."""

    def scale(v, fmt):
        return v * torch.tensor(fmt.inv_max, dtype=torch.float32)

    t = torch.tensor([448.0, 1.0])
    f = torch.compile(scale, fullgraph=True, backend="eager", dynamic=True)
    for fmt in (mx.E4M3FN, mx.E5M2):
        assert torch.equal(f(t, fmt), scale(t, fmt))
