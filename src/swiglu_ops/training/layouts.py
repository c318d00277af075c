"""Scale layout conversions: from Ascend's paired layout to plain and to the cuBLAS "blocked" layouts that MX
GEMMs read (``torch._scaled_mm`` / ``torch._scaled_grouped_mm``), without host synchronisation.

The operators write E8M0 scales in Ascend's paired layout (``docs/operators.md`` section 2):

- ``mxscale1 [..., M, ceil(C/64), 2]``: row-wise (32 columns per block); the flat row is block order, with
  a trailing pad slot (code 0) when ``ceil(C/32)`` is odd (the forward operator with ``N % 64 != 0``).
- ``mxscale2 [R, C, 2]``: column-wise (32 rows per block); block ``t`` of group ``g`` (rows restart at the
  group start ``gs``) sits at row ``gs // 64 + g + t // 2``, slot ``t % 2``.

**Blocked layout** (cuBLAS "1D block scaling factors layout", torchao ``to_blocked``): the scale matrix
``[rows, cols]`` (rows = the GEMM's M or N, cols = K / 32) is zero-padded to multiples of ``[128, 4]`` and cut
into 128x4 tiles stored one after the other in row-major tile order; in a 512-byte tile the scale at tile row
``r`` and column ``c`` is at byte ``(r % 32) * 16 + (r // 32) * 4 + c``. Every blocked result here is a 2-D
tensor whose *memory* is the layout (``.flatten()`` is what the GEMM reads).

**Groups** (``group_index`` = the MX operators' cumulative row ends, PyTorch's ``offs``):

- :func:`mxscale1_to_blocked` with groups: "M groups", the dgrad GEMM's ``A`` operand (``y1``, groups
  along its rows): each group's ``[n_g, C/32]`` scales blocked on their own, padded to 128 rows, stacked in
  group order (torchao ``torch_to_blocked_2d_M_groups``; PyTorch's 2d-3d MXFP8 grouped GEMM test).
- :func:`mxscale2_to_blocked` with groups: "K groups", the wgrad GEMM's operand ``y2[group].T``
  (``[C, n_g]``, K = the group's tokens): each group's ``[C, ceil(n_g/32)]`` scales blocked on their own and
  the groups' tiles stored **one group after another** (all of group 0's tiles, then group 1's, ...), each
  group padded to 4 scale columns (torchao ``torch_to_blocked_2d_K_groups``; PyTorch's 2d-2d test, whose
  per-group ``to_blocked`` outputs are concatenated flat). Not side by side: that would interleave the
  groups row by row.

**No host synchronisation.** Group sizes are device values, so results are sized from upper bounds (as
torchao does) and filled by gathers: with ``G`` groups and ``M`` rows the M-groups result has
``128 * (ceil(M/128) + G - 1)`` rows and the K-groups result ``4 * (ceil(M/128) + G - 1)`` columns (both
exact for one group), the groups' data first and zeros after; a group starts where the previous one's padded
tiles end, which is how the GEMMs locate it from ``offs``. Shapes depend only on input shapes and ``G``, so
every helper also works inside ``torch.compile`` (as a custom op: Inductor has no ``float8_e8m0fnu``
kernels). Group ends on a CPU tensor are checked like the operators check them (non-decreasing, >= 0, last
== M); on a device tensor each end is clamped into [previous end, M], as the kernels do.

Inputs may be ``float8_e8m0fnu`` or ``uint8``; outputs keep the input's dtype and device. Padding is code 0.
"""

from __future__ import annotations

import torch

from ..numerics import mx
from ..ops import validate as V

__all__ = [
    "to_blocked",
    "mxscale1_to_plain",
    "mxscale2_to_plain",
    "mxscale1_to_blocked",
    "mxscale2_to_blocked",
    "blocked_tiles_bound",
]

_TILE_ROWS, _TILE_COLS = 128, 4
_DEVICES = ("cpu", "cuda")


def _ceil_div(n: int, k: int) -> int:
    return -(-n // k)


def _ceil_to(n: int, k: int) -> int:
    return _ceil_div(n, k) * k


def blocked_tiles_bound(num_rows: int, num_groups: int | None) -> int:
    """Upper bound of ``sum_g ceil(n_g / 128)`` for groups of ``num_rows`` rows in all:
    ``ceil(M/128) + G - 1`` (exact for one group; ``ceil(M/128)`` without groups). The M-groups result has
    128 times as many rows, the K-groups result 4 times as many scale columns."""
    return _ceil_div(num_rows, 128) + (num_groups or 1) - 1


def _check_scales(name: str, scales, rank: int | None = None) -> None:
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scales).__name__}")
    if scales.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"{name} must be float8_e8m0fnu or uint8 codes, got {scales.dtype}")
    if rank is not None and scales.dim() != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tuple(scales.shape)}")


def _check_groups(group_index, scales: torch.Tensor, num_rows: int) -> None:
    """The operators' rules for cumulative row ends (one place: :mod:`swiglu_ops.ops.validate`)."""
    if group_index is None:
        return
    V.check_group_index(group_index, V.ENDS)
    if group_index.device != scales.device:
        raise ValueError(
            f"group_index must be on the scales' device ({scales.device}), got {group_index.device}"
        )
    V.check_group_ends(group_index, num_rows)


def _group_bounds(group_index: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(starts, ends)`` int64 on the device: every end clamped into [previous end, M] (the kernels' rule;
    the identity for valid ends), without reading a value on the host."""
    ends = torch.cummax(group_index.to(torch.int64).clamp(min=0), 0).values.clamp(max=m)
    return torch.cat([ends.new_zeros(1), ends[:-1]]), ends


def _locate(sizes: torch.Tensor, used: torch.Tensor, index: torch.Tensor):
    """Positions ``index`` in consecutive segments of ``sizes`` of which the first ``used`` positions hold
    data: the segment of each position (clamped to a real one), the offset inside it, and whether it holds
    data (False past the last segment too)."""
    ends = torch.cumsum(sizes, 0)
    seg = torch.searchsorted(ends, index, right=True)
    inside = seg < sizes.numel()
    seg = seg.clamp(max=sizes.numel() - 1)
    local = index - (ends - sizes)[seg]
    return seg, local, inside & (local < used[seg])


def _column_slots(mxscale2: torch.Tensor) -> torch.Tensor:
    """``[R, C, 2]`` -> ``[2R, C]`` uint8: slot ``2 * row + s`` is one 32-row block."""
    r, c, _ = mxscale2.shape
    return mxscale2.view(torch.uint8).movedim(-1, -2).reshape(2 * r, c)


def _column_blocks(group_index, m: int):
    """Per group: first mxscale2 slot ``2 * (start // 64 + g)`` and block count ``ceil(n_g / 32)``."""
    starts, ends = _group_bounds(group_index, m)
    g = torch.arange(starts.numel(), device=starts.device)
    return 2 * (starts // 64 + g), (ends - starts + mx.BLOCK - 1) // mx.BLOCK


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _via_op(**tensors) -> bool:
    """Whether a helper runs as its custom op: inside torch.compile, or for tensors that torch must dispatch
    (fake, meta, subclasses such as DTensor, an active dispatch mode; the operators' gate,
    :func:`swiglu_ops.ops.validate.needs_dispatch`), whose own rules then apply (e.g. DTensor's sharding
    strategies) instead of plain tensors the helper would create beside them."""
    return _compiling() or V.needs_dispatch(tensors)


# ------------------------------------------------------------------------------------------------ API


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """The cuBLAS blocked (128x4-tile swizzled) layout of a 2-D scale matrix ``[rows, cols]``.

    Returns ``[ceil(rows/128)*128, ceil(cols/4)*4]`` whose memory is the blocked layout (see module doc).
    """
    if _compiling():
        return torch.ops.swiglu_ops.to_blocked(scales)
    _check_scales("scales", scales, rank=2)
    return _to_blocked(scales.view(torch.uint8)).view(scales.dtype)


def _to_blocked(codes: torch.Tensor) -> torch.Tensor:
    rows, cols = codes.shape
    prows, pcols = _ceil_to(rows, _TILE_ROWS), _ceil_to(cols, _TILE_COLS)
    padded = codes
    if (prows, pcols) != (rows, cols):
        padded = codes.new_zeros((prows, pcols))
        padded[:rows, :cols] = codes
    tiles = padded.view(prows // 128, 128, pcols // 4, 4).permute(0, 2, 1, 3)  # [tile r, tile c, 128, 4]
    # Tile row r = 32 * i + j goes to byte 16 * j + 4 * i + c: [.., i, j, c] -> [.., j, i, c].
    swizzled = tiles.reshape(prows // 128, pcols // 4, 4, 32, 4).transpose(2, 3)
    return swizzled.reshape(prows, pcols)


def mxscale1_to_plain(mxscale1: torch.Tensor, num_cols: int | None = None) -> torch.Tensor:
    """Row-wise scales ``[..., M, ceil(C/64), 2]`` -> ``[..., M, 2*ceil(C/64)]`` (a view: the pairs are in
    block order). With ``num_cols`` (the quantised row length C, or N of the forward operator) the trailing
    pad slot is dropped: ``[..., M, ceil(C/32)]``."""
    _check_scales("mxscale1", mxscale1)
    if mxscale1.dim() < 3 or mxscale1.shape[-1] != 2:
        raise ValueError(f"mxscale1 must have shape [..., M, C/64, 2], got {tuple(mxscale1.shape)}")
    plain = mxscale1.flatten(-2)
    if num_cols is None:
        return plain
    if isinstance(num_cols, bool) or not isinstance(num_cols, int) or num_cols < 1:
        raise ValueError(f"num_cols must be a positive int (the quantised row length), got {num_cols!r}")
    if mx.mxscale1_slots(num_cols) != plain.shape[-1]:
        raise ValueError(
            f"num_cols = {num_cols} needs {mx.mxscale1_slots(num_cols) // 2} scale pairs per row, "
            f"mxscale1 has {mxscale1.shape[-2]}"
        )
    return plain[..., : _ceil_div(num_cols, mx.BLOCK)]


def _check_mxscale2(mxscale2, num_rows, group_index) -> None:
    _check_scales("mxscale2", mxscale2, rank=3)
    if isinstance(num_rows, bool) or not isinstance(num_rows, (int, torch.SymInt)):
        raise TypeError(f"num_rows must be the operator's row count M (an int >= 0), got {num_rows!r}")
    if num_rows < 0:
        raise ValueError(f"num_rows must be the operator's row count M (an int >= 0), got {num_rows!r}")
    r, _, pair = mxscale2.shape
    if group_index is not None and not isinstance(group_index, torch.Tensor):
        V.check_group_index(group_index, V.ENDS)  # the TypeError naming the convention
    g = None if group_index is None else group_index.numel()
    if pair != 2 or r != mx.mxscale2_rows(num_rows, g):
        hint = (
            " (scales of grouped outputs need the group_index that produced them)"
            if g is None and r != mx.mxscale2_rows(num_rows, None)
            else ""
        )
        raise ValueError(
            f"mxscale2 must have shape [{mx.mxscale2_rows(num_rows, g)}, C, 2] for M = {num_rows} and "
            f"{g or 'no'} groups, got {tuple(mxscale2.shape)}{hint}"
        )
    _check_groups(group_index, mxscale2, num_rows)


def mxscale2_to_plain(mxscale2: torch.Tensor, num_rows: int, group_index=None) -> torch.Tensor:
    """Column-wise scales ``[R, C, 2]`` -> ``[P, C]``: the groups' 32-row blocks concatenated in group order
    (group ``g`` has ``ceil(n_g / 32)`` blocks), then zero rows. ``P = ceil(M/32) + G - 1``, an upper bound
    of the block count (exact for one group and without groups), so no value is read on the host.

    Args:
        mxscale2: from an x of ``num_rows`` (M) rows; 2-D x only (no batch dims).
        num_rows: M.
        group_index: the cumulative row ends that produced ``mxscale2`` (None: one group of M rows).
    """
    if _via_op(mxscale2=mxscale2, group_index=group_index):
        return torch.ops.swiglu_ops.mxscale2_to_plain(mxscale2, num_rows, group_index)
    _check_mxscale2(mxscale2, num_rows, group_index)
    slots = _column_slots(mxscale2)
    rows = _ceil_div(num_rows, mx.BLOCK)
    if group_index is None:
        return slots[:rows].clone().view(mxscale2.dtype)
    first, blocks = _column_blocks(group_index, num_rows)
    bound = rows + group_index.numel() - 1
    grp, local, valid = _locate(blocks, blocks, torch.arange(bound, device=slots.device))
    src = (first[grp] + local).clamp(0, slots.shape[0] - 1)
    plain = torch.where(valid[:, None], slots.index_select(0, src), 0)
    return plain.view(mxscale2.dtype)


def mxscale1_to_blocked(mxscale1: torch.Tensor, group_index=None) -> torch.Tensor:
    """Row-wise scales -> blocked layout for the dgrad GEMM (rows = tokens, K = the C columns).

    Without groups, leading dims are flattened into rows: ``[ceil(rows/128)*128, ceil(K/4)*4]`` with
    ``K = 2*ceil(C/64)`` scale slots (a pad slot is code 0, like the padding, so the result is the same as
    for the ``ceil(C/32)`` real blocks). With ``group_index`` (2-D x only): "M groups", each group's rows
    blocked on their own and padded to 128 rows, stacked in group order (empty groups take no rows), in a
    ``[128 * (ceil(M/128) + G - 1), ceil(K/4)*4]`` result whose rows past the last group are zero.
    """
    if _via_op(mxscale1=mxscale1, group_index=group_index):
        return torch.ops.swiglu_ops.mxscale1_to_blocked(mxscale1, group_index)
    plain = mxscale1_to_plain(mxscale1).view(torch.uint8)
    if group_index is None:
        return _to_blocked(plain.reshape(-1, plain.shape[-1])).view(mxscale1.dtype)
    if plain.dim() != 2:
        raise ValueError("group_index is only supported with 2-D x (mxscale1 of rank 3)")
    m, k = plain.shape
    _check_groups(group_index, mxscale1, m)
    rows = 128 * blocked_tiles_bound(m, group_index.numel())
    if m == 0:
        return plain.new_zeros((rows, _ceil_to(k, _TILE_COLS))).view(mxscale1.dtype)
    starts, ends = _group_bounds(group_index, m)
    padded = (ends - starts + 127) // 128 * 128  # each group's rows padded to whole tiles
    grp, local, valid = _locate(padded, ends - starts, torch.arange(rows, device=plain.device))
    src = (starts[grp] + local).clamp(0, m - 1)
    stacked = torch.where(valid[:, None], plain.index_select(0, src), 0)  # groups start at multiples of 128
    return _to_blocked(stacked).view(mxscale1.dtype)


def mxscale2_to_blocked(mxscale2: torch.Tensor, num_rows: int, group_index=None) -> torch.Tensor:
    """Token-axis scales -> blocked layout for the wgrad GEMM (operand ``y2[group].T``: rows = C, K = tokens).

    Without groups: ``to_blocked`` of the ``[C, ceil(M/32)]`` scales. With ``group_index``: "K groups", each
    group's ``[C, ceil(n_g/32)]`` scales blocked on their own (padded to 4 columns), the groups' tiles one
    group after another in memory, in a ``[ceil(C/128)*128, 4 * (ceil(M/128) + G - 1)]`` result (zeros after
    the last group; empty groups take no tiles).
    """
    if _via_op(mxscale2=mxscale2, group_index=group_index):
        return torch.ops.swiglu_ops.mxscale2_to_blocked(mxscale2, num_rows, group_index)
    _check_mxscale2(mxscale2, num_rows, group_index)
    slots = _column_slots(mxscale2)
    c = slots.shape[1]
    if group_index is None:
        return _to_blocked(slots[: _ceil_div(num_rows, mx.BLOCK)].t()).view(mxscale2.dtype)
    g = group_index.numel()
    tiles = blocked_tiles_bound(num_rows, g)  # tile columns
    first, blocks = _column_blocks(group_index, num_rows)
    # 1. Each group's blocks padded to whole tiles (4 columns), side by side: [C, 4 * tiles], then blocked.
    width = torch.div(blocks + 3, 4, rounding_mode="floor") * 4
    grp, local, valid = _locate(width, blocks, torch.arange(4 * tiles, device=slots.device))
    src = (first[grp] + local).clamp(0, slots.shape[0] - 1)
    side_by_side = torch.where(valid[None, :], slots.index_select(0, src).t(), 0)
    blocked = _to_blocked(side_by_side)  # tiles in (tile row, tile column) order
    # 2. Reorder the tiles so that each group's (tile row, tile column) block is contiguous.
    row_tiles = _ceil_div(c, 128)
    per_group = width // 4 * row_tiles
    total = row_tiles * tiles
    grp, local, valid = _locate(per_group, per_group, torch.arange(total, device=slots.device))
    cols = (width // 4)[grp].clamp(min=1)  # the group's tile columns (>= 1 wherever valid)
    col_start = (torch.cumsum(width, 0) - width)[grp] // 4
    src_tile = ((local // cols) * tiles + col_start + local % cols).clamp(0, max(total - 1, 0))
    flat = blocked.reshape(total, 512)
    out = torch.where(valid[:, None], flat.index_select(0, src_tile), 0)
    return out.reshape(blocked.shape).view(mxscale2.dtype)


# ------------------------------------------------------------------------------- custom ops (opaque)
#
# Inside torch.compile the helpers above become these ops: one opaque node each, whose real kernel is the
# eager function. Inductor cannot generate code that reads or writes float8_e8m0fnu tensors, and every output
# shape here is a function of input shapes (and the number of groups) only, so a fake kernel exists.


@torch.library.custom_op(
    "swiglu_ops::to_blocked", mutates_args=(), device_types=_DEVICES, schema="(Tensor scales) -> Tensor"
)
def _to_blocked_op(scales):
    """See :func:`swiglu_ops.layouts.to_blocked`."""
    return to_blocked(scales)


@_to_blocked_op.register_fake
def _to_blocked_fake(scales):
    _check_scales("scales", scales, rank=2)
    rows, cols = scales.shape
    return scales.new_empty((_ceil_to(rows, 128), _ceil_to(cols, 4)))


@torch.library.custom_op(
    "swiglu_ops::mxscale1_to_blocked",
    mutates_args=(),
    device_types=_DEVICES,
    schema="(Tensor mxscale1, Tensor? group_index=None) -> Tensor",
)
def _mxscale1_to_blocked_op(mxscale1, group_index=None):
    """See :func:`swiglu_ops.layouts.mxscale1_to_blocked`."""
    return mxscale1_to_blocked(mxscale1, group_index)


@_mxscale1_to_blocked_op.register_fake
def _mxscale1_to_blocked_fake(mxscale1, group_index=None):
    plain = mxscale1_to_plain(mxscale1)
    cols = _ceil_to(plain.shape[-1], 4)
    if group_index is None:
        return mxscale1.new_empty((_ceil_to(plain.numel() // plain.shape[-1], 128), cols))
    if plain.dim() != 2:
        raise ValueError("group_index is only supported with 2-D x (mxscale1 of rank 3)")
    _check_groups(group_index, mxscale1, plain.shape[0])
    return mxscale1.new_empty((128 * blocked_tiles_bound(plain.shape[0], group_index.numel()), cols))


_MXSCALE2_SCHEMA = "(Tensor mxscale2, SymInt num_rows, Tensor? group_index=None) -> Tensor"


@torch.library.custom_op(
    "swiglu_ops::mxscale2_to_blocked", mutates_args=(), device_types=_DEVICES, schema=_MXSCALE2_SCHEMA
)
def _mxscale2_to_blocked_op(mxscale2, num_rows, group_index=None):
    """See :func:`swiglu_ops.layouts.mxscale2_to_blocked`."""
    return mxscale2_to_blocked(mxscale2, num_rows, group_index)


@_mxscale2_to_blocked_op.register_fake
def _mxscale2_to_blocked_fake(mxscale2, num_rows, group_index=None):
    _check_mxscale2(mxscale2, num_rows, group_index)
    g = None if group_index is None else group_index.numel()
    tiles = blocked_tiles_bound(num_rows, g)
    return mxscale2.new_empty((_ceil_to(mxscale2.shape[1], 128), 4 * tiles))


@torch.library.custom_op(
    "swiglu_ops::mxscale2_to_plain", mutates_args=(), device_types=_DEVICES, schema=_MXSCALE2_SCHEMA
)
def _mxscale2_to_plain_op(mxscale2, num_rows, group_index=None):
    """See :func:`swiglu_ops.layouts.mxscale2_to_plain`."""
    return mxscale2_to_plain(mxscale2, num_rows, group_index)


@_mxscale2_to_plain_op.register_fake
def _mxscale2_to_plain_fake(mxscale2, num_rows, group_index=None):
    _check_mxscale2(mxscale2, num_rows, group_index)
    g = 1 if group_index is None else group_index.numel()
    return mxscale2.new_empty((-(-num_rows // 32) + g - 1, mxscale2.shape[1]))
