"""swiglu_group_grad: special values, clamp semantics, group_index count mode, grad_weight, shapes, strides.

Expected values are exact where the spec fixes them without an ``exp`` (gate 0 gives s = 0.5, f = 0; masked
and infinite inputs), relations between two calls of the same backend are bitwise, and random data is
checked against float64 autograd (every backend) and the reference (fast backends).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _compare import (
    assert_bitwise_equal,
    assert_exact,
    assert_group_grad_matches,
    assert_matches_reference,
    sum_magnitude,
)
from _oracles import assert_close_to_autograd

import swiglu_ops

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
INF, NAN = float("inf"), float("nan")


def group_grad(*args, **kwargs):
    return swiglu_ops.swiglu_group_grad(*args, **kwargs)


def random_inputs(rows, hidden, dtype, seed, *, lead=None, weight=True):
    """dy ~ U(-1, 1), x ~ U(-5, 5), weight ~ U(0.5, 2), y_origin ~ U(-1, 1) (spec 7.6 generator)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows,) if lead is None else lead

    def uniform(s, lo, hi, dt=dtype):
        return (torch.rand(s, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dt)

    dy = uniform((*shape, hidden), -1, 1)
    x = uniform((*shape, 2 * hidden), -5, 5)
    if not weight:
        return dy, x, None, None
    return dy, x, uniform((*shape, 1), 0.5, 2, torch.float32), uniform((*shape, hidden), -1, 1)


def away_from(x: torch.Tensor, clamp: float, margin: float = 0.05) -> torch.Tensor:
    """x with every gate near c and every up near +-c moved to 0 (the derivative jumps there)."""
    g, u = x.chunk(2, dim=-1)
    g = torch.where((g.double() - clamp).abs() < margin, torch.zeros_like(g), g)
    u = torch.where((u.double().abs() - clamp).abs() < margin, torch.zeros_like(u), u)
    return torch.cat([g, u], dim=-1)


# ------------------------------------------------------------------------------- special values, clamp

# (gate, up, clamp, expected dg, expected du) for dy = -1.5 and no weight. A gate of 0 gives s = 0.5, f = 0
# and silu' = 0.5 exactly, so every expected value is exact (spec 3, 3.2, 3.4).
SPECIAL = [
    (0.0, 2.0, 0.0, -1.5, -0.0),
    (INF, 2.0, 0.0, -3.0, -INF),  # sp = 1, f = inf
    (-INF, 2.0, 0.0, -0.0, -0.0),  # s = 0, f = 0 (forced), sp = 0
    (NAN, 2.0, 0.0, NAN, NAN),
    (0.0, NAN, 0.0, NAN, -0.0),
    (0.0, INF, 0.0, -INF, -0.0),
    (0.0, -INF, 0.0, INF, -0.0),
    (INF, INF, 0.0, -INF, -INF),
    (-INF, 2.0, 3.0, -0.0, -0.0),  # -inf < c: the gate is not masked
    (NAN, 2.0, 3.0, NAN, NAN),  # masks multiply: NaN * 0 stays NaN
    (0.0, NAN, 3.0, NAN, -0.0),  # clip propagates NaN into dg; du = (dy * 0) * 0
    (0.0, INF, 3.0, -2.25, -0.0),  # u clipped to 3, up masked
    (0.0, -INF, 3.0, 2.25, -0.0),
    (0.0, 3.0, 3.0, -2.25, -0.0),  # exactly at +c: open interval, masked
    (0.0, -3.0, 3.0, 2.25, -0.0),
    (0.0, 2.0, INF, -1.5, -0.0),  # c = +inf: finite inputs untouched
    (INF, 2.0, INF, -0.0, -INF),  # g = +inf masked: dg = (dy * 1 * 2) * 0
    (0.0, INF, INF, -INF, -0.0),  # u = +inf masked for du only
    (INF, INF, INF, NAN, NAN),  # masked infinities: inf * 0 = NaN
    (-INF, -INF, INF, NAN, -0.0),  # dg = (dy * 0) * -inf = NaN; du = (dy * 0) * 0
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_table(backend, dtype):
    """NaN / +-inf in the gate and up halves, inputs at +-c, c = +inf: exact dg and du."""
    g = torch.tensor([[row[0] for row in SPECIAL]], dtype=dtype)
    u = torch.tensor([[row[1] for row in SPECIAL]], dtype=dtype)
    dy = torch.full_like(g, -1.5)
    expected = torch.tensor([[row[3] for row in SPECIAL] + [row[4] for row in SPECIAL]], dtype=dtype)
    for clamp in sorted({row[2] for row in SPECIAL}):
        cols = torch.tensor([row[2] == clamp for row in SPECIAL])
        got, _ = group_grad(
            dy[:, cols], torch.cat([g[:, cols], u[:, cols]], dim=1), clamp_limit=clamp, backend=backend
        )
        assert_exact(got, expected[:, torch.cat([cols, cols])], f"grad_x (clamp {clamp})")


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_inputs_behave_like_the_boundary(backend, dtype):
    """With clamp c: any gate >= c (inf included) gives the outputs of gate == c, any up >= c those of
    up == c and any up <= -c those of up == -c, bitwise (g~ and u~ are equal and the masks are 0)."""
    c = 2.5
    dy, x, w, y_origin = random_inputs(8, 32, dtype, seed=1)
    x = away_from(x, c)
    g, u = x.chunk(2, dim=1)
    big = torch.tensor([c, c + 0.5, 100.0, INF], dtype=dtype).repeat(64)[: 8 * 32].reshape(8, 32)
    beyond = torch.cat([torch.where(g > 0, big, g), torch.where(u > 0, big, -big)], dim=1)
    at_c = torch.cat([torch.where(g > 0, c, g), torch.where(u > 0, c, -c)], dim=1).to(dtype)
    got = group_grad(dy, beyond, w, y_origin, clamp_limit=c, backend=backend)
    want = group_grad(dy, at_c, w, y_origin, clamp_limit=c, backend=backend)
    assert_bitwise_equal(got[0], want[0], "grad_x")


@pytest.mark.parametrize(("clamp", "same_as"), [(1e-50, 0.0), (-0.0, 0.0), (1e39, INF)])
def test_clamp_is_rounded_to_fp32(backend, clamp, same_as):
    """Spec 2.4: the clamp is cast to fp32 after the >= 0 check: 1e-50 -> 0 (disabled), 1e39 -> +inf."""
    dy, x, w, y_origin = random_inputs(4, 16, torch.float32, seed=12)
    x[0, :4] = torch.tensor([INF, -INF, NAN, 7.0])
    x[1, 16:20] = torch.tensor([INF, -INF, NAN, 7.0])
    got = group_grad(dy, x, w, y_origin, clamp_limit=clamp, backend=backend)
    want = group_grad(dy, x, w, y_origin, clamp_limit=same_as, backend=backend)
    assert_bitwise_equal(got[0], want[0], "grad_x")


@pytest.mark.parametrize(
    ("where", "col", "changed"),
    [("gate", 5, [5, 37]), ("up", 5, [5]), ("dy", 5, [5, 37]), ("y_origin", 5, []), ("weight", None, "row")],
)
@pytest.mark.parametrize("clamp", [0.0, 3.0])
def test_nan_stays_in_its_element(backend, where, col, changed, clamp):
    """A NaN input changes only the grad_x elements that read it (grad_weight: only its row, and only
    through dy / y_origin); every other output is bitwise the clean run."""
    dy, x, w, y_origin = random_inputs(6, 32, torch.bfloat16, seed=2)
    clean = group_grad(dy, x, w, y_origin, clamp_limit=clamp, backend=backend)
    inputs = {"gate": x.clone(), "dy": dy.clone(), "y_origin": y_origin.clone(), "weight": w.clone()}
    inputs["up"] = inputs["gate"]
    r = 4
    if where == "weight":
        inputs["weight"][r] = NAN
    else:
        inputs[where][r, col + (32 if where == "up" else 0)] = NAN
    grad_x, grad_weight = group_grad(
        inputs["dy"], inputs["gate"], inputs["weight"], inputs["y_origin"], clamp_limit=clamp, backend=backend
    )
    cols = list(range(64)) if changed == "row" else changed
    expected = clean[0].clone()
    expected[r, cols] = NAN
    if where == "up" and clamp > 0:
        expected[r, col + 32] = clean[0][r, col + 32] * 0  # du = (dy * f) * m_u with m_u(NaN) = 0
    assert_exact(grad_x, expected, "grad_x")
    expected_w = clean[1].clone()
    if where in ("dy", "y_origin"):
        expected_w[r] = NAN
    assert_exact(grad_weight, expected_w, "grad_weight")


def test_large_gates_silu_prime_quirk(backend):
    """Spec 3.1: no clamp, sp = fl(fl(1 + g) - g): 1 below 2**24, 0 at 2**24, 2 at 2**24 + 2, 0 from 2**25."""
    g = torch.tensor([[2.0**24 - 1, 2.0**24, 2.0**24 + 2, 2.0**25, 2.0**30, 3e38]])
    got, _ = group_grad(torch.ones_like(g), torch.cat([g, torch.ones_like(g)], dim=1), backend=backend)
    assert_exact(got, torch.cat([torch.tensor([[1.0, 0.0, 2.0, 0.0, 0.0, 0.0]]), g], dim=1), "grad_x")


def test_fp16_overflow_gives_inf(backend):
    """grad_x is cast with RNE and no saturation: dg = 60000 * 0.5 * 4 = 120000 -> inf in fp16."""
    dy = torch.tensor([[60000.0, -60000.0, 1.0]], dtype=torch.float16)
    x = torch.tensor([[0.0, 0.0, 0.0, 4.0, 4.0, 4.0]], dtype=torch.float16)
    got, _ = group_grad(dy, x, backend=backend)
    expected = torch.tensor([[INF, -INF, 2.0, 0.0, -0.0, 0.0]], dtype=torch.float16)
    assert_exact(got, expected, "grad_x")


# -------------------------------------------------------------------------------- group_index counts

VALID_ROWS = [
    ([3], 3),
    ([1, 2], 3),  # counts are summed, not cumulative ends
    ([2, 4, 6, 8], 8),  # cumulative offsets sum to 20 > rows: every row valid
    ([5, -3], 2),  # negative entries are summed (sum-then-clamp, not SIMT's saturating prefix)
    ([-4], 0),
    ([0], 0),
    ([2**62, 2**62, 2**62, 2**62 + 3], 3),  # int64 wraparound: 2**64 + 3 -> 3
    ([2**62, 2**62], 0),  # wraps to -2**63 -> clamp 0
]


@pytest.mark.parametrize(("counts", "valid"), VALID_ROWS, ids=[str(v[0]) for v in VALID_ROWS])
def test_group_index_count_mode(backend, counts, valid):
    """Rows >= clamp(sum(group_index), 0, rows) are multiplied by 0.0 (sign kept, inf/NaN -> NaN);
    grad_weight is never masked."""
    dy, x, w, y_origin = random_inputs(8, 16, torch.bfloat16, seed=3)
    x[6, 0] = INF  # masked: (dy * 1 * u) * w * 0 stays finite, du = dy * inf * 0 = NaN
    full = group_grad(dy, x, w, y_origin, backend=backend)
    expected = full[0].clone()
    expected[valid:] = full[0][valid:] * 0.0
    for dtype in (torch.int64, torch.int32):
        if dtype == torch.int32 and max(abs(c) for c in counts) >= 2**31:
            continue
        got = group_grad(dy, x, w, y_origin, torch.tensor(counts, dtype=dtype), backend=backend)
        assert_exact(got[0], expected, f"grad_x ({dtype})")
        assert_bitwise_equal(got[1], full[1], "grad_weight")


def test_group_index_mask_applies_to_flattened_rows(backend):
    """3-D input: the valid rows are the prefix of the flattened B*S rows."""
    dy, x, w, y_origin = random_inputs(0, 16, torch.float32, seed=4, lead=(2, 3))
    got, _ = group_grad(dy, x, w, y_origin, torch.tensor([4]), backend=backend)
    full, _ = group_grad(dy, x, w, y_origin, backend=backend)
    assert_bitwise_equal(got.reshape(6, 32)[:4], full.reshape(6, 32)[:4], "valid rows")
    assert_exact(got.reshape(6, 32)[4:], full.reshape(6, 32)[4:] * 0.0, "masked rows")


# ----------------------------------------------------------------------------------------- grad_weight


@pytest.mark.parametrize("dtype", DTYPES)
def test_grad_weight_is_pairwise_sum_of_products(backend, dtype):
    """grad_weight = numpy.sum(fp32(dy) * fp32(y_origin), axis=-1): not divided by weight, not masked by
    the clamp or the group mask."""
    dy, x, w, y_origin = random_inputs(5, 300, dtype, seed=5)
    w[0] = 0.0
    w[1] = -3.0
    _, got = group_grad(dy, x, w, y_origin, torch.tensor([1]), 0.5, backend=backend)
    products = dy.float().numpy() * y_origin.float().numpy()
    expected = torch.from_numpy(np.sum(products, axis=-1, keepdims=True))
    assert_matches_reference(
        got, expected, backend, "grad_weight", grad_weight=True, magnitude=sum_magnitude(dy, y_origin)
    )


def test_grad_weight_of_negative_zero_products_is_positive_zero(backend):
    """0.0 + pairwise sum: an all -0.0 row gives +0.0 (spec 5)."""
    dy = torch.full((2, 9), -0.0)
    _, got = group_grad(dy, torch.zeros(2, 18), torch.ones(2), torch.ones(2, 9), backend=backend)
    assert_exact(got, torch.zeros(2), "grad_weight")


# ------------------------------------------------------------------------------------ shapes, strides


@pytest.mark.parametrize("weight_shape", [(6,), (6, 1), (2, 3, 1), (3, 2)])
def test_weight_shapes(backend, weight_shape):
    """weight may have any shape with numel == rows; grad_weight takes weight's shape, same values."""
    dy, x, w, y_origin = random_inputs(0, 16, torch.bfloat16, seed=6, lead=(2, 3))
    base = group_grad(dy, x, w, y_origin, backend=backend)
    got = group_grad(dy, x, w.reshape(weight_shape), y_origin, backend=backend)
    assert got[1].shape == weight_shape
    assert_bitwise_equal(got[0], base[0], "grad_x")
    assert_bitwise_equal(got[1], base[1].reshape(weight_shape), "grad_weight")


@pytest.mark.parametrize("lead", [(2, 3), (2, 1, 3)])
def test_higher_rank_equals_flattened_rows(backend, lead):
    dy, x, w, y_origin = random_inputs(0, 24, torch.float16, seed=7, lead=lead)
    got = group_grad(dy, x, w, y_origin, torch.tensor([5]), 4.0, backend=backend)
    flat = group_grad(
        dy.reshape(6, 24),
        x.reshape(6, 48),
        w.reshape(6),
        y_origin.reshape(6, 24),
        torch.tensor([5]),
        4.0,
        backend=backend,
    )
    assert got[0].shape == x.shape
    assert_bitwise_equal(got[0].reshape(6, 48), flat[0], "grad_x")
    assert_bitwise_equal(got[1].reshape(6), flat[1], "grad_weight")


def test_non_contiguous_inputs(backend):
    """Transposed / strided views give the same outputs as their contiguous copies."""
    dy, x, w, y_origin = random_inputs(8, 32, torch.bfloat16, seed=8)
    dy_t = dy.t().contiguous().t()
    x_t = x.t().contiguous().t()
    w_s = torch.stack([w, w], dim=1)[:, 0]
    y_s = torch.cat([y_origin, y_origin], dim=1)[:, ::2]
    y_s.copy_(y_origin)
    assert not any(t.is_contiguous() for t in (dy_t, x_t, w_s, y_s))
    got = group_grad(dy_t, x_t, w_s, y_s, torch.tensor([9, 99])[::2], 3.0, backend=backend)
    want = group_grad(dy, x, w, y_origin, torch.tensor([9]), 3.0, backend=backend)
    assert_bitwise_equal(got[0], want[0], "grad_x")
    assert_bitwise_equal(got[1], want[1], "grad_weight")


def test_zero_rows_give_empty_outputs(backend):
    for weight_shape in ((0,), (0, 1)):
        grad_x, grad_weight = group_grad(
            torch.zeros(0, 16),
            torch.zeros(0, 32),
            torch.zeros(weight_shape),
            torch.zeros(0, 16),
            torch.tensor([3]),
            1.0,
            backend=backend,
        )
        assert grad_x.shape == (0, 32) and grad_x.dtype == torch.float32
        assert grad_weight.shape == weight_shape and grad_weight.dtype == torch.float32
    grad_x, grad_weight = group_grad(
        torch.zeros(2, 0, 8, dtype=torch.bfloat16),
        torch.zeros(2, 0, 16, dtype=torch.bfloat16),
        backend=backend,
    )
    assert grad_x.shape == (2, 0, 16) and grad_x.dtype == torch.bfloat16 and grad_weight is None


def test_out_tensors_are_written_and_returned(backend):
    dy, x, w, y_origin = random_inputs(4, 8, torch.float16, seed=9)
    want = group_grad(dy, x, w, y_origin, backend=backend)
    out = (torch.full_like(want[0], NAN), torch.full_like(want[1], NAN))
    got = group_grad(dy, x, w, y_origin, backend=backend, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert_bitwise_equal(got[0], want[0], "grad_x")
    assert_bitwise_equal(got[1], want[1], "grad_weight")


# ------------------------------------------------------------------------------------- random data

# Shapes of the generated ST matrix (spec 7.6) that stay small, every feature combination.
SHAPES = [(4, 16, None), (0, 16, (2, 4)), (8, 32, None), (4, 256, None), (32, 128, None), (16, 1024, None)]


@pytest.mark.parametrize(("rows", "hidden", "lead"), SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clamp", [0.0, 5.0])
@pytest.mark.parametrize("options", ["none", "weight", "group", "weight_group"])
def test_random_inputs(backend, rows, hidden, lead, dtype, clamp, options):
    """Random inputs: float64 autograd within rounding (every backend), the reference within the contract
    (fast backends)."""
    with_weight = "weight" in options
    dy, x, w, y_origin = random_inputs(rows, hidden, dtype, seed=hidden + rows, lead=lead, weight=with_weight)
    x = away_from(x, clamp) if clamp else x
    n_rows = dy.numel() // hidden
    group_index = torch.tensor([n_rows // 2, 1]) if "group" in options else None
    got = group_grad(dy, x, w, y_origin, group_index, clamp, backend=backend)
    assert_close_to_autograd(got[0], dy, x, w, clamp, None if group_index is None else n_rows // 2 + 1)
    if backend != "reference":
        want = group_grad(dy, x, w, y_origin, group_index, clamp, backend="reference")
        assert_group_grad_matches(got, want, backend, (dy, x, w, y_origin, clamp))


def test_large_shape(compiled_backend):
    """The (1024, 2048) shape of the ST matrix, with every option (too slow for interpreted backends)."""
    dy, x, w, y_origin = random_inputs(1024, 1024, torch.bfloat16, seed=10)
    x = away_from(x, 3.0)
    got = group_grad(dy, x, w, y_origin, torch.tensor([1000]), 3.0, backend=compiled_backend)
    assert_close_to_autograd(got[0], dy, x, w, 3.0, 1000)
    if compiled_backend != "reference":
        want = group_grad(dy, x, w, y_origin, torch.tensor([1000]), 3.0, backend="reference")
        assert_group_grad_matches(got, want, compiled_backend, (dy, x, w, y_origin, 3.0))
