"""Scale layout helpers: plain layouts checked through dequantisation, blocked layouts against an independent
loop implementation of the published rules, and no host synchronisation.

Published description (cuBLAS "1D block scaling factors layout"; TransformerEngine "Swizzling scaling
factors"; torchao ``to_blocked``): pad the scale matrix to multiples of [128, 4], cut it into 128x4 tiles
stored one after the other in row-major tile order; inside a 512-byte tile, the scale at tile row r, column c
is at byte (r % 32) * 16 + (r // 32) * 4 + c (rows in the order 0, 32, 64, 96, 1, 33, ...).

Grouped GEMMs (PyTorch's MXFP8 grouped GEMM tests, torchao ``torch_to_blocked_2d_M_groups`` /
``torch_to_blocked_2d_K_groups``): every group's scales are blocked on their own and the groups' blocked
bytes follow one another in memory; for M groups (dgrad, groups along the rows) that stacks 128-row padded
blocks, for K groups (wgrad, groups along the contraction) each group's ``[C, blocks_g]`` tiles are
contiguous (not side by side).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import swiglu_ops
from swiglu_ops import layouts
from swiglu_ops.numerics import mx


def blocked_by_loops(scales: torch.Tensor) -> list[int]:
    """The blocked layout of a [rows, cols] code matrix, written from the description with explicit loops."""
    rows, cols = scales.shape
    prows, pcols = -(-rows // 128) * 128, -(-cols // 4) * 4
    tiles_per_row = pcols // 4
    out = [0] * (prows * pcols)
    codes = scales.view(torch.uint8).tolist()
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_per_row + c // 4
            rr, cc = r % 128, c % 4
            out[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc] = codes[r][c]
    return out


def random_codes(rows, cols, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, cols), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("shape", [(1, 1), (128, 4), (130, 5), (257, 9), (64, 12)])
def test_to_blocked_matches_loop_implementation(shape):
    scales = random_codes(*shape)
    blocked = swiglu_ops.layouts.to_blocked(scales)
    assert blocked.dtype == torch.float8_e8m0fnu
    assert blocked.shape == (-(-shape[0] // 128) * 128, -(-shape[1] // 4) * 4)
    assert blocked.view(torch.uint8).flatten().tolist() == blocked_by_loops(scales)


def test_to_blocked_tile_order_is_the_published_one():
    # Scale at (r, c) = r, for one 128x4 tile: bytes 0..15 hold rows 0, 32, 64, 96 (4 columns each), then 1...
    scales = torch.arange(128, dtype=torch.uint8).repeat_interleave(4).reshape(128, 4)
    flat = swiglu_ops.layouts.to_blocked(scales).flatten().tolist()
    assert flat[:20] == [0] * 4 + [32] * 4 + [64] * 4 + [96] * 4 + [1] * 4
    assert flat[-4:] == [127] * 4
    # Two tiles side by side: the second 512 bytes hold columns 4..7 (row-major tile order).
    wide = torch.arange(8, dtype=torch.uint8).repeat(128, 1)
    assert swiglu_ops.layouts.to_blocked(wide).flatten()[512:516].tolist() == [4, 5, 6, 7]


def quantised(m, c, group_index, dtype=torch.bfloat16, seed=0):
    """Op outputs for data whose block scales vary along both axes (so a wrong block index shows)."""
    gen = torch.Generator().manual_seed(seed)
    rows = 2.0 ** (torch.arange(m) % 23 - 11).reshape(m, 1)
    cols = 2.0 ** (torch.arange(c) // 32 % 5).reshape(1, c)
    x = (torch.randn(m, c, generator=gen) * rows * cols).to(dtype)
    dy = torch.randn(m, c // 2, generator=gen).to(dtype)
    return swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, group_index, backend="reference")


def dequant_with(data: torch.Tensor, per_element_codes: torch.Tensor) -> torch.Tensor:
    vals = mx.fp8_decode(data.view(torch.uint8), mx.fp8_format(data.dtype)).double()
    return vals * torch.pow(2.0, per_element_codes.view(torch.uint8).double() - 127)


def test_mxscale1_to_plain_is_block_order():
    y1, s1, _, _ = quantised(70, 128, None)
    plain = swiglu_ops.layouts.mxscale1_to_plain(s1)
    assert plain.shape == (70, 4) and plain.dtype == torch.float8_e8m0fnu
    assert plain.data_ptr() == s1.data_ptr()  # a view
    expected = swiglu_ops.mx_dequantize(y1, s1, axis=-1, dtype=torch.float64)
    torch.testing.assert_close(
        dequant_with(y1, plain.repeat_interleave(32, dim=-1)), expected, rtol=0, atol=0
    )


def group_ranges(m, ends):
    return [(0, m)] if ends is None else list(zip([0, *ends[:-1]], ends, strict=True))


def column_blocks_by_loops(s2: torch.Tensor, m: int, ends) -> list[list[list[int]]]:
    """Per group, its token-axis block scales ``[blocks_g][C]`` read from Ascend's paired layout with the
    published rule: block t of group g (start gs) is at row gs // 64 + g + t // 2, slot t % 2."""
    codes = s2.view(torch.uint8).tolist()
    groups = []
    for g, (s, e) in enumerate(group_ranges(m, ends)):
        base = s // 64 + (0 if ends is None else g)
        groups.append([[row[(t % 2)] for row in codes[base + t // 2]] for t in range(-(-(e - s) // 32))])
    return groups


@pytest.mark.parametrize(
    ("m", "ends"),
    [(70, None), (64, None), (33, None), (100, [30, 30, 100]), (200, [64, 65, 130, 200]), (5, [0, 5])],
)
def test_mxscale2_to_plain_concatenates_group_blocks(m, ends):
    gi = None if ends is None else torch.tensor(ends)
    _, _, y2, s2 = quantised(m, 64, gi)
    plain = swiglu_ops.layouts.mxscale2_to_plain(s2, m, gi)
    ranges = group_ranges(m, ends)
    blocks = sum(-(-(e - s) // 32) for s, e in ranges)
    # Upper-bound rows (no host read of the ends): ceil(M/32) + G - 1; the rows past the blocks are 0.
    assert plain.shape == (-(-m // 32) + len(ranges) - 1, 64) and plain.dtype == torch.float8_e8m0fnu
    assert not plain.view(torch.uint8)[blocks:].any()
    assert plain.view(torch.uint8)[:blocks].tolist() == [
        b for g in column_blocks_by_loops(s2, m, ends) for b in g
    ]
    # Row i of group (s, e) uses plain block (blocks before the group) + (i - s) // 32.
    block_of_row, first = [], 0
    for s, e in ranges:
        block_of_row += [first + (i - s) // 32 for i in range(s, e)]
        first += -(-(e - s) // 32)
    per_element = plain[torch.tensor(block_of_row, dtype=torch.int64)]
    expected = swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=gi, dtype=torch.float64)
    torch.testing.assert_close(dequant_with(y2, per_element), expected, rtol=0, atol=0, equal_nan=True)


def unblock_by_loops(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`blocked_by_loops` for one blocked matrix (flat memory)."""
    pcols = -(-cols // 4) * 4
    flat = blocked.view(torch.uint8).flatten().tolist()
    out = torch.zeros(rows, cols, dtype=torch.uint8)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * (pcols // 4) + c // 4
            rr, cc = r % 128, c % 4
            out[r, c] = flat[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc]
    return out


def m_groups_by_loops(plain: torch.Tensor, ends) -> list[int]:
    """The published "M groups" rule: each non-empty group's rows blocked alone, bytes one group after
    another."""
    out = []
    for s, e in group_ranges(plain.shape[0], ends):
        if e > s:
            out += blocked_by_loops(plain[s:e])
    return out


def k_groups_by_loops(groups: list[list[list[int]]]) -> list[int]:
    """The published "K groups" rule: each non-empty group's ``[C, blocks_g]`` scales blocked alone, bytes one
    group after another."""
    out = []
    for blocks in groups:
        if blocks:
            out += blocked_by_loops(torch.tensor(blocks, dtype=torch.uint8).t())
    return out


def padded_to(flat: list[int], n: int) -> list[int]:
    assert len(flat) <= n
    return flat + [0] * (n - len(flat))


# M, ends, C: empty groups (first, middle, last), ragged groups, one group, groups of whole 128-row tiles,
# more tile columns than one (C = 640 -> 20 scale columns), a group that is empty because M is.
GROUP_CASES = [
    (300, [100, 100, 300], 192),
    (300, [0, 7, 300, 300], 128),
    (256, [32, 96, 256], 640),
    (129, [129], 64),
    (512, [128, 256, 384, 512], 128),
    (70, [1, 2, 3, 70], 256),
    (64, [64], 64),
]


@pytest.mark.parametrize(("m", "ends", "c"), GROUP_CASES)
def test_mxscale1_to_blocked_m_groups_match_the_published_rule(m, ends, c):
    gi = torch.tensor(ends)
    _, s1, _, _ = quantised(m, c, gi)
    plain = swiglu_ops.layouts.mxscale1_to_plain(s1)  # [M, C/32]
    blocked = swiglu_ops.layouts.mxscale1_to_blocked(s1, gi)
    tiles = -(-m // 128) + len(ends) - 1
    assert blocked.shape == (128 * tiles, -(-(c // 32) // 4) * 4) and blocked.dtype == torch.float8_e8m0fnu
    assert blocked.view(torch.uint8).flatten().tolist() == padded_to(
        m_groups_by_loops(plain, ends), blocked.numel()
    )
    ungrouped = swiglu_ops.layouts.mxscale1_to_blocked(s1)
    assert ungrouped.flatten().view(torch.uint8).tolist() == blocked_by_loops(plain)


@pytest.mark.parametrize(("m", "ends", "c"), GROUP_CASES)
def test_mxscale2_to_blocked_k_groups_are_contiguous_per_group(m, ends, c):
    gi = torch.tensor(ends)
    _, _, _, s2 = quantised(m, c, gi)
    blocked = swiglu_ops.layouts.mxscale2_to_blocked(s2, m, gi)
    tiles = -(-m // 128) + len(ends) - 1
    assert blocked.shape == (-(-c // 128) * 128, 4 * tiles) and blocked.dtype == torch.float8_e8m0fnu
    expected = k_groups_by_loops(column_blocks_by_loops(s2, m, ends))
    assert blocked.view(torch.uint8).flatten().tolist() == padded_to(expected, blocked.numel())


def test_k_groups_are_not_side_by_side():
    # Two groups and C > 32: concatenating the groups' blocked matrices along the columns (the layout before
    # the fix) interleaves their bytes row by row; the GEMMs read each group's tiles contiguously.
    m, ends, c = 256, [128, 256], 192
    gi = torch.tensor(ends)
    _, _, _, s2 = quantised(m, c, gi)
    groups = column_blocks_by_loops(s2, m, ends)
    per_group = [swiglu_ops.layouts.to_blocked(torch.tensor(b, dtype=torch.uint8).t()) for b in groups]
    side_by_side = torch.cat(per_group, dim=1)
    blocked = swiglu_ops.layouts.mxscale2_to_blocked(s2, m, gi).view(torch.uint8).flatten()
    assert blocked.numel() == 3 * side_by_side.numel() // 2  # upper bound: 3 tile columns, 2 used
    used = blocked[: side_by_side.numel()]
    assert (
        torch.equal(used, torch.cat([p.flatten() for p in per_group])) and not blocked[used.numel() :].any()
    )
    assert not torch.equal(used, side_by_side.flatten())


@pytest.mark.parametrize("m", [1, 64, 70, 300])
def test_mxscale2_to_blocked_without_groups_is_to_blocked_of_the_transpose(m):
    _, _, _, s2 = quantised(m, 192, None)
    blocked = swiglu_ops.layouts.mxscale2_to_blocked(s2, m)
    blocks = column_blocks_by_loops(s2, m, None)[0]
    assert blocked.flatten().view(torch.uint8).tolist() == blocked_by_loops(
        torch.tensor(blocks, dtype=torch.uint8).t()
    )


@pytest.mark.parametrize(
    ("n", "dst"),
    [
        (40, torch.float8_e4m3fn),
        (72, torch.float8_e5m2),
        (40, torch.float4_e2m1fn_x2),
        (96, torch.float4_e2m1fn_x2),
    ],
)
def test_forward_operator_scales(n, dst):
    """swiglu_mx_quant_dual_axis: N not a multiple of 64 leaves a pad slot (code 0) in mxscale1, FP4 packs the
    elements; the blocked scales are those of the ceil(N/32) real blocks."""
    m, ends = 150, [50, 50, 150]
    gi = torch.tensor(ends)
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(m, 2 * n, generator=gen) * 2.0 ** (torch.arange(2 * n) % 7)).bfloat16()
    _, s1, y2, s2 = swiglu_ops.swiglu_mx_quant_dual_axis(x, gi, dst_dtype=dst, backend="reference")
    real = -(-n // 32)
    plain = swiglu_ops.layouts.mxscale1_to_plain(s1, n)
    assert plain.shape == (m, real) and plain.data_ptr() == s1.data_ptr()
    assert swiglu_ops.layouts.mxscale1_to_plain(s1).shape[-1] == 2 * -(-n // 64)
    blocked = swiglu_ops.layouts.mxscale1_to_blocked(s1, gi)
    assert blocked.view(torch.uint8).flatten().tolist() == padded_to(
        m_groups_by_loops(plain, ends), blocked.numel()
    )
    assert swiglu_ops.layouts.mxscale1_to_blocked(s1).flatten().view(
        torch.uint8
    ).tolist() == blocked_by_loops(plain)
    blocked2 = swiglu_ops.layouts.mxscale2_to_blocked(s2, m, gi)
    assert blocked2.shape[0] == -(-n // 128) * 128
    expected = k_groups_by_loops(column_blocks_by_loops(s2, m, ends))
    assert blocked2.view(torch.uint8).flatten().tolist() == padded_to(expected, blocked2.numel())


def test_helpers_read_no_value_on_the_host():
    """The helpers run on meta tensors (no data: any .item() / .tolist() / bool() of a value raises), so on a
    CUDA tensor they never synchronise; shapes are the same as for real tensors."""
    m, ends, c = 300, [100, 100, 300], 192
    gi = torch.tensor(ends)
    _, s1, _, s2 = quantised(m, c, gi)
    s1m, s2m, gim = s1.to("meta"), s2.to("meta"), gi.to("meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        gim.tolist()  # what a host read would hit
    L = swiglu_ops.layouts
    assert L.mxscale1_to_blocked(s1m, gim).shape == L.mxscale1_to_blocked(s1, gi).shape
    assert L.mxscale2_to_blocked(s2m, m, gim).shape == L.mxscale2_to_blocked(s2, m, gi).shape
    assert L.mxscale2_to_plain(s2m, m, gim).shape == L.mxscale2_to_plain(s2, m, gi).shape
    assert L.to_blocked(s1m.flatten(-2)).shape == L.to_blocked(s1.flatten(-2)).shape
    assert L.mxscale1_to_blocked(s1m, gim).device.type == "meta"


def test_device_ends_are_clamped_like_the_kernels():
    """Ends whose values are not checked (device tensors) are clamped into [previous end, M] on the device,
    as the kernels do (the internal bounds, fed a CPU tensor here)."""
    starts, ends = swiglu_ops.layouts._group_bounds(torch.tensor([50, 20, 400, -3]), 300)
    assert starts.tolist() == [0, 50, 50, 300] and ends.tolist() == [50, 50, 300, 300]


def test_group_ends_are_checked_on_cpu_tensors():
    _, _, _, s2 = quantised(128, 64, torch.tensor([64, 128]))
    _, s1, _, _ = quantised(128, 64, None)
    with pytest.raises(ValueError, match=r"cumulative row ends.*look like group counts.*counts_to_ends"):
        swiglu_ops.layouts.mxscale2_to_blocked(s2, 128, torch.tensor([64, 64]))
    with pytest.raises(ValueError, match=r"group_index \(cumulative row ends\) last value"):
        swiglu_ops.layouts.mxscale1_to_blocked(s1, torch.tensor([10, 100]))
    with pytest.raises(ValueError, match="non-decreasing"):
        swiglu_ops.layouts.mxscale2_to_plain(s2, 128, torch.tensor([100, 128])[[1, 0]])


def test_layout_helpers_reject_bad_input():
    with pytest.raises(TypeError, match="scales"):
        swiglu_ops.layouts.to_blocked(torch.zeros(4, 4))
    with pytest.raises(TypeError, match="scales must be a torch.Tensor"):
        swiglu_ops.layouts.to_blocked([[0] * 4])
    with pytest.raises(ValueError, match=r"group_index \(cumulative row ends\) must be 1-D and non-empty"):
        swiglu_ops.layouts.mxscale2_to_plain(
            torch.zeros(2, 64, 2, dtype=torch.uint8), 64, torch.tensor([[64]])
        )
    with pytest.raises(ValueError, match="rank 2"):
        swiglu_ops.layouts.to_blocked(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="mxscale2 must have shape"):
        swiglu_ops.layouts.mxscale2_to_plain(torch.zeros(3, 64, 2, dtype=torch.uint8), 64)
    with pytest.raises(TypeError, match="num_rows must be the operator's row count"):
        swiglu_ops.layouts.mxscale2_to_plain(torch.zeros(1, 64, 2, dtype=torch.uint8), 64.0)
    with pytest.raises(ValueError, match="num_rows must be the operator's row count"):
        swiglu_ops.layouts.mxscale2_to_plain(torch.zeros(1, 64, 2, dtype=torch.uint8), -1)
    with pytest.raises(ValueError, match="need the group_index that produced them"):
        swiglu_ops.layouts.mxscale2_to_blocked(torch.zeros(4, 64, 2, dtype=torch.uint8), 128)
    with pytest.raises(ValueError, match="mxscale1"):
        swiglu_ops.layouts.mxscale1_to_plain(torch.zeros(4, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="num_cols"):
        swiglu_ops.layouts.mxscale1_to_plain(torch.zeros(4, 1, 2, dtype=torch.uint8), 100)
    with pytest.raises(ValueError, match="2-D"):
        swiglu_ops.layouts.mxscale1_to_blocked(torch.zeros(2, 4, 1, 2, dtype=torch.uint8), torch.tensor([4]))
    empty = layouts.mxscale1_to_blocked(torch.zeros(0, 1, 2, dtype=torch.uint8), torch.tensor([0]))
    assert empty.shape == (0, 4)


_TORCHAO_CHECK = """
import torch, swiglu_ops
from swiglu_ops import layouts
from torchao.prototype.mx_formats.utils import to_blocked
from torchao.prototype.moe_training.kernels.mxfp8.quant import (
    torch_to_blocked_2d_K_groups, torch_to_blocked_2d_M_groups)

def same(mine, theirs):  # torchao sizes with other upper bounds: the data, then zeros
    a, b = mine.view(torch.uint8).flatten(), theirs.view(torch.uint8).flatten()
    n = min(a.numel(), b.numel())
    return torch.equal(a[:n], b[:n]) and not a[n:].any() and not b[n:].any()

gen = torch.Generator().manual_seed(0)
for r, c in [(1, 1), (128, 4), (130, 5), (257, 9)]:
    s = torch.randint(0, 255, (r, c), generator=gen, dtype=torch.uint8)
    assert torch.equal(layouts.to_blocked(s).flatten(), to_blocked(s).flatten())
for m, ends, c in [(256, [32, 96, 256], 128), (512, [0, 128, 128, 512], 512), (300, [100, 100, 300], 256),
                   (64, [0, 64], 256)]:
    x = torch.randn(m, c, generator=gen).bfloat16()
    gi = torch.tensor(ends)
    _, s1, _, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, x[:, : c // 2], gi, backend="reference")
    ref, _ = torch_to_blocked_2d_M_groups(layouts.mxscale1_to_plain(s1), gi.to(torch.int32))
    assert same(layouts.mxscale1_to_blocked(s1, gi), ref), (m, ends)
    if all(e % 32 == 0 for e in ends):  # torchao's K groups take whole 32-token blocks
        plain = layouts.mxscale2_to_plain(s2, m, gi)[: m // 32].view(torch.uint8).t().contiguous()
        ref, _ = torch_to_blocked_2d_K_groups(plain, (gi // 32).to(torch.int32))
        assert same(layouts.mxscale2_to_blocked(s2, m, gi), ref), (m, ends)
print("torchao-equal")
"""


def test_blocked_layouts_equal_torchaos_reference_functions():
    """torchao's own reference implementations (to_blocked, torch_to_blocked_2d_M_groups / _K_groups), in a
    fresh process (importing torchao registers its ops and pytree types; kept out of this one)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_TORCHAO_CHECK)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "torchao-equal" in proc.stdout, proc.stderr[-3000:]


def test_documented_short_module_paths_import_as_modules():
    """``swiglu_ops.layouts`` and ``swiglu_ops.mx`` are documented as modules: ``import`` works, not only
    attribute access."""
    import importlib

    import swiglu_ops

    assert importlib.import_module("swiglu_ops.layouts") is swiglu_ops.layouts
    assert importlib.import_module("swiglu_ops.mx") is swiglu_ops.mx
    from swiglu_ops.layouts import to_blocked  # noqa: F401
