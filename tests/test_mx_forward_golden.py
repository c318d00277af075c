"""The worked examples of ``shared/spec/swiglu_mx_quant.md`` section 5, with their expected values written
out: the published torch_npu goldens (5.1), the aclnn example and the derived partial-block cases (5.2), the
hand-derived single values (5.3) and the round-before-quantise discriminator (5.4). Where the document
elides values ("..."), the stated ones are checked literally and the rest against the independent oracle.
Compared exactly on the reference backend, with the contract's tolerances on the fast backends.
"""

from __future__ import annotations

import pytest
import torch
from _fwd_oracles import FP4, assert_forward_matches, expected_forward, stage1

import swiglu_ops

E4M3, E5M2, E2M1 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2
E1M2 = swiglu_ops.float4_e1m2fn_x2
E8M0 = torch.float8_e8m0fnu
BF16 = torch.bfloat16


def codes(values, dtype, shape) -> torch.Tensor:
    """Raw uint8 codes viewed as ``dtype``, broadcast to ``shape``."""
    return torch.tensor(values, dtype=torch.uint8).expand(shape).contiguous().view(dtype)


def quant(x, group_index=None, **kwargs):
    return swiglu_ops.swiglu_mx_quant_dual_axis(x, group_index, **kwargs)


# ------------------------------------------------------------------------------------------- 5.1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_opp_golden_a_groups(backend, dtype):
    """5.1 (a): ones[4,8], group_index [2,4], defaults: act 0.73046875 -> scale 118, element 384 = 0x7C;
    mxscale1 [[118, 0]] per row (one partial block + the pad slot); mxscale2 [2,4,2]: group 0 at row 0,
    group 1 at row 2//64 + 1 = 1, each [118, 0]. fp16 gives the same codes."""
    got = quant(torch.ones(4, 8, dtype=dtype), torch.tensor([2, 4]), backend=backend)
    y = codes([0x7C], E4M3, (4, 4))
    expected = (y, codes([[118, 0]], E8M0, (4, 1, 2)), y, codes([[118, 0]], E8M0, (2, 4, 2)))
    assert_forward_matches(got, expected, backend, E4M3)
    assert got[0].view(torch.uint8).to(torch.int64).tolist() == [[0x7C] * 4] * 4
    assert (got[0].float().to(torch.int64) % 256 == 128).all(), "the test's .to(uint8) view: 384 mod 256"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_opp_golden_b_no_groups(backend, dtype):
    """5.1 (b): same x without group_index: mxscale2 [ceil(4/64) = 1, 4, 2] = [[118, 0]] * 4."""
    got = quant(torch.ones(4, 8, dtype=dtype), backend=backend)
    y = codes([0x7C], E4M3, (4, 4))
    expected = (y, codes([[118, 0]], E8M0, (4, 1, 2)), y, codes([[118, 0]], E8M0, (1, 4, 2)))
    assert_forward_matches(got, expected, backend, E4M3)


# ------------------------------------------------------------------------------------------- 5.2


def test_aclnn_example_subnormal_inputs(backend):
    """5.2 EX: x bits i % 100 as bf16 [256, 1024] (subnormals), gi [256], rint, alg 1, E4M3FN: the
    activation underflows to +0: y = 0, mxscale1 [256, 8, 2] = 0, mxscale2 [5, 512, 2] = 0 (row 4 unused)."""
    x = (torch.arange(256 * 1024) % 100).to(torch.int16).view(BF16).reshape(256, 1024)
    got = quant(x, torch.tensor([256]), scale_alg=1, backend=backend)
    y = codes([0], E4M3, (256, 512))
    expected = (y, codes([0], E8M0, (256, 8, 2)), y, codes([0], E8M0, (5, 512, 2)))
    assert_forward_matches(got, expected, backend, E4M3)


N20_X = torch.cat([torch.ones(1, 20), torch.arange(1, 21, dtype=torch.float32).reshape(1, 20)], dim=1).to(
    BF16
)


def test_partial_block_n20_rceil(backend):
    """5.2 N = 20, alg 1, E4M3FN: act = bf16(0.7310586 j) = 0.73046875 ... 14.625; scale 123 (2**-4);
    y = act * 16 -> 12, 24, 36, ..., 224, 240 (0x54, 0x5C, ..., 0x77); mxscale1 [[123, 0]]; mxscale2
    column c = [S(act[0, c]), 0]."""
    got = quant(N20_X, backend=backend)
    y1 = got[0].view(torch.uint8)[0].tolist()
    assert y1[:2] == [0x54, 0x5C] and y1[-1] == 0x77
    assert got[0][0, :3].float().tolist() == [12.0, 24.0, 36.0] and got[0][0, -2:].float().tolist() == [
        224.0,
        240.0,
    ]
    assert got[1].view(torch.uint8).tolist() == [[[123, 0]]]
    assert_forward_matches(got, expected_forward(stage1(N20_X)), backend, E4M3)


def test_partial_block_n20_ocp_saturates(backend):
    """5.2 N = 20, alg 0, E4M3FN: Ef(14.625) = 130, scale 122, y = act * 32: 13.875 * 32 = 444 -> 448 and
    14.625 * 32 = 468 saturates to 448 (0x7E)."""
    got = quant(N20_X, scale_alg=0, backend=backend)
    assert got[1].view(torch.uint8).tolist() == [[[122, 0]]]
    assert got[0].view(torch.uint8)[0, -2:].tolist() == [0x7E, 0x7E]
    assert_forward_matches(got, expected_forward(stage1(N20_X), scale_alg=0), backend, E4M3)


def test_partial_block_n20_e2m1(backend):
    """5.2 N = 20, E2M1 (OCP): scale 128, y = act / 2 -> 0.5, 0.5, 1, 1.5, 2, 2, 3, 3, 3, 4, 4, 4, 4, 6, ...,
    6; packed bytes 0x11, 0x32, 0x44, 0x55, 0x65, 0x66, 0x76, 0x77, 0x77, 0x77."""
    got = quant(N20_X, dst_dtype=E2M1, backend=backend)
    packed = [0x11, 0x32, 0x44, 0x55, 0x65, 0x66, 0x76, 0x77, 0x77, 0x77]
    assert got[0].view(torch.uint8).tolist() == [packed]
    assert got[1].view(torch.uint8).tolist() == [[[128, 0]]]
    assert_forward_matches(got, expected_forward(stage1(N20_X), dst=E2M1), backend, E2M1)


# ------------------------------------------------------------------------------------------- 5.3

TABLE_5_3 = [  # (dst, scale_alg, round_mode, mxscale, y byte)
    (E4M3, 1, "rint", 118, 0x7C),
    (E4M3, 0, "rint", 118, 0x7C),
    (E5M2, 1, "rint", 111, 0x7A),
    (E5M2, 0, "rint", 111, 0x7A),
    (E2M1, 0, "rint", 124, 0x77),
    (E2M1, 0, "round", 124, 0x77),
    (E2M1, 0, "floor", 124, 0x66),
    (E1M2, 0, "rint", 126, 0x66),
    (E1M2, 0, "round", 126, 0x66),
    (E1M2, 0, "floor", 126, 0x55),
]


@pytest.mark.parametrize(
    ("dst", "alg", "mode", "scale", "byte"),
    TABLE_5_3,
    ids=[f"{str(r[0]).split('.')[-1]}-{r[1]}-{r[2]}" for r in TABLE_5_3],
)
def test_hand_derived_single_values(backend, dst, alg, mode, scale, byte):
    """5.3 table: bf16 ones[4,8] (act 0.73046875, Ef 126) for every format, rule and round mode."""
    got = quant(torch.ones(4, 8, dtype=BF16), dst_dtype=dst, scale_alg=alg, round_mode=mode, backend=backend)
    width = 2 if dst in FP4 else 4
    out_dtype = {E2M1: E2M1, E1M2: torch.uint8}.get(dst, dst)
    y = codes([byte], out_dtype, (4, width))
    expected = (y, codes([[scale, 0]], E8M0, (4, 1, 2)), y, codes([[scale, 0]], E8M0, (1, 4, 2)))
    assert_forward_matches(got, expected, backend, dst)


def test_fp4_packing_order(backend):
    """5.3: x = [[30, 30, 2, -4]], E2M1: act = [60, -120], scale 131, t = [3.75, -7.5] -> [4 (code 6),
    -6 (code 0xF)] -> byte 0xF6 (element 0 in the low nibble)."""
    got = quant(torch.tensor([[30.0, 30.0, 2.0, -4.0]], dtype=BF16), dst_dtype=E2M1, backend=backend)
    assert got[0].view(torch.uint8).tolist() == [[0xF6]] and got[1].view(torch.uint8).tolist() == [[[131, 0]]]
    assert_forward_matches(
        got,
        expected_forward(stage1(torch.tensor([[30.0, 30.0, 2.0, -4.0]], dtype=BF16)), dst=E2M1),
        backend,
        E2M1,
    )


@pytest.mark.parametrize(("dst", "byte"), [(E4M3, 0x80), (E2M1, 0x88)], ids=["e4m3fn", "e2m1"])
def test_zero_block(backend, dst, byte):
    """5.3: x = [0...0 | -1...-1]: act = 0 / 2 * -1 = -0 -> scale 0, y 0x80 (FP8) / 0x88 (FP4 byte)."""
    x = torch.cat([torch.zeros(2, 8), -torch.ones(2, 8)], dim=1).to(BF16)
    got = quant(x, dst_dtype=dst, backend=backend)
    width = 4 if dst in FP4 else 8
    y = codes([byte], dst, (2, width))
    expected = (y, codes([[0, 0]], E8M0, (2, 1, 2)), y, codes([[0, 0]], E8M0, (1, 8, 2)))
    assert_forward_matches(got, expected, backend, dst)


def test_fp16_overflow(backend):
    """5.3: x = 300 everywhere (fp16): act = 90000 -> inf -> mxscale 0xFF, y 0."""
    got = quant(torch.full((2, 8), 300.0, dtype=torch.float16), backend=backend)
    y = codes([0], E4M3, (2, 4))
    expected = (y, codes([[0xFF, 0]], E8M0, (2, 1, 2)), y, codes([[0xFF, 0]], E8M0, (1, 4, 2)))
    assert_forward_matches(got, expected, backend, E4M3)


def test_minus_inf_activation_is_nan(backend):
    """5.3 / 2.2: A = -inf: exp(inf) + 1 = inf, -inf / inf = NaN -> 0xFF and y 0 for that row block and
    column block; the other row is the ones result (118, 0x7C)."""
    x = torch.ones(2, 8, dtype=BF16)
    x[0, 1] = float("-inf")
    got = quant(x, backend=backend)
    y1 = codes([[0] * 4, [0x7C] * 4], E4M3, (2, 4))
    y2 = codes([[0x7C, 0, 0x7C, 0x7C]] * 2, E4M3, (2, 4))
    s1 = codes([[[0xFF, 0]], [[118, 0]]], E8M0, (2, 1, 2))
    s2 = codes([[[118, 0], [0xFF, 0], [118, 0], [118, 0]]], E8M0, (1, 4, 2))
    assert_forward_matches(got, (y1, s1, y2, s2), backend, E4M3)


# ------------------------------------------------------------------------------------------- 5.4


def test_round_before_quantize_discriminator(backend):
    """5.4: x row = [0.77734375] * 32 ++ [1.0] * 32 (bf16), alg 1, E4M3FN: act(fp32) 0.5325639 rounds to
    bf16 0.53125 first; scale 118; 0.53125 * 2**9 = 272 is a tie -> 256 = 0x78 (not 288 = 0x79)."""
    x = torch.cat([torch.full((1, 32), 0.77734375), torch.ones(1, 32)], dim=1).to(BF16)
    got = quant(x, backend=backend)
    y = codes([0x78], E4M3, (1, 32))
    expected = (y, codes([[118, 0]], E8M0, (1, 1, 2)), y, codes([[118, 0]], E8M0, (1, 32, 2)))
    assert_forward_matches(got, expected, backend, E4M3)
