"""Stage 2 of both dual-axis MX operators: the quantisation of a stage-1 result along both axes into
Ascend's paired layouts (``swiglu_backward_mx_quant.md`` 4 and ``swiglu_mx_quant.md`` 4), readably.

The numeric rules (scales, element codes, packing, group clamping, row bases) come from
:mod:`swiglu_ops.numerics.mx`; this module only walks the blocks:

- -1 axis: 32 consecutive columns per block, from column 0; the row is zero padded to a whole number of
  64-column pairs, so a partial last block takes its scale from its real columns and an odd block count
  leaves a pad slot computed from zeros (code 0).
- -2 axis: 32 consecutive rows of a group per block, restarting at every group start, zero padded.
"""

from __future__ import annotations

import torch

from ...numerics import mx


def quantize_rowwise(values: torch.Tensor, fmt: mx.ElementFormat, scale_alg: int, round_mode: str):
    """-1 axis. Returns (element codes ``[.., M, C]``, scale codes ``[.., M, 2 * ceil(C / 64)]``)."""
    *lead, c = values.shape
    width = mx.BLOCK * mx.mxscale1_slots(c)
    padded = torch.zeros(*lead, width, dtype=values.dtype, device=values.device)
    padded[..., :c] = values
    blocks = padded.reshape(*lead, width // mx.BLOCK, mx.BLOCK)
    y, codes = mx.quantize_blocks(blocks, -1, fmt, scale_alg, round_mode)
    return y.reshape(*lead, width)[..., :c], codes


def quantize_colwise(
    values2d: torch.Tensor, ranges, bases, fmt: mx.ElementFormat, scale_alg: int, round_mode, rows: int
):
    """-2 axis for one [M, C] slice: 32-row blocks restarting at every group start, zero padded.

    Returns (element codes [M, C], mxscale2 codes [rows, C, 2]); rows outside every group stay 0 and unused
    scale slots stay 0.
    """
    m, c = values2d.shape
    y2 = torch.zeros(m, c, dtype=torch.uint8, device=values2d.device)
    slots = torch.zeros(2 * rows, c, dtype=torch.int64, device=values2d.device)  # slot 2r+s -> [r, :, s]
    for (start, end), base in zip(ranges, bases, strict=True):
        n = end - start
        if n <= 0:
            continue
        nblk = -(-n // mx.BLOCK)
        padded = torch.zeros(nblk * mx.BLOCK, c, dtype=values2d.dtype, device=values2d.device)
        padded[:n] = values2d[start:end]
        y, codes = mx.quantize_blocks(padded.reshape(nblk, mx.BLOCK, c), 1, fmt, scale_alg, round_mode)
        y2[start:end] = y.reshape(nblk * mx.BLOCK, c)[:n]
        slots[2 * base : 2 * base + nblk] = codes
    return y2, slots.reshape(rows, 2, c).transpose(1, 2)


def _store(codes: torch.Tensor, fmt: mx.ElementFormat) -> torch.Tensor:
    """Element codes as stored: FP8 one byte each, FP4 two per byte
    (:func:`swiglu_ops.numerics.mx.pack_fp4`)."""
    return mx.pack_fp4(codes) if fmt.packed else codes


def quantize_dual_axis(
    values, group_ends, fmt, scale_alg, round_mode, y1, s1, y2, s2, transpose_y2=False
) -> None:
    """Quantise ``values`` [B, M, C] (the stage-1 result in x's dtype) along both axes into the outputs of
    the kernel contracts (``docs/design.md``): ``y1``/``y2`` [B, M, C] or [B, M, C/2]
    (FP4) uint8 (``y2`` [B, C, M] with ``transpose_y2``, FP8 only), ``s1`` [B, M, 2 * ceil(C/64)], ``s2`` [B,
    R, C, 2] (written whole: the slots that no 32-row block maps to are 0).

    ``group_ends`` (cumulative row ends, B == 1) or None; each end is clamped into [previous end, M], and
    rows past the last end belong to no group: all their outputs are 0.
    """
    batch, m, _ = values.shape
    rows = s2.shape[1]
    ranges, bases = mx.column_block_groups(group_ends, m)
    covered = ranges[-1][1]

    q1, c1 = quantize_rowwise(values, fmt, scale_alg, round_mode)
    q1[:, covered:] = 0
    c1[:, covered:] = 0
    y1.copy_(_store(q1, fmt))
    s1.copy_(c1)
    for b in range(batch):
        q2, c2 = quantize_colwise(values[b], ranges, bases, fmt, scale_alg, round_mode, rows)
        y2[b].copy_(q2.t() if transpose_y2 else _store(q2, fmt))
        s2[b].copy_(c2)
