"""CPU-backend specific tests: the C library's numerics and instruction sets, random data against the
reference (specials, ragged groups, every option), every instruction set bit for bit against every other,
threads and processes (thread counts, concurrent callers, fork), the build and its fallbacks, indexing
beyond 2**31 elements, the output cache.

Tests taking ``isa`` run once per instruction set this machine runs (portable, AVX2, AVX-512, AVX-512 with
AVX512-BF16). The conformance suite (golden cases, errors, properties) runs on this backend too, through
``tests/conftest.py`` (with the default instruction set); the tolerances are those of the contract,
implemented in ``tests/_compare.py``.
"""

from __future__ import annotations

import gc
import json
import math
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from _compare import MX_NAMES as _MX_NAMES
from _compare import assert_bitwise_equal, assert_exact, assert_group_grad_matches, assert_mx_matches
from _fwd_oracles import assert_forward_matches
from _oracles import known_gradient_inputs

import swiglu_ops
from swiglu_ops.backends import cpu as cpu_backend
from swiglu_ops.backends import reference
from swiglu_ops.backends.cpu import _loader
from swiglu_ops.numerics.glu import GluParams, fp32_bits
from swiglu_ops.ops import registry

LIB = cpu_backend.LIBRARY.lib
ISAS = cpu_backend.LIBRARY.supported_isas()


def test_the_library_is_built_and_loaded():
    """CI machines have a C compiler: the library must be there (a missing or stale build fails here)."""
    assert LIB is not None, cpu_backend.LIBRARY.why
    allowed = _loader.isa_choice_from_env(os.environ.get("SWIGLU_OPS_CPU_SIMD"))  # CI also runs portable
    assert "portable" in ISAS and cpu_backend.LIBRARY.isa == next(n for n in allowed if n in ISAS)


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch) -> str:
    """Run the cpu backend with one instruction set's kernels."""
    monkeypatch.setattr(cpu_backend.LIBRARY, "isa", request.param)
    monkeypatch.setattr(cpu_backend.LIBRARY, "isa_code", getattr(LIB, f"SWIGLU_ISA_{request.param.upper()}"))
    return request.param


def _with_isa(name: str):
    cpu_backend.LIBRARY.isa_code = getattr(LIB, f"SWIGLU_ISA_{name.upper()}")


# ------------------------------------------------------------------------------------------ numerics


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in fp32 units in the last place (same-sign finite values)."""
    ia, ib = a.view(torch.int32).to(torch.int64), b.view(torch.int32).to(torch.int64)
    return (ia - ib).abs()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sigmoid_table_is_within_two_ulp_of_the_sigmoid_with_a_correctly_rounded_exp(dtype):
    """The kernels' exp: 1 / (1 + exp(-a)) in fp32 for every 16-bit input, against the same fp32 formula
    with a correctly rounded exp (float64 exp rounded to fp32; exp(-a) overflows to inf past 88.72, as in
    the reference)."""
    table = cpu_backend.act_table(LIB.SWIGLU_ACT_SIGMOID, dtype)
    a = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype).float()
    e = torch.exp(-a.double()).float()  # correctly rounded (overflow to inf)
    want = 1.0 / (1.0 + e)
    finite = torch.isfinite(a)
    assert int(_ulps(table[finite], want[finite]).max()) <= 2  # exp within 1 ulp, then 1 / (1 + e)
    assert torch.isnan(table[torch.isnan(a)]).all()
    assert float(table[a == float("inf")]) == 1.0 and float(table[a == -float("inf")]) == 0.0


@pytest.mark.parametrize(
    ("kind", "alpha", "limit"),
    [
        ("SIGMOID", 1.0, float("inf")),
        ("SIGMOID", 1.0, 7.0),
        ("GLU", 1.0, float("inf")),
        ("GLU", 1.702, 7.0),
        ("GLU_SIG", 1.702, 7.0),
        ("GLU_SIG", 2.5, float("inf")),
        ("SILU_MIN", 1.0, 7.0),
        ("SILU_DERIV", 1.0, float("inf")),
        ("SILU_DERIV", 1.0, 7.0),
        ("SIGMOID_GLU", 1.0, float("inf")),  # the pair tables: two floats per entry (act_table once wrote
        ("GLU_SIG_GLU", 1.702, 7.0),  # them into a one-float buffer: a heap overflow)
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_activation_tables_are_identical_on_every_instruction_set(kind, alpha, limit, dtype):
    code = getattr(LIB, f"SWIGLU_ACT_{kind}")
    tables = {isa: cpu_backend.act_table(code, dtype, alpha, limit, isa=isa) for isa in ISAS}
    for isa, table in tables.items():
        assert_bitwise_equal(table, tables["portable"], f"{kind} table, {isa}")


@pytest.mark.parametrize("limit", [float("inf"), 7.0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_silu_derivative_table_is_group_grads_formula_on_the_sigmoid_table(dtype, limit):
    """SWIGLU_ACT_SILU_DERIV (swiglu_group_grad's (silu, silu') of the clamped gate, read by the AVX2 and
    portable kernels instead of the sigmoid table plus arithmetic) holds, for every bit pattern, exactly
    swiglu_group_grad.md section 3's fp32 operations on the sigmoid table's value."""
    pairs = cpu_backend.act_table(LIB.SWIGLU_ACT_SILU_DERIV, dtype, 1.0, limit).view(-1, 2)
    s = cpu_backend.act_table(LIB.SWIGLU_ACT_SIGMOID, dtype, 1.0, limit)
    g = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype).float()
    g = torch.where(g > limit, torch.tensor(limit), g)  # min(g, clamp), NaN kept
    f = torch.where(g == -math.inf, torch.zeros(()), g * s)
    sp = torch.where(g.isinf(), s, (s + f) - f * s)
    assert_exact(pairs[:, 0].contiguous(), f, "silu")  # the table's NaNs are canonical (every ISA the same)
    assert_exact(pairs[:, 1].contiguous(), sp, "silu'")
    assert float(pairs[:, 1][g == 0.5].max()) > 0.5  # the table is not degenerate


@pytest.mark.parametrize(("dtype", "subnormals"), [("BF16", 2 * 127), ("FP16", 2 * 1023)])
@pytest.mark.parametrize("fmt", ["E4M3", "E5M2", "E2M1", "E1M2"])
def test_the_fp8_encoder_of_16_bit_values_matches_the_per_element_encoder_everywhere(dtype, subnormals, fmt):
    """The MX kernels encode 16-bit values 32 at a time from their bits, both axes at once (numerics.h
    fp8x32_code2), FP8 and FP4 with round mode rint: for every finite bit pattern and every scale code on
    each axis, the same code as the per-element encoder (fp8_encode of the fp32 product; fp4_encode), except
    the subnormal sources it leaves to that encoder (counted: the kernels then use it)."""
    ffi = cpu_backend.LIBRARY.ffi
    for name in ISAS:
        mismatches, left = ffi.new("int64_t *"), ffi.new("int64_t *")
        code = getattr(LIB, f"SWIGLU_ISA_{name.upper()}")
        LIB.swiglu_fp8_x32_check(
            getattr(LIB, f"SWIGLU_{dtype}"), getattr(LIB, f"SWIGLU_FMT_{fmt}"), code, mismatches, left
        )
        # left: the subnormal sources under every scale code but 0xFF (a NaN/inf block: all codes 0x00), on
        # both axes
        assert (mismatches[0], left[0]) == (0, 2 * 255 * subnormals), name


# ----------------------------------------------------------------------------- against the reference


def _with_specials(t: torch.Tensor, gen: torch.Generator, rate: float = 0.002) -> torch.Tensor:
    """Sprinkle NaN, +-inf and signed zeros over ``t`` (a copy)."""
    t = t.clone()
    flat = t.view(-1)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0], dtype=t.dtype)
    n = max(1, int(flat.numel() * rate))
    pos = torch.randint(0, flat.numel(), (n,), generator=gen)
    flat[pos] = specials[torch.randint(0, len(specials), (n,), generator=gen)]
    return t


def _group_grad_inputs(shape, dtype, seed, *, weighted, scale=3.0, specials=True):
    gen = torch.Generator().manual_seed(seed)
    *lead, hidden = shape
    dy = torch.randn(*lead, hidden, generator=gen).to(dtype)
    x = (torch.randn(*lead, 2 * hidden, generator=gen) * scale).to(dtype)
    if specials:
        dy, x = _with_specials(dy, gen), _with_specials(x, gen)
    weight = y_origin = None
    if weighted:
        weight = torch.rand(*lead, 1, generator=gen) + 0.5
        y_origin = torch.randn(*lead, hidden, generator=gen).to(dtype)
    return dy, x, weight, y_origin


def _check_group_grad(dy, x, weight, y_origin, group_index, clamp):
    actual = swiglu_ops.swiglu_group_grad(dy, x, weight, y_origin, group_index, clamp, backend="cpu")
    expected = swiglu_ops.swiglu_group_grad(dy, x, weight, y_origin, group_index, clamp, backend="reference")
    assert_group_grad_matches(actual, expected, "cpu", inputs=(dy, x, weight, y_origin, clamp))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("clamp", [0.0, 2.5, float("inf")])
@pytest.mark.parametrize("weighted", [False, True])
def test_group_grad_matches_reference(dtype, clamp, weighted, isa):
    dy, x, weight, y_origin = _group_grad_inputs((97, 300), dtype, seed=1, weighted=weighted)
    _check_group_grad(dy, x, weight, y_origin, torch.tensor([40, 31]), clamp)


@pytest.mark.parametrize("shape", [(3, 5, 1), (2, 33, 17), (40, 1000), (2, 5000)], ids=str)
def test_group_grad_shapes_rank3_odd_hidden_and_long_rows(shape, isa):
    """(2, 5000): two rows, cut into chunks of pairs so that every thread gets work."""
    dy, x, weight, y_origin = _group_grad_inputs(shape, torch.bfloat16, seed=2, weighted=True)
    _check_group_grad(dy, x, weight, y_origin, None, 7.0)


def test_group_grad_fp16_overflow_becomes_inf(isa):
    dy, x, _, _ = _group_grad_inputs((64, 128), torch.float16, seed=3, weighted=False, specials=False)
    dy = dy * 300  # |dg| = |dy * silu'(g) * u| reaches well past 65504
    x[:, 128:] = x[:, 128:] * 100
    actual, _ = swiglu_ops.swiglu_group_grad(dy, x, backend="cpu")
    assert torch.isinf(actual).any()
    _check_group_grad(dy, x, None, None, None, 0.0)


def _mx_inputs(shape, dtype, seed, *, specials=True, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    *lead, c = shape
    x = (torch.randn(*lead, c, generator=gen) * scale).to(dtype)
    dy = torch.randn(*lead, c // 2, generator=gen).to(dtype)
    if specials:
        x, dy = _with_specials(x, gen, 0.0005), _with_specials(dy, gen, 0.0005)
    return x, dy


def _check_mx(x, dy, group_index=None, **kwargs):
    actual = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, group_index, backend="cpu", **kwargs)
    expected = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x, dy, group_index, backend="reference", **kwargs
    )
    assert_mx_matches(actual, expected, "cpu")


RAGGED_GROUPS = [[0, 5, 5, 70, 133, 200, 261, 300], [64, 128, 128, 300], [300]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("ends", RAGGED_GROUPS, ids=lambda e: f"G{len(e)}")
def test_mx_quant_ragged_groups_match_reference(dtype, ends, isa):
    x, dy = _mx_inputs((300, 640), dtype, seed=4)  # 320 columns per half: a partial column chunk
    _check_mx(x, dy, torch.tensor(ends))


@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("activate_left", [True, False])
def test_mx_quant_options_match_reference(dst_dtype, scale_alg, activate_left, isa):
    x, dy = _mx_inputs((100, 192), torch.bfloat16, seed=5)
    _check_mx(
        x, dy, torch.tensor([33, 100]), dst_dtype=dst_dtype, scale_alg=scale_alg, activate_left=activate_left
    )


@pytest.mark.parametrize("pairs", [32, 96, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mx_quant_rows_of_several_tasks_match_reference(dtype, pairs, isa):
    """The library gives a task whole rows where they fit; ``mx_tile_pairs`` cuts them here into 34,
    12 (the last partial) or 3 tasks of the 1088 pairs of a row per 32-row block, for both operators,
    chunked and interleaved (GPT-OSS), FP8 and FP4, token-contiguous y2."""
    x, dy = _mx_inputs((70, 2176), dtype, seed=13)
    ends = torch.tensor([5, 40, 70])
    gpt_oss = {"interleaved": True, "alpha": 1.702, "limit": 7.0, "bias": 1.0}
    calls = [
        (swiglu_ops.swiglu_backward_mx_quant_dual_axis, (x, dy, ends), {}),
        (swiglu_ops.swiglu_backward_mx_quant_dual_axis, (x, dy, ends), {"transpose_y2": True, **gpt_oss}),
        (swiglu_ops.swiglu_mx_quant_dual_axis, (x, ends), {}),
        (swiglu_ops.swiglu_mx_quant_dual_axis, (x, ends), {"dst_dtype": torch.float4_e2m1fn_x2, **gpt_oss}),
    ]
    for op, args, kwargs in calls:
        whole = op(*args, backend="cpu", **kwargs)
        with cpu_backend.mx_tile_pairs(pairs):
            cut = op(*args, backend="cpu", **kwargs)
        for a, b, name in zip(cut, whole, _MX_NAMES, strict=True):
            assert_bitwise_equal(a.view(torch.uint8), b.view(torch.uint8), f"{op.__name__} {kwargs} {name}")
        if op is swiglu_ops.swiglu_backward_mx_quant_dual_axis:
            assert_mx_matches(cut, op(*args, backend="reference", **kwargs), "cpu")
        else:
            want = op(*args, backend="reference", **kwargs)
            assert_forward_matches(cut, want, "cpu", kwargs.get("dst_dtype", torch.float8_e4m3fn))


def test_mx_tile_pairs_takes_positive_ints_only():
    for bad in (0, -32, 1.5, None):
        with pytest.raises(ValueError, match="pairs"), cpu_backend.mx_tile_pairs(bad):
            pass


@pytest.mark.parametrize("shape", [(3, 70, 128), (2, 2, 33, 64), (1, 64)], ids=str)
def test_mx_quant_batched_matches_reference(shape, isa):
    x, dy = _mx_inputs(shape, torch.float16, seed=6)
    _check_mx(x, dy)


def test_mx_quant_fp16_overflow_gives_nan_blocks(isa):
    x, dy = _mx_inputs((64, 128), torch.float16, seed=7, specials=False)
    dy = dy * 3e4  # gradients beyond 65504 round to inf: their blocks get scale 0xFF and codes 0
    y1, s1, _, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="cpu")
    assert (s1.view(torch.uint8) == 0xFF).any() and (s2.view(torch.uint8) == 0xFF).any()
    _check_mx(x, dy)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_mx_quantisation_bit_exact_given_the_gradient(dtype, dst_dtype, isa):
    """With a stage-1 gradient that is exact (no exp rounding involved), every code must be identical."""
    gen = torch.Generator().manual_seed(8)
    values = torch.randn(130, 96, generator=gen) * 2.0 ** torch.randint(-12, 6, (130, 96), generator=gen)
    x, dy, _ = known_gradient_inputs(values.to(dtype))
    ends = torch.tensor([31, 31, 97, 130])
    for scale_alg in (0, 1):
        kwargs = dict(dst_dtype=dst_dtype, scale_alg=scale_alg)
        actual = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="cpu", **kwargs)
        expected = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="reference", **kwargs)
        for a, e, name in zip(actual, expected, ("y1", "mxscale1", "y2", "mxscale2"), strict=True):
            assert_exact(a, e, name)


@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_mx_codes_around_a_few_fp16_subnormal_gradients(dst_dtype, isa):
    """The 32-value encoder leaves subnormal sources to the per-element one, 32 values at a time: rows whose
    values hold none, one in the first, a middle or the last 32 of a row's gradient half, or several (the
    b half holds 32 times them: subnormal too where small), next to blocks whose amax makes the same sources
    FP8-normal results (E5M2) or subnormal ones (E4M3), must give the per-element codes everywhere."""
    gen = torch.Generator().manual_seed(21)
    values = torch.randn(70, 96, generator=gen) * 2.0 ** torch.randint(-7, 4, (70, 1), generator=gen)
    tiny = torch.randint(1, 1024, (70, 96), generator=gen) * 2.0**-24  # fp16 subnormals
    values = values.to(torch.float16)
    for row in range(70):
        cols = [[], [0], [40], [95], [5, 37, 70, 94]][row % 5]
        for col in cols:
            values[row, col] = (-1) ** col * tiny[row, col]
    x, dy, _ = known_gradient_inputs(values)
    ends = torch.tensor([33, 70])
    kwargs = dict(dst_dtype=dst_dtype)
    actual = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="cpu", **kwargs)
    expected = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="reference", **kwargs)
    for a, e, name in zip(actual, expected, ("y1", "mxscale1", "y2", "mxscale2"), strict=True):
        assert_exact(a, e, name)


GPT_OSS = GluParams(interleaved=True, clipped=True, alpha=1.702, limit=7.0, bias=1.0)


@pytest.mark.parametrize(
    "glu", [GPT_OSS, GluParams(interleaved=True), GluParams(clipped=True, alpha=1.702, limit=7.0, bias=1.0)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mx_backward_gpt_oss_stage1_matches_reference(glu, dtype, isa):
    """The GLU family's other members through the kernel contract: interleaved and/or clipped stage 1."""
    x, dy = _mx_inputs((70, 128), dtype, seed=11)
    x[0, :8] = torch.tensor([7.0, 7.0, -7.0, 7.0, 7.0, -7.0, 7.5, -7.5]).to(dtype)  # on and past the limit
    ends = torch.tensor([20, 20, 70])
    outs = []
    for backend in (cpu_backend, reference):
        y1, y2 = torch.empty(1, 70, 128, dtype=torch.uint8), torch.empty(1, 70, 128, dtype=torch.uint8)
        s1, s2 = torch.empty(1, 70, 4, dtype=torch.uint8), torch.zeros(1, 4, 128, 2, dtype=torch.uint8)
        backend.swiglu_bwd_mx_quant(x[None], dy[None], ends, glu, 1, swiglu_ops.mx.E4M3FN, y1, s1, y2, s2)
        outs.append((y1, s1, y2, s2))
    assert_mx_matches(*outs, "cpu")  # codes and scale codes as raw bytes: near ties only


# ------------------------------------------------------------- every instruction set, bit for bit


#: Every build of the kernels this CPU runs, and on the AVX-512 ones both ways of reading the activation
#: tables (hardware gather or scalar loads, swiglu_glu.gather): (instruction set, gather).
VARIANTS = [(name, g) for name in ISAS for g in ((0, 1) if name.startswith("avx512") else (0,))]


def _on_every_isa(fn):
    """``fn()`` with each kernel variant (its results, in VARIANTS order)."""
    saved = cpu_backend.LIBRARY.isa_code, cpu_backend.LIBRARY.gather
    try:
        out = []
        for name, gather in VARIANTS:
            _with_isa(name)
            cpu_backend.LIBRARY.gather = gather
            out.append(fn())
        return out
    finally:
        cpu_backend.LIBRARY.isa_code, cpu_backend.LIBRARY.gather = saved


def _assert_all_equal(results, names):
    first = f"{VARIANTS[0][0]} gather={VARIANTS[0][1]}"
    for (isa_name, gather), result in zip(VARIANTS[1:], results[1:], strict=True):
        for got, want, name in zip(result, results[0], names, strict=True):
            if want is not None:
                assert_bitwise_equal(got, want, f"{name} ({isa_name} gather={gather} vs {first})")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("clamp", [0.0, 3.0])
def test_group_grad_bit_identical_on_every_instruction_set(dtype, clamp):
    """Hidden sizes 1-40 (every tail length) and the pairwise-sum split sizes, with specials, routing
    weights, masked rows and gradients in the fp32-subnormal range (which AVX512-BF16's conversion
    flushes: those vectors must take the integer rounding)."""
    for hidden in [*range(1, 41), 127, 128, 129, 136, 255, 256, 257, 1000]:
        dy, x, weight, y_origin = _group_grad_inputs((20, hidden), dtype, seed=hidden, weighted=True)
        dy[3] = dy[3] * 1e-36  # results below 2**-126
        args = (dy, x, weight, y_origin, torch.tensor([15]), clamp)
        results = _on_every_isa(lambda a=args: swiglu_ops.swiglu_group_grad(*a, backend="cpu"))
        _assert_all_equal(results, ("grad_x", "grad_weight"))


def test_grad_weight_nans_are_canonical_on_every_instruction_set():
    """A row whose products hold NaNs of both signs (inf * 0 is -NaN on x86, a NaN input +NaN): grad_weight
    is the canonical NaN on every instruction set (its sign and payload followed each one's summation
    order), in swiglu_group_grad and in the weighted MX backward."""
    dy = torch.randn(2, 300).bfloat16()
    dy[0, 0], dy[0, 297] = float("inf"), float("nan")
    y_origin = torch.randn(2, 300).bfloat16()
    y_origin[0, 0] = 0.0
    x, w = torch.randn(2, 600).bfloat16(), torch.ones(2)
    results = _on_every_isa(lambda: swiglu_ops.swiglu_group_grad(dy, x, w, y_origin, backend="cpu"))
    _assert_all_equal(results, ("grad_x", "grad_weight"))
    assert results[0][1].view(torch.int32)[0].item() == 0x7FC00000
    x, dy = torch.full((2, 320), 20.0).bfloat16(), torch.randn(2, 160).bfloat16()
    x[0, 160], dy[0, 0], dy[0, 64] = 0.0, float("inf"), float("nan")
    results = _on_every_isa(
        lambda: swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, weight=w, backend="cpu")
    )
    _assert_all_equal(results, ("y1", "mxscale1", "y2", "mxscale2", "grad_weight"))
    assert results[0][4].view(torch.int32)[0].item() == 0x7FC00000


def test_fp32_attributes_are_written_as_their_bits():
    """numerics.glu.fp32_bits (how alpha, limit, bias and the clamp reach the cpu backend's C structs,
    whatever the caller's flush-to-zero) is each fp32 value's IEEE bits: every subnormal and normal
    exponent, signs, 0, inf."""
    gen = torch.Generator().manual_seed(3)
    patterns = torch.cat([
        torch.randint(0, 2**31 - 1, (20000,), generator=gen),
        torch.arange(0, 4096),  # the smallest subnormals
        torch.tensor([0x007FFFFF, 0x00800000, 0x00800001, 0x3F800000, 0x7F7FFFFF, 0x7F800000]),
    ])  # fmt: skip
    for signed in (patterns, patterns | 0x80000000):
        bits = signed.to(torch.int64).to(torch.uint32).view(torch.int32)
        for b, v in zip(bits.tolist(), bits.view(torch.float32).tolist(), strict=True):
            if v == v:
                assert fp32_bits(v) == b & 0xFFFFFFFF, (hex(b & 0xFFFFFFFF), v)
    assert fp32_bits(float("nan")) == 0x7FC00000


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mx_quant_bit_identical_on_every_instruction_set(dtype):
    x, dy = _mx_inputs((101, 640), dtype, seed=12)
    dy[7] = dy[7] * 1e-36
    for kwargs in (
        dict(),
        dict(scale_alg=0, dst_dtype=torch.float8_e5m2, activate_left=False),
    ):
        for ends in (None, torch.tensor([0, 30, 30, 101])):
            results = _on_every_isa(
                lambda e=ends, k=kwargs: swiglu_ops.swiglu_backward_mx_quant_dual_axis(
                    x, dy, e, backend="cpu", **k
                )
            )
            _assert_all_equal(results, ("y1", "mxscale1", "y2", "mxscale2"))
    weight = torch.rand(101, generator=torch.Generator().manual_seed(3))
    for fn, names in (
        (
            lambda: swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="cpu"),
            ("y1", "mxscale1", "y2", "mxscale2"),
        ),
        (
            lambda: swiglu_ops.swiglu_mx_quant_dual_axis(x, weight=weight, backend="cpu"),
            ("y1", "mxscale1", "y2", "mxscale2"),
        ),
        (
            lambda: swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, weight=weight, backend="cpu"),
            ("y1", "mxscale1", "y2", "mxscale2", "grad_weight"),
        ),
    ):
        _assert_all_equal(_on_every_isa(lambda f=fn: f()), names)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_clipped_swiglu_bit_identical_on_every_instruction_set(dtype):
    x, dy = _mx_inputs((37, 1000), dtype, seed=5)
    results = _on_every_isa(
        lambda: (
            swiglu_ops.clipped_swiglu(x, backend="cpu"),
            swiglu_ops.clipped_swiglu_grad(dy, x, backend="cpu"),
        )
    )
    _assert_all_equal(results, ("y", "grad_x"))


# ---------------------------------------------------------------------------- threads and processes


def _both_ops_inputs(seed: int = 9):
    gg = _group_grad_inputs((333, 520), torch.bfloat16, seed=seed, weighted=True)
    return gg, _mx_inputs((333, 1024), torch.bfloat16, seed=seed)


def _both_ops(inputs=None):
    (dy, x, weight, y_origin), (mx_x, mx_dy) = inputs or _both_ops_inputs()
    gg = swiglu_ops.swiglu_group_grad(dy, x, weight, y_origin, torch.tensor([300]), 3.0, backend="cpu")
    ends = torch.tensor([17, 100, 100, 333])
    return (*gg, *swiglu_ops.swiglu_backward_mx_quant_dual_axis(mx_x, mx_dy, ends, backend="cpu"))


_NAMES = ("grad_x", "grad_weight", "y1", "mxscale1", "y2", "mxscale2")


def test_bitwise_identical_for_any_thread_count():
    saved = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 8):
            torch.set_num_threads(n)
            results.append(_both_ops())
    finally:
        torch.set_num_threads(saved)
    for other in results[1:]:
        for a, b, name in zip(other, results[0], _NAMES, strict=True):
            assert_bitwise_equal(a, b, name)


def test_eight_python_threads_at_once_give_the_single_thread_results():
    """Callers share the C library's thread pool: one job runs on it, the others run alone meanwhile."""
    want = _both_ops()
    got: list = [None] * 8
    errors: list = []

    def run(i):
        try:
            for _ in range(3):
                got[i] = _both_ops()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in threads)
    for result in got:
        for a, b, name in zip(result, want, _NAMES, strict=True):
            assert_bitwise_equal(a, b, name)


def _digest(results) -> list[bytes]:
    return [t.contiguous().view(torch.uint8).numpy().tobytes() for t in results]


def _child_ops(inputs, queue) -> None:
    # A forked child must not start PyTorch's OpenMP (its thread team does not survive fork), so the child
    # makes no torch call that would: its inputs come from the parent. The operators then run on 4 threads
    # of the library's pool, which a forked child must start anew.
    torch.set_num_threads(4)
    queue.put((LIB.swiglu_cpu_threads_kind(), _digest(_both_ops(inputs))))


def _parent_and_child(start_method: str) -> tuple[list[bytes], int, list[bytes]]:
    """Both operators here (4 threads: the pool or team has threads when a child forks), then in a child
    started by ``start_method``: (the parent's digest, the child's threads kind, the child's digest)."""
    inputs = _both_ops_inputs()
    saved = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        want = _digest(_both_ops(inputs))
    finally:
        torch.set_num_threads(saved)
    ctx = multiprocessing.get_context(start_method)
    queue = ctx.Queue()
    child = ctx.Process(target=_child_ops, args=(inputs, queue))
    child.start()
    kind, got = queue.get(timeout=300)
    child.join(timeout=60)
    assert child.exitcode == 0
    return want, kind, got


def _gnu_openmp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as maps:
            return "libgomp" in maps.read()
    except OSError:
        return False


def test_jobs_run_on_pytorchs_openmp_team_or_on_the_pool_with_the_same_bits(monkeypatch):
    """Where PyTorch's GNU OpenMP is loaded, jobs run on its team; SWIGLU_OPS_CPU_POOL=own (read once per
    process: here by a spawned child) runs them on the library's pool. Same tasks, same bits."""
    assert LIB.swiglu_cpu_threads_kind() == (
        LIB.SWIGLU_THREADS_OPENMP if _gnu_openmp_loaded() else LIB.SWIGLU_THREADS_POOL
    )
    monkeypatch.setenv("SWIGLU_OPS_CPU_POOL", "own")
    want, kind, got = _parent_and_child("spawn")
    assert kind == LIB.SWIGLU_THREADS_POOL and got == want


def test_a_forked_child_runs_both_operators_on_its_own_threads_after_the_parent_did():
    want, kind, got = _parent_and_child("fork")
    assert got == want
    assert kind == LIB.SWIGLU_THREADS_POOL  # never the OpenMP team, which does not survive fork


class _OpsDataset(torch.utils.data.Dataset):
    def __init__(self):
        self.inputs = [_both_ops_inputs(seed=i) for i in range(4)]

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.cat([t.reshape(-1).view(torch.uint8) for t in _both_ops(self.inputs[i])])


def test_dataloader_fork_workers_call_both_operators():
    dataset = _OpsDataset()
    want = [dataset[i] for i in range(4)]  # the parent used the backend before the workers fork
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=300
    )
    got = list(loader)
    assert len(got) == 4 and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


# ------------------------------------------------------------------------------ build and fallbacks


def test_a_library_built_from_other_sources_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(_loader, "source_hash", lambda folder=None: "0" * 16)
    stale = _loader.load()
    assert stale.lib is None and "pip install -e ." in stale.why


def test_without_the_library_cpu_says_why_and_auto_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(_loader.importlib.util, "find_spec", lambda name: None)
    missing = _loader.load()
    assert missing.lib is None and "C compiler" in missing.why
    monkeypatch.setattr(cpu_backend, "LIBRARY", missing)
    monkeypatch.setattr(registry, "_WARNED", set())
    dy, x, _, _ = _group_grad_inputs((4, 8), torch.float32, seed=0, weighted=False)
    with pytest.raises(ValueError, match="C compiler"):
        swiglu_ops.swiglu_group_grad(dy, x, backend="cpu")
    with pytest.warns(RuntimeWarning, match="reference backend .* C compiler"):
        got = swiglu_ops.swiglu_group_grad(dy, x)
    assert_exact(got[0], swiglu_ops.swiglu_group_grad(dy, x, backend="reference")[0], "grad_x")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        swiglu_ops.swiglu_group_grad(dy, x)


_PROBE = """
import sys, torch, swiglu_ops
from swiglu_ops.backends import cpu
x = torch.randn(64, 128).bfloat16(); dy = torch.randn(64, 64).bfloat16()
swiglu_ops.swiglu_group_grad(dy, x)
swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy)
print(cpu.LIBRARY.isa or "-", cpu.LIBRARY.why.replace(" ", "_") or "-", "numba" in sys.modules)
"""


@pytest.mark.parametrize("choice", ["auto", "portable", "avx512", "nonsense"])
def test_swiglu_ops_cpu_simd_chooses_the_instruction_set_and_numba_is_never_imported(choice):
    env = {**os.environ, "SWIGLU_OPS_CPU_SIMD": choice}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    isa_name, why, numba_loaded = out.stdout.split()
    assert numba_loaded == "False"
    if choice == "nonsense":  # the backend is unavailable and says why; auto ran the reference
        assert isa_name == "-" and why.startswith("ValueError") and "SWIGLU_OPS_CPU_SIMD" in why
    elif choice == "auto":
        assert isa_name == ISAS[0]
    elif choice in ISAS:
        assert isa_name == choice


# ------------------------------------------------------------------------------ beyond 2**31 elements


#: Rows of the repeated random tile; coprime with the row offsets of 2**31 elements (2**31 / cols), so an
#: index that wrapped at 2**31 would read a different tile row.
_TILE_ROWS = 997


def _fill_tiled(t: torch.Tensor, gen: torch.Generator) -> None:
    """Fill a 2-D tensor with a random tile of ``_TILE_ROWS`` rows repeated (cheap at 4 GB)."""
    tile = (torch.randn(_TILE_ROWS, t.shape[1], generator=gen) * 3).to(t.dtype)
    for r0 in range(0, t.shape[0], _TILE_ROWS):
        r1 = min(r0 + _TILE_ROWS, t.shape[0])
        t[r0:r1] = tile[: r1 - r0]


def test_the_gather_choice_follows_the_cpu_and_the_environment(tmp_path, monkeypatch):
    """``auto`` gathers on Intel cores not affected by gather data sampling only; ``1``/``0`` force it; any
    other value leaves the backend unavailable, saying why (as a bad ``SWIGLU_OPS_CPU_SIMD`` does)."""
    for value, want in (("1", 1), ("0", 0), ("auto", int(_loader.fast_gather()))):
        monkeypatch.setenv("SWIGLU_OPS_CPU_GATHER", value)
        assert _loader.Library().gather == want, value
    monkeypatch.setenv("SWIGLU_OPS_CPU_GATHER", "yes")
    bad = _loader.Library()
    assert bad.lib is None and bad.why.startswith("ValueError") and "SWIGLU_OPS_CPU_GATHER" in bad.why
    monkeypatch.delenv("SWIGLU_OPS_CPU_GATHER")
    info, gds = tmp_path / "cpuinfo", tmp_path / "gds"
    for vendor, state, want in [
        ("GenuineIntel", "Not affected", True),
        ("GenuineIntel", "Mitigation: Microcode", False),
        ("GenuineIntel", "Vulnerable", False),
        ("AuthenticAMD", "Not affected", False),
    ]:
        info.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\n")
        gds.write_text(state + "\n")
        assert _loader.fast_gather(info, gds) is want, (vendor, state)
    assert _loader.fast_gather(info, tmp_path / "missing") is False
    assert [_loader.gather_choice_from_env(v) for v in (None, "", " AUTO ", "1", "0")] == ["auto"] * 3 + [
        "1",
        "0",
    ]
    with pytest.raises(ValueError, match="SWIGLU_OPS_CPU_GATHER"):
        _loader.gather_choice_from_env("yes")


@pytest.mark.slow(seconds=35)
def test_group_grad_beyond_2_pow_31_elements():
    """x has more than 2**31 elements (bf16, ~4.3 GB; ~11 GB in all): rows sampled across the whole range,
    including the last ones, must match the reference computed on those rows alone."""
    hidden = 2048
    rows = (1 << 31) // (2 * hidden) + 3
    x = torch.empty(rows, 2 * hidden, dtype=torch.bfloat16)
    dy = torch.empty(rows, hidden, dtype=torch.bfloat16)
    assert x.numel() > 1 << 31
    gen = torch.Generator().manual_seed(10)
    _fill_tiled(x, gen)
    _fill_tiled(dy, gen)
    grad_x, _ = swiglu_ops.swiglu_group_grad(dy, x, None, None, torch.tensor([rows - 1]), 3.0, backend="cpu")
    sample = torch.tensor(
        [0, 1, rows // 3, rows // 2, (1 << 30) // hidden, (1 << 30) // hidden + 1, rows - 2, rows - 1]
    )
    expected, _ = swiglu_ops.swiglu_group_grad(dy[sample], x[sample], backend="reference", clamp_limit=3.0)
    expected[-1] = expected[-1] * 0  # the row mask: the last row is past valid_rows = rows - 1
    assert_group_grad_matches(
        (grad_x[sample], None), (expected, None), "cpu", inputs=(dy[sample], x[sample], None, None, 3.0)
    )


# ------------------------------------------------------------------------------------------- benchmark


def test_benchmark_quick_mode_writes_results(tmp_path, capsys):
    from swiglu_ops import bench

    assert bench.main(["--quick", "--repeats", "1", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "swiglu_group_grad" in table and "swiglu_bwd_mx_quant" in table
    results = json.loads((tmp_path / "bench_cpu.json").read_text())["results"]
    assert {"swiglu_group_grad", "swiglu_bwd_mx_quant"} <= {r["op"] for r in results}
    assert all(r["fused_ms"] > 0 and r["copy_ms"] > 0 for r in results)
    assert all(r["check"] == "ok" for r in results)  # every case's results against the reference's
    assert (tmp_path / "bench_cpu.csv").read_text().count("\n") == len(results) + 1


@pytest.mark.parametrize(
    "op, output, flip",
    [("swiglu_mx_quant", 0, 0x02), ("swiglu_bwd_mx_quant", 3, 0x01), ("swiglu_bwd_mx_quant", 4, 0x100)],
)
def test_benchmark_fails_a_case_whose_results_differ_from_the_reference(
    monkeypatch, tmp_path, op, output, flip
):
    """A fast kernel that is wrong must not pass as fast: the benchmark compares every case's results with
    the reference's (the verify rule) and fails the command. Here the cpu results are corrupted after the
    call: FP8 codes two units off, an E8M0 scale one code off in two places (more than the one near tie a
    small tensor may hold), grad_weight far beyond its tolerance."""
    from swiglu_ops import bench

    real = bench._call

    def corrupted(op_, args, kwargs, backend, out=None):
        res = real(op_, args, kwargs, backend, out)
        if backend == "cpu" and len(res) > output:  # (not the unweighted call beside a weighted case)
            bits = {1: torch.uint8, 4: torch.int32}[res[output].element_size()]
            t = res[output].view(bits).reshape(-1)
            t[:2] ^= flip
        return res

    monkeypatch.setattr(bench, "_call", corrupted)
    case = bench.Case(op, 64, 256, torch.bfloat16, weighted=output == 4, baselines=False)
    result = bench.run_case(case, repeats=1, compile_reference=False, gen=torch.Generator().manual_seed(0))
    assert result.check.startswith("FAIL") and ("2 differ" in result.check or "max rel" in result.check)
    assert "RESULTS DIFFER from the reference" in bench.format_table([result])
    monkeypatch.setattr(bench, "default_cases", lambda quick, ops: [case])
    assert bench.main(["--quick", "--repeats", "1", "--no-latency", "--out", str(tmp_path)]) == 1
    monkeypatch.setattr(bench, "_call", real)
    assert bench.run_case(case, repeats=1, compile_reference=False, gen=torch.Generator()).check == "ok"


def test_benchmark_times_each_baseline_in_turns_with_the_fused_op(monkeypatch):
    """x eager / x comp are ratios of the same rounds: the baseline and the fused op alternate, and the
    speed-up divides by the fused op's time in those rounds (not by its time in the copy's rounds)."""
    from swiglu_ops import bench

    log = []
    real = bench._call

    def logged(op_, args, kwargs, backend, out=None):
        log.append(backend if out is None else "out")
        return real(op_, args, kwargs, backend, out)

    monkeypatch.setattr(bench, "_call", logged)
    monkeypatch.setattr(bench, "_compiled_reference", lambda op: lambda *a: log.append("compiled"))
    case = bench.Case("clipped_swiglu", 64, 256, torch.bfloat16)
    result = bench.run_case(case, repeats=3, compile_reference=True, gen=torch.Generator().manual_seed(0))
    eager_turns = ["cpu", "reference"] * 3  # warm-up and 2 rounds
    compiled_turns = ["cpu", "compiled"] * 4  # warm-up and 3 rounds, then one call counting page faults
    assert log == ["cpu", "out"] * 4 + eager_turns + compiled_turns + ["compiled"], (
        log
    )  # (the copy: unlogged)
    assert result.speedup_vs_eager == result.eager_ms / result.eager_turns_ms
    assert result.speedup_vs_compiled == result.compiled_ms / result.compiled_turns_ms
    assert result.check == "ok"


def test_benchmark_reports_a_failing_compiled_baseline_instead_of_aborting(monkeypatch):
    """Inductor's C++ build can fail (a gcc internal error was seen on the grouped mx case): the row keeps
    the op's numbers and says why the baseline is missing."""
    from swiglu_ops import bench

    def broken(*args):
        raise RuntimeError("C++ compile error\nmore detail")

    monkeypatch.setattr(bench, "_compiled_reference", lambda op: broken)
    case = bench.Case("swiglu_bwd_mx_quant", 64, 256, torch.bfloat16, groups=2)
    result = bench.run_case(case, repeats=1, compile_reference=True, gen=torch.Generator().manual_seed(0))
    assert result.compiled_ms is None and result.speedup_vs_compiled is None
    assert result.compiled_error == "RuntimeError: C++ compile error" and result.fused_ms > 0
    assert "compiled reference failed for swiglu_bwd_mx_quant 64x256 bfloat16 G=2" in bench.format_table(
        [result]
    )


def test_benchmark_counts_the_page_faults_of_the_compiled_baseline(monkeypatch):
    """A baseline that writes 64 MiB of fresh memory per call faults on every call (a compiled reference
    did, depending on the process); the row records how many and the table says so; a call into reused
    memory faults little."""
    import mmap

    from swiglu_ops import bench

    def fresh_temporary(*args):
        buf = mmap.mmap(-1, 64 << 20)  # anonymous, never touched: every page faults on its first write
        for off in range(0, 64 << 20, 4096):
            buf[off] = 1
        buf.close()

    kept = bytearray(64 << 20)
    assert bench.faults_per_call(fresh_temporary) >= 32  # at least one per 2 MiB, also with huge pages
    assert (
        bench.faults_per_call(lambda: kept.__setitem__(slice(0, 64 << 20, 4096), b"\x02" * (16 << 10))) < 32
    )
    monkeypatch.setattr(bench, "_compiled_reference", lambda op: fresh_temporary)
    monkeypatch.setattr(bench, "FAULTS_NOTED", 32)
    case = bench.Case("clipped_swiglu", 64, 256, torch.bfloat16)
    result = bench.run_case(case, repeats=1, compile_reference=True, gen=torch.Generator().manual_seed(0))
    assert result.compiled_ms > 0 and result.compiled_faults >= 32
    assert f"compiled reference of clipped_swiglu 64x256 bfloat16: {result.compiled_faults} page faults" in (
        bench.format_table([result])
    )


def test_benchmark_times_every_call_after_an_untimed_cache_eviction():
    """Full runs clear the last-level cache before every timed call (the copy's and the op's), so that no
    call finds its buffers where the call before it left them; the eviction itself is not timed."""
    from swiglu_ops import bench

    log = []
    times = bench._time_in_turns_ms(
        [lambda: log.append("a"), lambda: log.append("b")],
        3,
        evict=lambda: (log.append("evict"), time.sleep(0.05)),
    )
    assert log == ["a", "b"] + ["evict", "a", "evict", "b"] * 3  # the warm-up calls, then every timed call
    assert all(t < 40 for t in times)  # the 50 ms evictions are outside the timings
    # twice the last-level cache, as the C library reports it (getconf: glibc's sysconf, which Python's
    # os.sysconf cannot ask; the benchmark used to fall back to 256 MiB on this 480 MiB-L3 host)
    try:
        out = subprocess.run(["getconf", "LEVEL3_CACHE_SIZE"], capture_output=True, text=True, timeout=10)
        llc = int(out.stdout.strip() or 0)
    except (OSError, ValueError):
        llc = 0
    if llc > 0:
        assert bench.last_level_cache_bytes() == llc
    assert bench.cache_evict_bytes() == (min(2 * llc, 2 << 30) if llc > 0 else 256 << 20)


def test_benchmark_sweep_refuses_quick(capsys):
    """--sweep --quick ran the full-size sweep warm and overwrote the sweep's results: refused."""
    from swiglu_ops import bench

    with pytest.raises(SystemExit):
        bench.main(["--sweep", "--quick", "--out", "/nonexistent"])
    assert "--sweep takes no --quick" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ output cache


def _cache(max_mb: int = 64):
    return cpu_backend.OutputCache(max_bytes=max_mb << 20, min_bytes=1 << 20)


def test_output_cache_reuses_the_memory_of_freed_outputs_only():
    cache = _cache()
    first = cache.empty((1024, 1024), torch.bfloat16)
    assert first.shape == (1024, 1024) and first.dtype == torch.bfloat16 and first.is_contiguous()
    ptr = first.data_ptr()
    second = cache.empty((1024, 1024), torch.bfloat16)  # first is alive: new memory
    assert second.data_ptr() != ptr
    view = first[3:5]  # a view keeps the buffer in use after its base tensor is gone
    del first
    gc.collect()
    third = cache.empty((2048, 512), torch.bfloat16)
    assert third.data_ptr() != ptr and cache.free_bytes == 0
    del view
    gc.collect()
    assert cache.free_bytes == 2 << 20
    fourth = cache.empty((512, 1024), torch.float32)  # same byte size, other dtype and shape: reused
    assert fourth.data_ptr() == ptr and fourth.shape == (512, 1024) and fourth.dtype == torch.float32
    assert cache.free_bytes == 0
    fourth.fill_(1.5)  # ordinary writable memory
    assert float(fourth.sum()) == 1.5 * fourth.numel()


def test_output_cache_keeps_at_most_max_bytes_and_leaves_small_requests_to_torch():
    cache = _cache(max_mb=3)
    outs = [cache.empty((1 << 20,), torch.uint8) for _ in range(5)]
    del outs
    gc.collect()
    assert cache.free_bytes == 3 << 20  # the two oldest were dropped
    small = cache.empty((100,), torch.float32)
    del small
    gc.collect()
    assert cache.free_bytes == 3 << 20
    cache.clear()
    assert cache.free_bytes == 0
    off = _cache(max_mb=0)
    t = off.empty((1 << 20,), torch.uint8)
    del t
    gc.collect()
    assert off.free_bytes == 0


def test_default_output_cache_takes_the_mx_scale_outputs():
    """From 256 KiB up: the 1 MiB mxscale outputs of M=8192, 2H=4096 faulted on every call from torch.empty
    in the benchmark (glibc had given their pages back); smaller requests stay with torch.empty."""
    cache = cpu_backend.OutputCache(max_bytes=cpu_backend.OUTPUT_CACHE.max_bytes)
    assert cache.min_bytes == cpu_backend.OUTPUT_CACHE.min_bytes == 256 << 10
    scales = cache.empty((8192, 64, 2), torch.uint8)  # mxscale1 of the bench's backward
    ptr = scales.data_ptr()
    del scales
    gc.collect()
    assert cache.free_bytes == 1 << 20
    again = cache.empty((8192, 128), torch.uint8)
    assert again.data_ptr() == ptr and cache.free_bytes == 0
    small = cache.empty((255 << 10,), torch.uint8)
    del small
    gc.collect()
    assert cache.free_bytes == 0


class _LockThatCollects:
    """The cache's lock, with a garbage collection right after every acquisition: a collection can run at
    any allocation, also while the cache holds its lock, and run the finalizers of freed outputs there.
    A young-generation collection, as at an allocation (the test's cycles are young; a full collection of
    the test process's heap takes about a second)."""

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self):
        self._lock.acquire()
        gc.collect(0)
        return self

    def __exit__(self, *exc):
        self._lock.release()


def test_output_cache_survives_garbage_collection_inside_its_own_calls():
    """A finalizer that takes the cache's (non-reentrant) lock hangs forever when the collection that runs
    it happens under that lock (the cache once did this): outputs freed by the cyclic collector only."""
    cache = _cache(max_mb=1)
    cache._lock = _LockThatCollects()

    def churn():
        for _ in range(50):
            a = cache.empty((1 << 20,), torch.uint8)
            holder = {"tensor": a}
            holder["self"] = holder  # only the cyclic collector frees it
            del a, holder
            cache.empty((1 << 20,), torch.uint8)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the output cache deadlocked"
    gc.collect()
    assert cache.free_bytes == 1 << 20


def test_ops_as_called_reuse_freed_outputs_and_stay_correct(monkeypatch):
    """Two calls with the first result freed in between: the second writes into recycled memory (which
    held the first call's values) and must still equal the reference everywhere, mxscale2's zero rows too."""
    monkeypatch.setattr(cpu_backend.OUTPUT_CACHE, "min_bytes", 1 << 16)  # cache this test's small outputs

    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(200, 4096, generator=gen) * 3).bfloat16()
    dy = torch.randn(200, 2048, generator=gen).bfloat16()
    w = torch.rand(200, generator=gen)
    ends = torch.tensor([33, 33, 150, 200])
    want_gg = swiglu_ops.swiglu_group_grad(dy, x, w, dy, torch.tensor([120]), 7.0, backend="reference")
    want_mx = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="reference")
    for _ in range(2):
        assert_group_grad_matches(
            swiglu_ops.swiglu_group_grad(dy, x, w, dy, torch.tensor([120]), 7.0, backend="cpu"),
            want_gg,
            "cpu",
            (dy, x, w, dy, 7.0),
        )
        # Dirty every buffer of the next call: same shapes, other values and other mxscale2 slots.
        dirty = torch.tensor([1, 100, 101, 200])
        got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x.flip(0), dy.flip(0), dirty, backend="cpu")
        del got
        gc.collect()
        assert cpu_backend.OUTPUT_CACHE.free_bytes > 0
        assert_mx_matches(
            swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="cpu"), want_mx, "cpu"
        )
    live = [swiglu_ops.swiglu_group_grad(dy, x, backend="cpu")[0] for _ in range(2)]
    assert live[0].data_ptr() != live[1].data_ptr()


# ------------------------------------------------------------------- reads stay inside the inputs

_GUARDED_CHILD = r"""
import ctypes, itertools, mmap, sys
import torch, swiglu_ops
from swiglu_ops.backends import cpu

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
keep = []

def guarded(src, at_end):
    # a copy of src whose last byte is followed (or whose first byte is preceded) by a PROT_NONE page
    nbytes = src.numel() * src.element_size()
    pages = -(-nbytes // PAGE)
    mm = mmap.mmap(-1, (pages + 1) * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    guard = base + pages * PAGE if at_end else base
    assert libc.mprotect(guard, PAGE, 0) == 0
    offset = pages * PAGE - nbytes if at_end else PAGE
    t = torch.frombuffer(mm, dtype=src.dtype, count=src.numel(), offset=offset).view(src.shape)
    t.copy_(src)
    keep.append(mm)
    return t

gen = torch.Generator().manual_seed(0)
isas = cpu.LIBRARY.supported_isas()
variants = [(n, g) for n in isas for g in ((0, 1) if n.startswith("avx512") else (0,))]
for (isa, gather), dtype, rows, cols, at_end in itertools.product(
    variants, (torch.bfloat16, torch.float16, torch.float32), (1, 3), (64, 96, 130), (True, False)
):
    cpu.LIBRARY.isa_code = getattr(cpu.LIBRARY.lib, f"SWIGLU_ISA_{isa.upper()}")
    cpu.LIBRARY.gather = gather
    x = guarded((torch.randn(rows, cols, generator=gen) * 3).to(dtype), at_end)
    dy = guarded(torch.randn(rows, cols // 2, generator=gen).to(dtype), at_end)
    w = guarded(torch.rand(rows, generator=gen), at_end)
    for left, inter in itertools.product((True, False), (True, False)):
        glu = dict(activate_left=left, interleaved=inter)
        swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="cpu", weight=w, **glu)
        if cols % 64 == 0:
            swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="cpu", weight=w, **glu)
    swiglu_ops.swiglu_group_grad(dy, x, w.reshape(rows, 1), dy, backend="cpu", clamp_limit=7.0)
    for inter in (True, False):
        swiglu_ops.clipped_swiglu(x, interleaved=inter, backend="cpu")
        swiglu_ops.clipped_swiglu_grad(dy, x, interleaved=inter, backend="cpu")
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect guard pages")
def test_kernels_read_nothing_outside_their_inputs():
    """Every operator on inputs that end right before (or start right after) an inaccessible page, on every
    instruction set and both ways of reading the activation tables, every layout and activated half: a read
    past an input faults. (The activation-table keys of an interleaved row's odd elements were read 8 bytes
    at a time and took 2 bytes past the end of x: harmless where torch's allocator leaves room, a crash for
    x from mmap / frombuffer / DLPack.) In a child process, so that a fault fails this test only."""
    proc = subprocess.run([sys.executable, "-c", _GUARDED_CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])
