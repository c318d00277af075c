"""CPU-backend specific tests: the kernels' scalar numerics, random data against the reference (specials,
ragged groups, every option), bitwise determinism across thread counts, and indexing beyond 2**31 elements.
Tests taking ``cpu_kernels`` run both implementations of the 16-bit dtypes: the AVX-512 C kernels
(``_simd.c``) and the Numba kernels.

The conformance suite (golden cases, errors, properties) runs on this backend too, through
``tests/conftest.py``; the tolerances are those of the contract, implemented in ``tests/_compare.py``.
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch

import swiglu_ops
from swiglu_ops import mx

numba = pytest.importorskip("numba")
cpu = pytest.importorskip("swiglu_ops.cpu")

from _compare import assert_bitwise_equal, assert_exact, assert_group_grad_matches, assert_mx_matches  # noqa: E402
from _oracles import known_gradient_inputs  # noqa: E402

from swiglu_ops.cpu import _native  # noqa: E402
from swiglu_ops.cpu import _numerics as nx  # noqa: E402


@pytest.fixture(params=["simd", "numba"])
def cpu_kernels(request, monkeypatch) -> str:
    """Which kernels the cpu backend runs for bf16/fp16: ``simd`` (the C kernels; a CPU with AVX-512 must
    have them, so a missing or stale build fails here) or ``numba`` (the library switched off)."""
    if request.param == "numba":
        monkeypatch.setattr(_native, "LIB", None)
    elif _native.LIB is None:
        if not _native.host_supported():
            pytest.skip("this CPU has no AVX-512: the cpu backend runs its Numba kernels only")
        pytest.fail("the CPU has AVX-512 but swiglu_ops.cpu._simd is not built or is stale: pip install -e .")
    return request.param


# ------------------------------------------------------------------------------------ scalar numerics


@numba.njit(error_model="numpy")
def _apply_exp(x, out):
    for i in range(x.shape[0]):
        out[i] = nx.exp_f32(x[i])


@numba.njit(error_model="numpy")
def _apply_widen(bits, kind, out):
    for i in range(bits.shape[0]):
        out[i] = nx.widen(bits[i], kind)


@numba.njit(error_model="numpy")
def _apply_narrow(values, kind, out):
    for i in range(values.shape[0]):
        out[i] = nx.narrow(values[i], kind)


@numba.njit(error_model="numpy")
def _apply_quantize(amax, values, scale_alg, emax, inv_max, mbits, bias, max_code, sub_magic, codes, out):
    """Scale code per amax, and the element codes of ``values[i, :]`` under the scale of ``amax[i]``."""
    for i in range(amax.shape[0]):
        codes[i] = nx.scale_code(amax[i], scale_alg, emax, inv_max)
        recip = nx.scale_reciprocal(codes[i], amax[i], scale_alg)
        for j in range(values.shape[1]):
            out[i, j] = nx.fp8_encode(values[i, j] * recip, mbits, bias, max_code, sub_magic)


def _fp32_bit_sample(step: int) -> np.ndarray:
    """Every ``step``-th fp32 bit pattern (both signs, all exponents, NaN and inf) plus the specials."""
    bits = np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32)
    specials = np.array(
        [
            0,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0x00000001,
            0x007FFFFF,
            0x42B17218,
            0x42B17217,
            0xC2D00000,
            0xC2CFFFFF,
            0x3F800000,
        ],
        dtype=np.uint32,
    )
    return np.concatenate([bits, specials])


def test_exp_within_one_ulp_of_torch_over_the_fp32_range():
    x = _fp32_bit_sample(1031).view(np.float32)
    out = np.empty_like(x)
    _apply_exp(x, out)
    ref = torch.exp(torch.from_numpy(x)).numpy()
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    finite = np.isfinite(ref)
    assert np.array_equal(out[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])  # +inf
    assert np.array_equal(np.isinf(out), np.isinf(ref))
    ulp = np.abs(out[finite].view(np.int32).astype(np.int64) - ref[finite].view(np.int32).astype(np.int64))
    assert ulp.max() <= 1, f"exp differs by {ulp.max()} ulp at x = {x[finite][ulp.argmax()]!r}"


# fp16 twice: the hardware conversions (where the CPU has them, nx.HW_HALF) and the integer fallback.
_KINDS_16 = [(torch.bfloat16, nx.BF16), (torch.float16, nx.FP16), (torch.float16, nx.FP16_SOFT)]


@pytest.mark.parametrize(("dtype", "kind"), _KINDS_16, ids=["bf16", "fp16", "fp16-soft"])
def test_widen_is_exact_for_every_16_bit_pattern(dtype, kind):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(bits.shape, np.float32)
    _apply_widen(bits, kind, out)
    expected = torch.from_numpy(bits.copy()).view(dtype).float()
    assert_exact(torch.from_numpy(out), expected, f"widen {dtype}")


@pytest.mark.parametrize(("dtype", "kind"), _KINDS_16, ids=["bf16", "fp16", "fp16-soft"])
def test_narrow_matches_torch_rounding(dtype, kind):
    rng = np.random.default_rng(0)
    ties = (rng.integers(0, 1 << 16, 20_000, dtype=np.uint32) << 16) | (1 << 15)  # bf16 ties
    fp16_edges = np.array([65504, 65519.996, 65520, 65536, 2.0**-24, 2.0**-25, 3 * 2.0**-26], np.float32)
    values = np.concatenate([_fp32_bit_sample(4099), ties.astype(np.uint32)]).view(np.float32)
    values = np.concatenate([values, fp16_edges, -fp16_edges])
    out = np.empty(values.shape, np.uint32)
    _apply_narrow(values, kind, out)
    actual = torch.from_numpy(out.astype(np.uint16)).view(dtype)
    assert_exact(actual, torch.from_numpy(values).to(dtype), f"narrow to {dtype}")


@pytest.mark.parametrize("fmt", [mx.E4M3FN, mx.E5M2], ids=lambda f: f.name)
@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scales_and_codes_bit_exact_with_mx(fmt, scale_alg, dtype):
    """Every 16-bit magnitude as a block amax; each block holds values at and below it (mx.py is the rule)."""
    amax16 = torch.arange(0x8000, dtype=torch.int32).to(torch.int16).view(dtype)
    amax = amax16.float()
    fractions = torch.tensor([1.0, -1.0, 0.75, -0.5, 0.3, 1e-3, 2.0**-20, 0.0, -0.0])
    values = (amax[:, None] * fractions).to(dtype)  # 16-bit values, as the kernels see them
    values[:, 0] = amax16
    amax_bits = mx.amax_bits(values, dim=1)
    codes = np.empty(amax.shape[0], np.uint32)
    out = np.empty(values.shape, np.uint32)
    emin = 1 - fmt.bias
    _apply_quantize(
        amax_bits.numpy().astype(np.uint32),
        values.float().numpy(),
        scale_alg,
        fmt.emax,
        np.uint32(fmt.inv_max_bits).view(np.float32),
        fmt.mbits,
        fmt.bias,
        fmt.max_code,
        (emin - fmt.mbits + 150) << 23,
        codes,
        out,
    )
    expected_y, expected_codes = mx.quantize_blocks(values, 1, fmt, scale_alg)
    assert torch.equal(torch.from_numpy(codes.astype(np.int64)), expected_codes)
    assert torch.equal(torch.from_numpy(out.astype(np.uint8)), expected_y)


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
def test_group_grad_matches_reference(dtype, clamp, weighted, cpu_kernels):
    dy, x, weight, y_origin = _group_grad_inputs((97, 300), dtype, seed=1, weighted=weighted)
    _check_group_grad(dy, x, weight, y_origin, torch.tensor([40, 31]), clamp)


@pytest.mark.parametrize("shape", [(3, 5, 1), (2, 33, 17), (40, 1000)], ids=str)
def test_group_grad_shapes_rank3_and_odd_hidden(shape, cpu_kernels):
    dy, x, weight, y_origin = _group_grad_inputs(shape, torch.bfloat16, seed=2, weighted=True)
    _check_group_grad(dy, x, weight, y_origin, None, 7.0)


def test_group_grad_fp16_overflow_becomes_inf(cpu_kernels):
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
def test_mx_quant_ragged_groups_match_reference(dtype, ends, cpu_kernels):
    x, dy = _mx_inputs((300, 640), dtype, seed=4)  # 320 columns per half: a partial column chunk
    _check_mx(x, dy, torch.tensor(ends))


@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("activate_left", [True, False])
def test_mx_quant_options_match_reference(dst_dtype, scale_alg, activate_left, cpu_kernels):
    x, dy = _mx_inputs((100, 192), torch.bfloat16, seed=5)
    _check_mx(
        x, dy, torch.tensor([33, 100]), dst_dtype=dst_dtype, scale_alg=scale_alg, activate_left=activate_left
    )


@pytest.mark.parametrize("shape", [(3, 70, 128), (2, 2, 33, 64), (1, 64)], ids=str)
def test_mx_quant_batched_matches_reference(shape, cpu_kernels):
    x, dy = _mx_inputs(shape, torch.float16, seed=6)
    _check_mx(x, dy)


def test_mx_quant_fp16_overflow_gives_nan_blocks(cpu_kernels):
    x, dy = _mx_inputs((64, 128), torch.float16, seed=7, specials=False)
    dy = dy * 3e4  # gradients beyond 65504 round to inf: their blocks get scale 0xFF and codes 0
    y1, s1, _, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="cpu")
    assert (s1.view(torch.uint8) == 0xFF).any() and (s2.view(torch.uint8) == 0xFF).any()
    _check_mx(x, dy)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_mx_quantisation_bit_exact_given_the_gradient(dtype, dst_dtype, cpu_kernels):
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


# ------------------------------------------------------------------------- C kernels against Numba


def _assert_bits_equal_but_nan_payloads(actual, expected):
    """Bit-identical, except that a NaN may carry another sign or payload: which NaN operand an x86
    instruction propagates depends on operand order, and both compilers commute multiplications freely
    (fp16 outputs keep the NaN's sign; bf16 ones are canonical). The contract compares NaN as NaN."""
    both_nan = actual.isnan() & expected.isnan()
    assert_bitwise_equal(actual.masked_fill(both_nan, 0), expected.masked_fill(both_nan, 0))


def _both_kernels(monkeypatch, op, *args, **kwargs):
    """``op(*args, backend="cpu", **kwargs)`` with the C kernels, then with the Numba kernels."""
    if _native.LIB is None:
        if not _native.host_supported():
            pytest.skip("this CPU has no AVX-512: the cpu backend runs its Numba kernels only")
        pytest.fail("the CPU has AVX-512 but swiglu_ops.cpu._simd is not built or is stale: pip install -e .")
    simd = op(*args, backend="cpu", **kwargs)
    with monkeypatch.context() as m:
        m.setattr(_native, "LIB", None)
        return simd, op(*args, backend="cpu", **kwargs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("clamp", [0.0, 1.5, float("inf")])
def test_simd_group_grad_bit_identical_to_numba_over_awkward_sizes(dtype, clamp, monkeypatch):
    """Every hidden size from 1 to 40 (vector tails, pairwise leaves under 8), then the sizes where the
    pairwise tree splits (128, 129, 136, 1000), with specials, weights, masked rows and rank 3."""
    for hidden in [*range(1, 41), 127, 128, 129, 136, 1000]:
        for weighted in (False, True):
            dy, x, weight, y_origin = _group_grad_inputs(
                (2, 9, hidden), dtype, seed=hidden, weighted=weighted
            )
            simd, numba_out = _both_kernels(
                monkeypatch,
                swiglu_ops.swiglu_group_grad,
                dy,
                x,
                weight,
                y_origin,
                torch.tensor([7, 4]),
                clamp,
            )
            for a, b in zip(simd, numba_out, strict=True):
                if a is not None:
                    _assert_bits_equal_but_nan_payloads(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_simd_mx_quant_bit_identical_to_numba(dtype, monkeypatch):
    for shape, ends in (((70, 64), [3, 3, 40, 70]), ((2, 33, 1088), None), ((200, 1152), [200])):
        x, dy = _mx_inputs(shape, dtype, seed=shape[-1])
        for kwargs in (
            dict(),
            dict(activate_left=False, scale_alg=0, dst_dtype=torch.float8_e5m2),
        ):
            group_index = None if ends is None else torch.tensor(ends)
            simd, numba_out = _both_kernels(
                monkeypatch, swiglu_ops.swiglu_backward_mx_quant_dual_axis, x, dy, group_index, **kwargs
            )
            for a, b in zip(simd, numba_out, strict=True):
                assert_bitwise_equal(a, b)


def test_simd_sigmoid_table_is_the_numba_sigmoid():
    """The C kernels read sigmoid_f32 from a table: spot-check entries against the scalar function."""
    for kind, dtype in ((nx.BF16, torch.bfloat16), (nx.FP16, torch.float16)):
        table = _native.sigmoid_table(kind)
        bits = np.arange(1 << 16, dtype=np.uint16)
        values = torch.from_numpy(bits.view(np.int16)).view(dtype).float().numpy()
        for i in np.random.default_rng(0).integers(0, 1 << 16, 200).tolist() + [0x7F80, 0xFF80, 0x7FC0, 0]:
            expected = _native.sigmoid_scalar(np.float32(values[i]))
            assert table[i].view(np.uint32) == np.float32(expected).view(np.uint32) or (
                np.isnan(table[i]) and np.isnan(expected)
            )


_BUILD_PROBE = """
import sys, torch, swiglu_ops
from swiglu_ops.cpu import _native
g = torch.Generator().manual_seed(3)
out = {"build": _native.BUILD}
for dtype in (torch.bfloat16, torch.float16):
    x = torch.randn(64, 256, generator=g) * 3
    dy = torch.randn(64, 128, generator=g)
    dy[:16] *= 1e-38  # fp32-subnormal gradients: the bf16 rounding's rare path
    flat = x.view(-1)
    flat[torch.randint(0, flat.numel(), (200,), generator=g)] = float("nan")
    flat[torch.randint(0, flat.numel(), (200,), generator=g)] = float("inf")
    x, dy = x.to(dtype), dy.to(dtype)
    w, yo = torch.rand(64, generator=g), torch.randn(64, 128, generator=g).to(dtype)
    out[str(dtype)] = (
        swiglu_ops.swiglu_group_grad(dy, x, w, yo, torch.tensor([60]), 5.0, backend="cpu"),
        swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, torch.tensor([20, 64]), backend="cpu"),
    )
torch.save(out, sys.argv[1])
"""


def test_the_avx512_bf16_build_matches_the_plain_avx512_build(tmp_path):
    """The _simd_bf16 build rounds bf16 with vcvtneps2bf16 and falls back to the integer rounding for NaN
    and fp32-subnormal lanes; the plain build always rounds in integers. Same bits, both kernels."""
    import os
    import subprocess
    import sys

    if not _native.host_supported("_simd_bf16"):
        pytest.skip("this CPU has no AVX512-BF16: only the plain AVX-512 build runs here")
    results = {}
    for choice in ("1", "avx512"):
        path = tmp_path / f"{choice}.pt"
        env = {**os.environ, "SWIGLU_OPS_CPU_SIMD": choice}
        subprocess.run([sys.executable, "-c", _BUILD_PROBE, str(path)], env=env, check=True)
        results[choice] = torch.load(path)
    assert (results["1"]["build"], results["avx512"]["build"]) == ("_simd_bf16", "_simd")
    for dtype in ("torch.bfloat16", "torch.float16"):
        (gg_a, mx_a), (gg_b, mx_b) = results["1"][dtype], results["avx512"][dtype]
        for a, b in zip(gg_a, gg_b, strict=True):
            _assert_bits_equal_but_nan_payloads(a, b)
        for a, b in zip(mx_a, mx_b, strict=True):
            assert_bitwise_equal(a, b)
    grad_x = results["1"]["torch.bfloat16"][0][0]
    assert (grad_x[:16] != 0).any() and (grad_x[:16].abs() < 2.0**-126).any()  # the subnormal path ran


def test_stale_simd_build_falls_back_to_numba_with_a_warning(monkeypatch):
    """An editable install whose _simd.c changed since the build must not run the old C code."""
    if not _native.host_supported() or _native.LIB is None:
        pytest.skip("needs the built library on an AVX-512 CPU")
    monkeypatch.setattr(_native, "source_hash", lambda path: "0" * 16)
    with pytest.warns(RuntimeWarning, match="another version of _simd.c"):
        assert _native._load(("_simd",)) == (None, "")


# ---------------------------------------------------------------------------------------- determinism


@contextlib.contextmanager
def _numba_threads(n: int):
    saved = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(saved)


def test_bitwise_identical_for_any_thread_count(cpu_kernels):
    dy, x, weight, y_origin = _group_grad_inputs((333, 520), torch.bfloat16, seed=9, weighted=True)
    mx_x, mx_dy = _mx_inputs((333, 1024), torch.bfloat16, seed=9)
    ends = torch.tensor([17, 100, 100, 250, 333])
    results = []
    for n in sorted({1, 2, 3, numba.config.NUMBA_NUM_THREADS}):
        with _numba_threads(n):
            gg = swiglu_ops.swiglu_group_grad(
                dy, x, weight, y_origin, torch.tensor([300]), 3.0, backend="cpu"
            )
            q = swiglu_ops.swiglu_backward_mx_quant_dual_axis(mx_x, mx_dy, ends, backend="cpu")
            results.append((*gg, *q))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert_bitwise_equal(b, a)


# -------------------------------------------------------------------------------- beyond 2**31 elements


#: Rows of the repeated random tile; coprime with the row offsets of 2**31 elements (2**31 / cols), so an
#: index that wrapped at 2**31 would read a different tile row.
_TILE_ROWS = 997


def _fill_tiled(t: torch.Tensor, gen: torch.Generator) -> None:
    """Fill a 2-D tensor with a random tile of ``_TILE_ROWS`` rows repeated (cheap at 4 GB)."""
    tile = (torch.randn(_TILE_ROWS, t.shape[1], generator=gen) * 3).to(t.dtype)
    for r0 in range(0, t.shape[0], _TILE_ROWS):
        r1 = min(r0 + _TILE_ROWS, t.shape[0])
        t[r0:r1] = tile[: r1 - r0]


@pytest.mark.slow
def test_group_grad_beyond_2_pow_31_elements(cpu_kernels):
    """x has more than 2**31 elements (bf16, ~4.3 GB; ~11 GB in all): rows sampled across the whole range,
    including the last ones, must match the reference computed on those rows alone."""
    hidden = 2048
    rows = (1 << 31) // (2 * hidden) + 3
    try:
        x = torch.empty(rows, 2 * hidden, dtype=torch.bfloat16)
        dy = torch.empty(rows, hidden, dtype=torch.bfloat16)
    except RuntimeError as exc:  # pragma: no cover - machines without the memory
        pytest.skip(f"not enough memory: {exc}")
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
    assert {r["op"] for r in results} == {"swiglu_group_grad", "swiglu_bwd_mx_quant"}
    assert all(r["fused_ms"] > 0 and r["copy_ms"] > 0 for r in results)
    assert (tmp_path / "bench_cpu.csv").read_text().count("\n") == len(results) + 1


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


# ------------------------------------------------------------------------------------ output cache


def _cache(max_mb: int = 64):
    from swiglu_ops.cpu import OutputCache

    return OutputCache(max_bytes=max_mb << 20, min_bytes=1 << 20)


def test_output_cache_reuses_the_memory_of_freed_outputs_only():
    import gc

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
    import gc

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


def test_ops_as_called_reuse_freed_outputs_and_stay_correct(monkeypatch):
    """Two calls with the first result freed in between: the second writes into recycled memory (which
    held the first call's values) and must still equal the reference everywhere, mxscale2's zero rows too."""
    import gc

    from swiglu_ops import cpu as cpu_backend

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


_CACHE_PROBE = """
import torch, swiglu_ops
from swiglu_ops import mx
from swiglu_ops.cpu import _mx_quant, _native, _numerics as nx
x = torch.randn(64, 128).to(torch.bfloat16)
swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, x[:, :64].contiguous(), backend="cpu")
kernel = _mx_quant.mx_quant_kernel(nx.BF16, mx.E4M3FN, _native.available(nx.BF16))
print(sum(kernel.stats.cache_hits.values()))
"""


def test_a_second_process_loads_the_kernels_from_the_disk_cache(tmp_path):
    """First-call latency rests on Numba's disk cache: a fresh interpreter must hit it. (It once did not:
    a dispatcher captured in the kernel's closure pickles with a per-process id into the cache key.)"""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", _CACHE_PROBE], env=env, capture_output=True, text=True, check=True
        )
        for _ in range(2)
    ]
    assert int(runs[0].stdout.split()[-1]) == 0  # compiled
    assert int(runs[1].stdout.split()[-1]) >= 1, runs[1].stdout + runs[1].stderr  # loaded


def test_kernels_cache_key_follows_every_cpu_source_file():
    """Numba's disk cache checks only the kernel's own file; the helpers in _numerics.py are inlined into
    the kernels, so each kernel captures a hash of all the backend's sources as a closure constant (part
    of Numba's cache key): editing any of them recompiles instead of loading a stale kernel."""
    import hashlib
    from pathlib import Path

    from swiglu_ops.cpu import _group_grad, _mx_quant

    files = sorted(Path(nx.__file__).parent.glob("*.py"))
    assert {f.name for f in files} >= {"_numerics.py", "_group_grad.py", "_mx_quant.py"}
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).digest()[:7]
    assert nx.SOURCE_TAG == int.from_bytes(digest, "little")
    for kernel in (
        _group_grad.group_grad_kernel(nx.BF16, True),
        _mx_quant.mx_quant_kernel(nx.BF16, mx.E4M3FN, False),
        *_native._sigmoid_kernels(),  # the C kernels' sigmoid table is computed by Numba too
    ):
        cells = dict(zip(kernel.py_func.__code__.co_freevars, kernel.py_func.__closure__, strict=True))
        assert cells["source_tag"].cell_contents == nx.SOURCE_TAG
