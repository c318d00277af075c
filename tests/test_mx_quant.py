"""swiglu_backward_mx_quant_dual_axis: layouts, groups, shapes, special values and options.

Most tests feed inputs whose stage-1 gradient is known exactly (``_oracles.known_gradient_inputs``) and
compare every output with the loop-based layout oracle; the rest check exact relations between two calls
of the same backend (batching, strides, activate_left) or against the reference for random data.
"""

from __future__ import annotations

import pytest
import torch
from _compare import MX_NAMES, assert_bitwise_equal, assert_exact, assert_mx_matches
from _oracles import expected_mx, known_gradient_inputs

import swiglu_ops

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def quant(x, y_grad, group_index=None, **kwargs):
    return swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, y_grad, group_index, **kwargs)


def random_values(shape, dtype, seed, scale=1.0):
    """Gradient values spanning several binades (so blocks get different scales), in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-12, 8, shape, generator=gen).double())
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * mag * scale).to(dtype)


def check_known(backend, values, group_index=None, **kwargs):
    """Run the op on known-gradient inputs and compare all four outputs with the layout oracle."""
    x, y_grad, grad = known_gradient_inputs(values, activate_left=kwargs.get("activate_left", True))
    got = quant(x, y_grad, group_index, backend=backend, **kwargs)
    oracle_kwargs = {k: v for k, v in kwargs.items() if k in ("dst_dtype", "scale_alg")}
    assert_mx_matches(got, expected_mx(grad, group_index, **oracle_kwargs), backend)
    return got


def u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


# ---------------------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 33, 64, 65, 100])
def test_rows_not_multiple_of_block(backend, dtype, m):
    """M = 1, 33, 65, 100: the last 32-row block is zero padded; mxscale2 has ceil(M/64) rows."""
    got = check_known(backend, random_values((m, 96), dtype, seed=m))
    assert got[3].shape == (-(-m // 64), 192, 2)


@pytest.mark.parametrize("n", [32, 64, 96, 160])
def test_column_tails(backend, n):
    """2N = 64, 128, 192, 320: N % 128 in {32, 64, 96} tails of the 128-column tiles (spec 7)."""
    check_known(backend, random_values((40, n), torch.bfloat16, seed=n))


@pytest.mark.parametrize(
    ("ends", "m"),
    [([10, 100], 100), ([64, 128], 128), ([0, 5, 5, 70], 70), ([33, 40, 97], 97), ([1], 1), ([96, 96], 96)],
    ids=["10_100", "64_128", "empty_groups", "ragged", "single_row", "trailing_empty"],
)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_groups(backend, ends, m, index_dtype):
    """Token-axis blocks restart at every group start; group g's first mxscale2 row is start // 64 + g;
    rows no group maps to are zero."""
    group_index = torch.tensor(ends, dtype=index_dtype)
    got = check_known(backend, random_values((m, 64), torch.bfloat16, seed=len(ends) + m), group_index)
    assert got[3].shape == (m // 64 + len(ends), 128, 2)


def test_unused_mxscale2_rows_are_zero(backend):
    """Groups [64, 128]: R = 4, groups at rows 0 and 2, rows 1 and 3 stay zero even when ``out`` held
    garbage."""
    x, y_grad, _ = known_gradient_inputs(torch.ones(128, 32, dtype=torch.bfloat16))
    out = [
        torch.full(s.shape, 0x5A, dtype=torch.uint8).view(s.dtype)
        for s in quant(x, y_grad, torch.tensor([64, 128]), backend="reference")
    ]
    y1, s1, y2, s2 = quant(x, y_grad, torch.tensor([64, 128]), backend=backend, out=out)
    assert s2.data_ptr() == out[3].data_ptr()
    s2 = u8(s2)
    assert bool((s2[[1, 3]] == 0).all())
    assert bool((s2[[0, 2]] != 0).all())


def test_empty_rows(backend):
    """M == 0: empty y1/y2/mxscale1; mxscale2 keeps its R rows (0 without groups, G with), zero-filled."""
    x, y_grad = torch.zeros(0, 64, dtype=torch.bfloat16), torch.zeros(0, 32, dtype=torch.bfloat16)
    for group_index, rows in ((None, 0), (torch.tensor([0]), 1), (torch.tensor([0, 0, 0]), 3)):
        y1, s1, y2, s2 = quant(x, y_grad, group_index, backend=backend)
        assert (y1.shape, s1.shape, y2.shape, s2.shape) == ((0, 64), (0, 1, 2), (0, 64), (rows, 64, 2))
        assert (y1.dtype, s1.dtype, y2.dtype, s2.dtype) == (torch.float8_e4m3fn, torch.float8_e8m0fnu) * 2
        assert bool((u8(s2) == 0).all())


@pytest.mark.parametrize("shape", [(2, 40, 64), (3, 1, 70, 64)])
def test_batch_slices_are_independent(backend, shape):
    """Rank >= 3 without groups: each [M, C] slice is quantised on its own (its own mxscale2 rows)."""
    values = random_values(shape, torch.float16, seed=1)
    x, y_grad, _ = known_gradient_inputs(values)
    got = check_known(backend, values)
    m, c = x.shape[-2:]
    for i, (xi, yi) in enumerate(zip(x.reshape(-1, m, c), y_grad.reshape(-1, m, c // 2), strict=True)):
        single = quant(xi, yi, backend=backend)
        for a, e, name in zip(got, single, MX_NAMES, strict=True):
            assert_bitwise_equal(a.reshape(-1, *e.shape)[i], e, f"{name} slice {i}")


# ----------------------------------------------------------------------------------- special values


def test_negative_zero_blocks_keep_their_sign(backend):
    """All-zero blocks: scale 0; -0.0 gradients give code 0x80, +0.0 give 0x00."""
    values = torch.zeros(64, 32, dtype=torch.bfloat16)
    values[:32] = -0.0
    y1, s1, y2, s2 = check_known(backend, values)
    assert bool((u8(y1[:32]) == 0x80).all()) and bool((u8(y1[32:]) == 0).all())
    assert bool((u8(s1) == 0).all()) and bool((u8(s2) == 0).all())
    assert torch.equal(u8(y2), u8(y1))


def test_fp16_gradient_overflow(backend):
    """gB = 32 * 60000 overflows fp16 to inf: that row block and column block get scale 0xFF and codes
    0x00 (spec 2.3 / 3.2); the A half (60000, finite) is quantised normally."""
    values = random_values((40, 64), torch.float16, seed=2)
    values[5, 3] = 60000.0
    y1, s1, y2, s2 = check_known(backend, values)
    assert int(u8(s1)[5].view(-1)[2]) == 0xFF and bool((u8(y1)[5, 64:96] == 0).all())  # column 67's block
    assert int(u8(s2)[0, 67, 0]) == 0xFF and bool((u8(y2)[:32, 67] == 0).all())
    assert int(u8(s1)[5].view(-1)[0]) != 0xFF


# columns of grad_x poisoned by a non-finite input at x[m, col] (A = left half) or y_grad[m, col]
POISON = [
    ("A_nan", "x", 3, float("nan"), [3, 35]),
    ("A_inf", "x", 3, float("inf"), [3, 35]),
    ("A_minus_inf", "x", 3, float("-inf"), [3, 35]),
    ("B_nan", "x", 35, float("nan"), [3]),
    ("B_inf", "x", 35, float("inf"), [3]),
    ("B_minus_inf", "x", 35, float("-inf"), [3]),
    ("dy_nan", "y_grad", 3, float("nan"), [3, 35]),
    ("dy_inf", "y_grad", 3, float("inf"), [3, 35]),
]


@pytest.mark.parametrize(
    ("where", "col", "value", "columns"), [p[1:] for p in POISON], ids=[p[0] for p in POISON]
)
def test_non_finite_inputs_poison_only_their_blocks(backend, where, col, value, columns):
    """A NaN/inf input makes its gradient entries non-finite: their -1-axis block of row m and their
    -2-axis block of each column get scale 0xFF and codes 0x00; every other output is unchanged."""
    gen = torch.Generator().manual_seed(0)
    m, rows = 37, 70
    x = (torch.rand(rows, 64, generator=gen) * 4 + 0.5).bfloat16()  # A, B in (0.5, 4.5): no zero products
    y_grad = (torch.rand(rows, 32, generator=gen) + 0.5).bfloat16()
    clean = quant(x, y_grad, backend=backend)
    poisoned_inputs = {"x": x.clone(), "y_grad": y_grad.clone()}
    poisoned_inputs[where][m, col] = value
    got = quant(poisoned_inputs["x"], poisoned_inputs["y_grad"], backend=backend)

    expected = [u8(t).clone() for t in clean]
    y1, s1, y2, s2 = expected
    for c in columns:
        y1[m, 32 * (c // 32) : 32 * (c // 32) + 32] = 0
        s1[m].view(-1)[c // 32] = 0xFF
        y2[32 * (m // 32) : 32 * (m // 32) + 32, c] = 0
        s2[m // 64, c, (m // 32) % 2] = 0xFF
    for a, e, name in zip(got, expected, MX_NAMES, strict=True):
        assert_exact(u8(a), e, name)


# ------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_formats_and_scale_algorithms(backend, dtype, dst_dtype, scale_alg):
    """E4M3FN/E5M2 x RCEIL/OCP, with block maxima in the OCP saturation ranges."""
    values = random_values((70, 64), dtype, seed=scale_alg)
    values[0, :4] = torch.tensor([480.0, -500.0, 60.0, 63488.0], dtype=dtype)
    check_known(backend, values, torch.tensor([30, 70]), dst_dtype=dst_dtype, scale_alg=scale_alg)


def test_fp32_input_keeps_fp32_gradients(backend):
    """fp32 x: the gradient is not rounded to 16 bits (3.5 + 1 ulp keeps its extra bit: scale 121)."""
    values = random_values((40, 32), torch.float32, seed=3)
    values[0, 0] = torch.nextafter(torch.tensor(3.5), torch.tensor(4.0))
    values[0, 1:] = 0.0
    y1, s1, _, _ = check_known(backend, values)
    assert int(u8(s1)[0, 0, 0]) == 121


def swap_halves(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.cat(t.chunk(2, dim=dim)[::-1], dim=dim)


@pytest.mark.parametrize("group_index", [None, torch.tensor([20, 70])], ids=["no_groups", "groups"])
def test_activate_left_false_is_activate_left_with_halves_swapped(backend, group_index):
    """activate_left=False uses A = right half, and grad_x columns follow x's layout. So with
    x' = swap(x): y(x, False) = swap(y(x', True)) for y1/y2 and mxscale2 (columns), and mxscale1's flat
    block order [A blocks | B blocks] is swapped too."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(70, 128, generator=gen) * 2).bfloat16()
    y_grad = torch.randn(70, 64, generator=gen).bfloat16()
    left = quant(x, y_grad, group_index, activate_left=False, backend=backend)
    right = quant(swap_halves(x), y_grad, group_index, backend=backend)
    y1, s1, y2, s2 = right
    s1_swapped = swap_halves(u8(s1).reshape(70, -1)).reshape(s1.shape).view(s1.dtype)
    expected = (
        swap_halves(u8(y1)).view(y1.dtype),
        s1_swapped,
        swap_halves(u8(y2)).view(y2.dtype),
        swap_halves(u8(s2), dim=-2).view(s2.dtype),
    )
    for a, e, name in zip(left, expected, MX_NAMES, strict=True):
        assert_bitwise_equal(a, e, name)
    check_known(backend, random_values((70, 64), torch.bfloat16, seed=5), group_index, activate_left=False)


def test_non_contiguous_inputs(backend):
    """Transposed / strided views give the same outputs as their contiguous copies."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(128, 70, generator=gen).bfloat16().t()  # [70, 128], column-major
    y_grad = torch.randn(70, 128, generator=gen).bfloat16()[:, ::2]  # [70, 64], stride 2
    assert not x.is_contiguous() and not y_grad.is_contiguous()
    for group_index in (None, torch.tensor([10, 99, 30, 99, 70, 99])[::2]):
        got = quant(x, y_grad, group_index, backend=backend)
        want = quant(x.contiguous(), y_grad.contiguous(), group_index, backend=backend)
        for a, e, name in zip(got, want, MX_NAMES, strict=True):
            assert_bitwise_equal(a, e, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_index", [None, torch.tensor([17, 64, 100])], ids=["no_groups", "groups"])
def test_random_inputs_match_reference(backend, dtype, group_index):
    """Random SwiGLU inputs (stage 1 with exp): every output against the reference, contract tolerances."""
    gen = torch.Generator().manual_seed(8)
    x = (torch.randn(100, 192, generator=gen) * 3).to(dtype)
    y_grad = torch.randn(100, 96, generator=gen).to(dtype)
    got = quant(x, y_grad, group_index, backend=backend)
    assert_mx_matches(got, quant(x, y_grad, group_index, backend="reference"), backend)


def test_out_tensors_are_written_and_returned(backend):
    x, y_grad, grad = known_gradient_inputs(random_values((40, 32), torch.bfloat16, seed=9))
    expected = expected_mx(grad, torch.tensor([40]))
    out = [torch.empty_like(t) for t in expected]
    got = quant(x, y_grad, torch.tensor([40]), backend=backend, out=out)
    assert all(a is b for a, b in zip(got, out, strict=True))
    assert_mx_matches(got, expected, backend)
