"""Fused SwigluBackwardMxQuantWithDualAxis kernel (``shared/spec/swiglu_backward_mx_quant.md`` 2-4) for CPU.

Work is cut into tasks of one 32-row block (of a group, or of a batch slice without groups) times a chunk
of ``CHUNK`` columns of each half. A task reads its rows of x and grad_y once, keeps the 16-bit gradient of
both halves as stored bits in a small tile (32 x 2*CHUNK, 64 KiB for 16-bit dtypes, in L2) together with
its column amax, and produces from that tile both quantisation directions: row-wise 32-column blocks (y1,
mxscale1) and the 32-row column blocks (y2, mxscale2). Tasks write disjoint outputs with the same code, so
results are bitwise identical for any number of threads.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from .. import mx
from . import _native
from ._numerics import (
    BF16,
    FP32,
    SOURCE_TAG,
    bits_from_f32,
    fp8_encode,
    narrow,
    scale_code,
    scale_reciprocal,
    sigmoid_f32,
    widen,
)

#: Columns of each half per task (a multiple of the 32-column block).
CHUNK = 512
_BLOCK = mx.BLOCK
_ONE = np.float32(1.0)
_U32 = np.uint32


@njit(inline="always")
def _swiglu_backward(a, b, g):
    """Spec 2.2: (grad A, grad B) in fp32, the kernel's operation order, no FMA."""
    s = sigmoid_f32(a)
    t = ((-s) + _ONE) * a + _ONE
    return ((t * b) * s) * g, (s * g) * a


def row_blocks(batch: int, ranges, bases) -> np.ndarray:
    """The 32-row blocks as int64 [T, 5]: (batch index, first row, rows, mxscale2 row, mxscale2 slot).

    Blocks restart at every group start; block t of a group whose first mxscale2 row is ``base`` goes to
    row ``base + t // 2``, slot ``t % 2`` (spec 4.2). Without groups, ``ranges = [(0, M)]`` and ``bases =
    [0]``, repeated for every batch slice.
    """
    parts = []
    for (start, end), base in zip(ranges, bases, strict=True):
        t = np.arange(-(-(end - start) // _BLOCK), dtype=np.int64)
        first = start + _BLOCK * t
        parts.append(np.stack([first, np.minimum(end - first, _BLOCK), base + t // 2, t % 2], axis=1))
    blocks = np.concatenate(parts) if parts else np.empty((0, 4), dtype=np.int64)
    b = np.repeat(np.arange(batch, dtype=np.int64), len(blocks))
    return np.concatenate([b[:, None], np.tile(blocks, (batch, 1))], axis=1)


@njit(inline="always")
def _stage1(kind, storage, x, dy, bi, row0, nrows, j0, width, a_col, b_col, tile, col_amax):
    """A task's stage 1: the SwiGLU backward rounded to x's dtype, as stored bits into ``tile`` [row, half
    (A, B), column], and the column amax of the magnitude bits into ``col_amax`` [half, column]. Loops
    index row slices from 0 so that LLVM sees unit-stride, non-negative indices and vectorises them."""
    mag_mask = storage(0x7FFFFFFF if kind == FP32 else 0x7FFF)
    ca, cb = col_amax[0], col_amax[1]
    for i in range(nrows):
        xa = x[bi, row0 + i, a_col + j0 : a_col + j0 + width]
        xb = x[bi, row0 + i, b_col + j0 : b_col + j0 + width]
        g = dy[bi, row0 + i, j0 : j0 + width]
        ta = tile[i, 0]
        tb = tile[i, 1]
        for j in range(width):
            ga, gb = _swiglu_backward(widen(xa[j], kind), widen(xb[j], kind), widen(g[j], kind))
            ba = storage(narrow(ga, kind))
            bb = storage(narrow(gb, kind))
            ta[j] = ba
            tb[j] = bb
            ca[j] = max(ca[j], storage(ba & mag_mask))
            cb[j] = max(cb[j], storage(bb & mag_mask))


@njit(inline="always")
def _stage1_simd(kind, x, dy, bi, row0, nrows, j0, width, a_col, b_col, table, tile, col_amax):
    """:func:`_stage1` by the AVX-512 code of ``_simd.c`` (16-bit kinds; bit-identical, about twice as
    fast), ``table`` being ``_native.sigmoid_table(kind)``. Pointers go as integers: byte offsets of the
    C-contiguous arrays."""
    m, c, n = x.shape[1], x.shape[2], dy.shape[2]
    _native.MX_STAGE1(
        x.ctypes.data + 2 * ((bi * m + row0) * c + a_col + j0),
        x.ctypes.data + 2 * ((bi * m + row0) * c + b_col + j0),
        dy.ctypes.data + 2 * ((bi * m + row0) * n + j0),
        c, n, nrows, width, table.ctypes.data,
        tile.ctypes.data, tile.shape[1] * tile.shape[2], tile.shape[2], col_amax.ctypes.data,
        np.int32(0 if kind == BF16 else 1),
    )  # fmt: skip


@njit(inline="always")
def _quantise(kind, storage, tile, col_amax, half, nrows, width, y1, s1, y2, s2, bi, row0, col0, s2_row, slot,
              scale_alg, fmt_args):  # fmt: skip
    """Both quantisations of one half of a task's tile (``tile[:, half]``, column amax ``col_amax[half]``):
    row-wise 32-column blocks into y1/s1 and one 32-row block per column into y2/s2, for the task's rows
    from ``row0`` and columns from ``col0``."""
    mbits, bias, max_code, sub_magic, emax, inv_max = fmt_args
    col_recip = np.empty(width, dtype=np.float32)
    mag_mask = storage(0x7FFFFFFF if kind == FP32 else 0x7FFF)
    # -1 axis: blocks of 32 consecutive columns of one row.
    for i in range(nrows):
        v = tile[i, half]
        q = y1[bi, row0 + i, col0 : col0 + width]
        sc = s1[bi, row0 + i, col0 // _BLOCK : (col0 + width) // _BLOCK]
        for k in range(width // _BLOCK):
            blk = v[k * _BLOCK : (k + 1) * _BLOCK]
            amax = storage(0)
            for j in range(blk.shape[0]):  # a runtime trip count: vectorised, not unrolled
                amax = max(amax, storage(blk[j] & mag_mask))
            amax32 = bits_from_f32(widen(amax, kind))
            code = scale_code(amax32, scale_alg, emax, inv_max)
            recip = scale_reciprocal(code, amax32, scale_alg)
            sc[k] = code
            qb = q[k * _BLOCK : (k + 1) * _BLOCK]
            for j in range(_BLOCK):
                qb[j] = fp8_encode(widen(blk[j], kind) * recip, mbits, bias, max_code, sub_magic)
    # -2 axis: one block per column over this task's rows (zero padding never raises amax).
    ch = col_amax[half]
    sc2 = s2[bi, s2_row, col0 : col0 + width, slot]
    for j in range(width):
        amax32 = bits_from_f32(widen(ch[j], kind))
        code = scale_code(amax32, scale_alg, emax, inv_max)
        col_recip[j] = scale_reciprocal(code, amax32, scale_alg)
        sc2[j] = code
    for i in range(nrows):
        v = tile[i, half]
        q = y2[bi, row0 + i, col0 : col0 + width]
        for j in range(width):
            q[j] = fp8_encode(widen(v[j], kind) * col_recip[j], mbits, bias, max_code, sub_magic)


@njit(inline="always")
def _quantise_simd(kind, tile, col_amax, half, nrows, width, y1, s1, y2, s2, bi, row0, col0, s2_row, slot,
                   scale_alg, fmt_args):  # fmt: skip
    """:func:`_quantise` by the AVX-512 code of ``_simd.c`` (16-bit kinds; bit-identical). Pointers go as
    integers: byte offsets into the C-contiguous arrays (``tile`` 16-bit, the outputs uint8)."""
    mbits, bias, max_code, sub_magic, emax, inv_max = fmt_args
    m, c, c32 = y1.shape[1], y1.shape[2], s1.shape[2]
    y_at = (bi * m + row0) * c + col0  # element [bi, row0, col0] of y1 and y2
    s1_at = (bi * m + row0) * c32 + col0 // _BLOCK
    s2_at = ((bi * s2.shape[1] + s2_row) * c + col0) * 2 + slot
    _native.MX_QUANTISE(
        tile.ctypes.data + 2 * half * tile.shape[2], col_amax.ctypes.data + 2 * half * col_amax.shape[1],
        tile.shape[1] * tile.shape[2], nrows, width, y1.ctypes.data + y_at, s1.ctypes.data + s1_at,
        y2.ctypes.data + y_at, s2.ctypes.data + s2_at, c, c32, np.int32(0 if kind == BF16 else 1),
        np.int32(scale_alg), mbits, bias, max_code, sub_magic, emax, inv_max,
    )  # fmt: skip


@functools.cache
def mx_quant_kernel(kind: int, fmt: mx.FP8Format, simd: bool):
    """The compiled kernel for one storage kind (``_numerics.BF16``/``FP16``/``FP32``), FP8 format and
    implementation of a task's stages (``simd``: the AVX-512 code of ``_simd.c``, for 16-bit kinds where
    ``_native.available``), closure constants so that Numba compiles (and caches on disk) one branch-free
    kernel per combination that is used, with the format's shifts and limits folded in."""
    emax, mbits, bias, max_code = fmt.emax, fmt.mbits, fmt.bias, fmt.max_code
    inv_max = np.float32(fmt.inv_max)
    sub_magic = (1 - bias - mbits + 23 + 127) << 23  # fp32 bits of 2**(emin - mbits + 23)
    storage = np.uint32 if kind == FP32 else np.uint16
    assert not simd or CHUNK <= _native.MX_MAX_WIDTH, "the C quantiser takes at most MX_MAX_WIDTH columns"
    fmt_args = (
        np.int32(mbits),
        np.int32(bias),
        np.int32(max_code),
        np.int32(sub_magic),
        np.int32(emax),
        inv_max,
    )

    source_tag = SOURCE_TAG

    @njit(parallel=True, cache=True, error_model="numpy")
    def kernel(x, dy, blocks, activate_left, scale_alg, table, y1, s1, y2, s2):
        """``table`` is ``_native.sigmoid_table(kind)`` for the SIMD stage 1, else unused."""
        _ = source_tag  # part of the cache key (see _numerics.SOURCE_TAG)
        n = dy.shape[2]
        nchunks = (n + CHUNK - 1) // CHUNK
        a_col = 0 if activate_left else n  # the activated half A; its gradient goes to A's columns
        b_col = n - a_col
        for job in prange(blocks.shape[0] * nchunks):
            bi, row0, nrows, s2_row, slot = blocks[job // nchunks]
            j0 = (job % nchunks) * CHUNK
            width = min(CHUNK, n - j0)
            tile = np.empty((_BLOCK, 2, CHUNK), dtype=storage)  # [row, half (A, B), column], stored bits
            col_amax = np.zeros((2, CHUNK), dtype=storage)  # magnitude bits

            # Stage 1: SwiGLU backward, rounded to x's dtype, into the tile, and the column amax. Then both
            # quantisations of each half. ``simd`` is a constant: Numba prunes the other branch before typing
            # (a dispatcher captured in the closure instead would change Numba's cache key in every process).
            if simd:
                _stage1_simd(kind, x, dy, bi, row0, nrows, j0, width, a_col, b_col, table, tile, col_amax)
            else:
                _stage1(kind, storage, x, dy, bi, row0, nrows, j0, width, a_col, b_col, tile, col_amax)
            for half in range(2):
                col0 = (a_col if half == 0 else b_col) + j0
                if simd:
                    _quantise_simd(
                        kind, tile, col_amax, half, nrows, width, y1, s1, y2, s2, bi, row0, col0, s2_row,
                        slot, scale_alg, fmt_args,
                    )  # fmt: skip
                else:
                    _quantise(
                        kind, storage, tile, col_amax, half, nrows, width, y1, s1, y2, s2, bi, row0, col0,
                        s2_row, slot, scale_alg, fmt_args,
                    )  # fmt: skip

    return kernel
