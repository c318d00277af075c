"""Scale layout conversions: from Ascend's paired layout to plain and to cuBLAS "blocked" layouts.

The operator writes E8M0 scales in Ascend's paired layout (``shared/spec/swiglu_backward_mx_quant.md`` 4):

- ``mxscale1 [..., M, C/64, 2]``: row-wise (32 columns per block); the flat row is block order.
- ``mxscale2 [R, C, 2]``: column-wise (32 rows per block); block ``t`` of group ``g`` (rows restart at the
  group start ``gs``) sits at row ``gs // 64 + g + t // 2``, slot ``t % 2``.

Plain layouts (one scale per block, blocks in natural order):

- :func:`mxscale1_to_plain`: ``[..., M, C/32]`` (a view).
- :func:`mxscale2_to_plain`: ``[blocks, C]``, the groups' blocks concatenated in group order
  (group ``g`` has ``ceil(n_g / 32)`` blocks; without groups ``ceil(M / 32)``).

Blocked layout (what cuBLAS / tcgen05 MX GEMMs read, e.g. ``torch._scaled_mm`` with ``float8_e8m0fnu``
scales): the scale matrix ``[rows, cols]`` (rows = the GEMM's M or N, cols = K / 32) is zero-padded to
multiples of ``[128, 4]`` and cut into 128x4 tiles, stored one after the other in row-major tile order; in
a 512-byte tile the scale at tile row ``r`` and column ``c`` is at byte ``(r % 32) * 16 + (r // 32) * 4 + c``
(cuBLAS "1D block scaling factors layout"; torchao ``to_blocked``). Every blocked result here is a 2-D
``[padded rows, padded cols]`` tensor whose *memory* is that layout: ``.flatten()`` is torchao's
``to_blocked`` output.

- :func:`to_blocked`: any 2-D scale matrix.
- :func:`mxscale1_to_blocked`: row-wise scales for the dgrad GEMM (K = the 2H columns). With groups, each
  group's rows are blocked separately and stacked, each padded to 128 rows (torchao's "M groups" layout).
- :func:`mxscale2_to_blocked`: token-axis scales for the wgrad GEMM, whose operand is ``y2[group].T``
  (``[C, n_g]``, K = the group's tokens), so each group's ``[C, blocks_g]`` matrix is blocked separately and
  the groups sit side by side, each padded to 4 columns (torchao's "K groups" layout).

Helpers that take ``group_index`` read its values on the host (one device-to-host copy for CUDA tensors).
Inputs may be ``float8_e8m0fnu`` or ``uint8``; outputs keep the input's dtype and device. Padding is code 0.
"""

from __future__ import annotations

import torch

from . import mx

__all__ = [
    "to_blocked",
    "mxscale1_to_plain",
    "mxscale2_to_plain",
    "mxscale1_to_blocked",
    "mxscale2_to_blocked",
]

_TILE_ROWS, _TILE_COLS = 128, 4


def _ceil_to(n: int, k: int) -> int:
    return -(-n // k) * k


def _check_scales(name: str, scales, rank: int | None = None) -> None:
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scales).__name__}")
    if scales.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"{name} must be float8_e8m0fnu or uint8 codes, got {scales.dtype}")
    if rank is not None and scales.dim() != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tuple(scales.shape)}")


def _block_groups(group_index, num_rows: int):
    """``mx.column_block_groups`` (group row ranges and mxscale2 bases) after checking ``group_index``."""
    if group_index is not None and (
        not isinstance(group_index, torch.Tensor) or group_index.dim() != 1 or group_index.numel() < 1
    ):
        raise ValueError("group_index must be a non-empty 1-D tensor of cumulative row ends")
    return mx.column_block_groups(group_index, num_rows)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """The cuBLAS blocked (128x4-tile swizzled) layout of a 2-D scale matrix ``[rows, cols]``.

    Returns ``[ceil(rows/128)*128, ceil(cols/4)*4]`` whose memory is the blocked layout (see module doc).
    """
    _check_scales("scales", scales, rank=2)
    rows, cols = scales.shape
    prows, pcols = _ceil_to(rows, _TILE_ROWS), _ceil_to(cols, _TILE_COLS)
    padded = scales.new_zeros((prows, pcols), dtype=torch.uint8)
    padded[:rows, :cols] = scales.view(torch.uint8)
    tiles = padded.view(prows // 128, 128, pcols // 4, 4).permute(0, 2, 1, 3)  # [tile r, tile c, 128, 4]
    # Tile row r = 32 * i + j goes to byte 16 * j + 4 * i + c: [.., i, j, c] -> [.., j, i, c].
    swizzled = tiles.reshape(prows // 128, pcols // 4, 4, 32, 4).transpose(2, 3)
    return swizzled.reshape(prows, pcols).view(scales.dtype)


def mxscale1_to_plain(mxscale1: torch.Tensor) -> torch.Tensor:
    """Row-wise scales ``[..., M, C/64, 2]`` -> ``[..., M, C/32]`` (a view: the pairs are in block order)."""
    _check_scales("mxscale1", mxscale1)
    if mxscale1.dim() < 3 or mxscale1.shape[-1] != 2:
        raise ValueError(f"mxscale1 must have shape [..., M, C/64, 2], got {tuple(mxscale1.shape)}")
    return mxscale1.flatten(-2)


def mxscale2_to_plain(mxscale2: torch.Tensor, num_rows: int, group_index=None) -> torch.Tensor:
    """Column-wise scales ``[R, C, 2]`` -> ``[blocks, C]``, the groups' blocks concatenated in group order.

    Args:
        mxscale2: from an x of ``num_rows`` (M) rows; 2-D x only (no batch dims).
        num_rows: M.
        group_index: the cumulative row ends that produced ``mxscale2`` (None: one group of M rows).
    """
    _check_scales("mxscale2", mxscale2, rank=3)
    r, c, pair = mxscale2.shape
    g = None if group_index is None else group_index.numel()
    if pair != 2 or r != mx.mxscale2_rows(num_rows, g):
        raise ValueError(
            f"mxscale2 must have shape [{mx.mxscale2_rows(num_rows, g)}, C, 2] for "
            f"M = {num_rows} and {g or 'no'} groups, got {tuple(mxscale2.shape)}"
        )
    slots = mxscale2.movedim(-1, -2).reshape(2 * r, c)  # slot 2 * row + s: one 32-row block
    ranges, bases = _block_groups(group_index, num_rows)
    parts = [
        slots[2 * base : 2 * base + -(-(e - s) // mx.BLOCK)]
        for (s, e), base in zip(ranges, bases, strict=True)
    ]
    return torch.cat(parts)


def mxscale1_to_blocked(mxscale1: torch.Tensor, group_index=None) -> torch.Tensor:
    """Row-wise scales -> blocked layout for the dgrad GEMM (rows = tokens, K = the C columns).

    Without groups, leading dims are flattened into rows: ``[ceil(rows/128)*128, ceil(C/32/4)*4]``. With
    ``group_index`` (2-D x only), each group's rows are blocked on their own and stacked in group order:
    ``[sum_g ceil(n_g/128)*128, ceil(C/32/4)*4]`` (empty groups take no rows).
    """
    plain = mxscale1_to_plain(mxscale1)
    if group_index is None:
        return to_blocked(plain.reshape(-1, plain.shape[-1]))
    if plain.dim() != 2:
        raise ValueError("group_index is only supported with 2-D x (mxscale1 of rank 3)")
    ranges, _ = _block_groups(group_index, plain.shape[0])
    empty = plain.new_empty((0, _ceil_to(plain.shape[1], _TILE_COLS)))
    return torch.cat([empty, *(to_blocked(plain[s:e]) for s, e in ranges if e > s)])


def mxscale2_to_blocked(mxscale2: torch.Tensor, num_rows: int, group_index=None) -> torch.Tensor:
    """Token-axis scales -> blocked layout for the wgrad GEMM (operand ``y2[group].T``: rows = C, K = tokens).

    Each group's plain ``[blocks_g, C]`` scales, transposed to ``[C, blocks_g]``, are blocked on their own;
    the groups sit side by side: ``[ceil(C/128)*128, sum_g ceil(blocks_g/4)*4]`` (empty groups: no columns).
    """
    plain = mxscale2_to_plain(mxscale2, num_rows, group_index)
    counts = [-(-(e - s) // mx.BLOCK) for s, e in _block_groups(group_index, num_rows)[0]]
    empty = plain.new_empty((_ceil_to(plain.shape[1], _TILE_ROWS), 0))
    return torch.cat([empty, *(to_blocked(p.t()) for p in plain.split(counts) if p.shape[0] > 0)], dim=1)
