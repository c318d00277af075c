"""Fused SwigluGroupGrad kernel (``shared/spec/swiglu_group_grad.md`` section 9) for CPU tensors.

One pass over memory: each task handles a tile of rows; per row it reads grad_y, x (and y_origin), writes
grad_x, and sums grad_y * y_origin in NumPy's pairwise order from a row-sized scratch buffer that stays in
L1. Rows are independent and every row is computed by the same code, so the result is bitwise identical
for any number of threads.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from ._numerics import SOURCE_TAG, narrow, sigmoid_f32, widen

#: Rows per parallel task: enough work to amortise scheduling, small enough to balance the cores.
ROWS_PER_TASK = 16

_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


@njit(inline="always")
def _swiglu_grad(dy, g, u, w, m_r, clamp, has_clamp):
    """(dg, du) in fp32 for one element, in the kernel's operation order (spec section 3), no FMA."""
    if has_clamp:  # masks from the raw inputs, open intervals (NaN -> 0); min/clip propagate NaN
        m_g = _ONE if g < clamp else _ZERO
        m_u = _ONE if (u < clamp) and (-u < clamp) else _ZERO
        g = clamp if g >= clamp else g
        u = clamp if u >= clamp else u
        u = -clamp if u <= -clamp else u
    s = sigmoid_f32(g)
    f = g * s
    if g == -np.inf:
        f = _ZERO  # -inf * 0 = NaN -> 0
    sp = (s + f) - (f * s)
    if g == np.inf:
        sp = _ONE
    if g == -np.inf:
        sp = _ZERO
    dg = ((dy * sp) * u) * w
    du = (dy * f) * w
    if has_clamp:
        dg = dg * m_g
        du = du * m_u
    return dg * m_r, du * m_r


def pairwise_plan(n: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's float32 pairwise summation tree for ``n`` elements as a flat program for :func:`pairwise_sum`.

    Spec section 5: a run of ``n > 128`` elements splits at ``n // 2`` rounded down to a multiple of 8 and
    the two halves' sums are added; runs of at most 128 elements are leaves. Returns ``leaves`` [L, 2]
    (start, length) in order and ``merges`` [L]: how many stack merges follow each leaf (post-order).
    """
    leaves, merges = [], []

    def visit(start, count):
        if count <= 128:
            leaves.append((start, count))
            merges.append(0)
            return
        half = count // 2
        half -= half % 8
        visit(start, half)
        visit(start + half, count - half)
        merges[-1] += 1

    visit(0, n)
    return np.array(leaves, dtype=np.int64).reshape(-1, 2), np.array(merges, dtype=np.int64)


_U64 = np.uint64


@njit(inline="always")
def _leaf_sum(a, start, n):
    """NumPy's float32 sum of a run of at most 128 elements (spec section 5).

    Indices are ``uint64``: for a signed index Numba adds a negative-index wraparound select to every
    access (4 instructions per add here), which LLVM cannot drop because ``start`` comes from an array.
    """
    s = _U64(start)
    if n < 8:
        res = np.float32(-0.0)
        for i in range(n):
            res += a[s + _U64(i)]
        return res
    r0, r1, r2, r3 = a[s], a[s + _U64(1)], a[s + _U64(2)], a[s + _U64(3)]
    r4, r5, r6, r7 = a[s + _U64(4)], a[s + _U64(5)], a[s + _U64(6)], a[s + _U64(7)]
    body = n - n % 8
    for i in range(8, body, 8):
        u = s + _U64(i)
        r0 += a[u]
        r1 += a[u + _U64(1)]
        r2 += a[u + _U64(2)]
        r3 += a[u + _U64(3)]
        r4 += a[u + _U64(4)]
        r5 += a[u + _U64(5)]
        r6 += a[u + _U64(6)]
        r7 += a[u + _U64(7)]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(body, n):
        res += a[s + _U64(i)]
    return res


@njit(inline="always")
def pairwise_sum(a, leaves, merges, stack):
    """Sum of fp32 ``a`` in NumPy's pairwise order (without its final ``0.0 +``), following the program of
    :func:`pairwise_plan`; ``stack`` is fp32 scratch of at least ``len(leaves)`` entries."""
    top = 0
    for j in range(leaves.shape[0]):
        stack[top] = _leaf_sum(a, leaves[j, 0], leaves[j, 1])
        top += 1
        for _ in range(merges[j]):
            top -= 1
            stack[top - 1] = stack[top - 1] + stack[top]
    return stack[0]


@functools.cache
def group_grad_kernel(kind: int, has_clamp: bool):
    """The compiled kernel for one storage kind (``_numerics.BF16``/``FP16``/``FP32``) and clamp mode.

    ``kind`` and ``has_clamp`` are closure constants, so Numba compiles (and caches on disk) one
    specialised, branch-free kernel per combination, and only those that are used.
    """

    source_tag = SOURCE_TAG

    @njit(parallel=True, cache=True, error_model="numpy")
    def kernel(dy, x, weight, y_origin, valid_rows, clamp, leaves, merges, grad_x, grad_weight):
        """All rows. ``weight``/``grad_weight`` are empty (and ``y_origin`` is [0, H]) when absent."""
        _ = source_tag  # part of the cache key (see _numerics.SOURCE_TAG)
        rows, hidden = dy.shape
        has_weight = weight.shape[0] > 0
        ntasks = (rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
        for t in prange(ntasks):
            prod = np.empty(hidden if has_weight else 0, dtype=np.float32)
            stack = np.empty(leaves.shape[0], dtype=np.float32)
            for r in range(t * ROWS_PER_TASK, min((t + 1) * ROWS_PER_TASK, rows)):
                w = weight[r] if has_weight else _ONE  # multiplying by 1 is bit-identical to skipping it
                m_r = _ONE if r < valid_rows else _ZERO
                g, u = x[r, :hidden], x[r, hidden:]  # row slices: unit-stride loops from 0 vectorise
                dyr, dg_out, du_out = dy[r], grad_x[r, :hidden], grad_x[r, hidden:]
                for h in range(hidden):
                    dg, du = _swiglu_grad(
                        widen(dyr[h], kind), widen(g[h], kind), widen(u[h], kind), w, m_r, clamp, has_clamp
                    )
                    dg_out[h] = narrow(dg, kind)
                    du_out[h] = narrow(du, kind)
                if has_weight:  # grad_weight is never masked
                    yo = y_origin[r]
                    for h in range(hidden):
                        prod[h] = widen(dyr[h], kind) * widen(yo[h], kind)
                    grad_weight[r] = _ZERO + pairwise_sum(prod, leaves, merges, stack)

    return kernel
