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
from ._numerics import (
    FP32,
    SOURCE_TAG,
    bits_from_f32,
    exp_f32,
    fp8_encode,
    narrow,
    scale_code,
    scale_reciprocal,
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
    s = _ONE / (_ONE + exp_f32(-a))
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


@functools.cache
def mx_quant_kernel(kind: int, fmt: mx.FP8Format):
    """The compiled kernel for one storage kind (``_numerics.BF16``/``FP16``/``FP32``) and FP8 format,
    closure constants so that Numba compiles (and caches on disk) one branch-free kernel per combination
    that is used, with the format's shifts and limits folded in."""
    emax, mbits, bias, max_code = fmt.emax, fmt.mbits, fmt.bias, fmt.max_code
    inv_max = np.float32(fmt.inv_max)
    sub_magic = (1 - bias - mbits + 23 + 127) << 23  # fp32 bits of 2**(emin - mbits + 23)
    storage = np.uint32 if kind == FP32 else np.uint16
    mag_mask = storage(0x7FFFFFFF if kind == FP32 else 0x7FFF)

    source_tag = SOURCE_TAG

    @njit(parallel=True, cache=True, error_model="numpy")
    def kernel(x, dy, blocks, activate_left, scale_alg, y1, s1, y2, s2):
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
            col_recip = np.empty(CHUNK, dtype=np.float32)

            # Stage 1: SwiGLU backward, rounded to x's dtype, and the column amax. Loops index row slices
            # from 0 so that LLVM sees unit-stride, non-negative indices and vectorises them.
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

            for half in range(2):
                col0 = (a_col if half == 0 else b_col) + j0
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

    return kernel
