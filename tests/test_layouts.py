"""Scale layout helpers: plain layouts checked through dequantisation, blocked layouts against an independent
loop implementation of the published cuBLAS tile layout.

Published description (cuBLAS "1D block scaling factors layout"; TransformerEngine "Swizzling scaling
factors"; torchao ``to_blocked``): pad the scale matrix to multiples of [128, 4], cut it into 128x4 tiles
stored one after the other in row-major tile order; inside a 512-byte tile, the scale at tile row r, column c
is at byte (r % 32) * 16 + (r // 32) * 4 + c (rows in the order 0, 32, 64, 96, 1, 33, ...).
"""

from __future__ import annotations

import pytest
import torch

import swiglu_ops
from swiglu_ops import layouts, mx


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
    expected = mx.mx_dequantize(y1, s1, axis=-1, dtype=torch.float64)
    torch.testing.assert_close(
        dequant_with(y1, plain.repeat_interleave(32, dim=-1)), expected, rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("m", "ends"),
    [(70, None), (64, None), (33, None), (100, [30, 30, 100]), (200, [64, 65, 130, 200]), (5, [0, 5])],
)
def test_mxscale2_to_plain_concatenates_group_blocks(m, ends):
    gi = None if ends is None else torch.tensor(ends)
    _, _, y2, s2 = quantised(m, 64, gi)
    plain = swiglu_ops.layouts.mxscale2_to_plain(s2, m, gi)
    ranges = [(0, m)] if ends is None else list(zip([0, *ends[:-1]], ends, strict=True))
    assert plain.shape == (sum(-(-(e - s) // 32) for s, e in ranges), 64)
    # Row i of group (s, e) uses plain block (blocks before the group) + (i - s) // 32.
    block_of_row, first = [], 0
    for s, e in ranges:
        block_of_row += [first + (i - s) // 32 for i in range(s, e)]
        first += -(-(e - s) // 32)
    per_element = plain[torch.tensor(block_of_row, dtype=torch.int64)]
    expected = mx.mx_dequantize(y2, s2, axis=-2, group_index=gi, dtype=torch.float64)
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


def test_mxscale1_to_blocked_stacks_groups_padded_to_128_rows():
    ends = [100, 100, 300]
    _, s1, _, _ = quantised(300, 192, torch.tensor(ends))
    plain = swiglu_ops.layouts.mxscale1_to_plain(s1)  # [300, 6]
    blocked = swiglu_ops.layouts.mxscale1_to_blocked(s1, torch.tensor(ends))
    assert blocked.shape == (128 + 256, 8)
    assert torch.equal(unblock_by_loops(blocked[:128], 100, 6), plain[:100].view(torch.uint8))
    assert torch.equal(unblock_by_loops(blocked[128:], 200, 6), plain[100:].view(torch.uint8))
    assert blocked.view(torch.uint8)[128:].flatten().tolist() == blocked_by_loops(plain[100:])
    ungrouped = swiglu_ops.layouts.mxscale1_to_blocked(s1)
    assert ungrouped.flatten().view(torch.uint8).tolist() == blocked_by_loops(plain)


def test_mxscale2_to_blocked_puts_groups_side_by_side():
    m, ends = 300, [40, 40, 300]
    gi = torch.tensor(ends)
    _, _, _, s2 = quantised(m, 192, gi)
    plain = swiglu_ops.layouts.mxscale2_to_plain(s2, m, gi)  # [2 + 9, 192]
    blocked = swiglu_ops.layouts.mxscale2_to_blocked(s2, m, gi)
    assert blocked.shape == (256, 4 + 12)
    # Each group's band is that group's [C, blocks_g] matrix blocked on its own (torchao "K groups").
    band0 = blocked[:, :4].contiguous()
    band1 = blocked[:, 4:].contiguous()
    assert torch.equal(unblock_by_loops(band0, 192, 2), plain[:2].t().view(torch.uint8))
    assert torch.equal(unblock_by_loops(band1, 192, 9), plain[2:].t().view(torch.uint8))
    single = swiglu_ops.layouts.mxscale2_to_blocked(s2[:5], 300)  # no groups: R = ceil(300 / 64) = 5 rows
    assert single.flatten().view(torch.uint8).tolist() == blocked_by_loops(
        swiglu_ops.layouts.mxscale2_to_plain(s2[:5], 300).t()
    )


def test_layout_helpers_reject_bad_input():
    with pytest.raises(TypeError, match="scales"):
        swiglu_ops.layouts.to_blocked(torch.zeros(4, 4))
    with pytest.raises(TypeError, match="scales must be a torch.Tensor"):
        swiglu_ops.layouts.to_blocked([[0] * 4])
    with pytest.raises(ValueError, match="group_index must be a non-empty 1-D"):
        swiglu_ops.layouts.mxscale2_to_plain(
            torch.zeros(2, 64, 2, dtype=torch.uint8), 64, torch.tensor([[64]])
        )
    with pytest.raises(ValueError, match="rank 2"):
        swiglu_ops.layouts.to_blocked(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="mxscale2 must have shape"):
        swiglu_ops.layouts.mxscale2_to_plain(torch.zeros(3, 64, 2, dtype=torch.uint8), 64)
    with pytest.raises(ValueError, match="mxscale1"):
        swiglu_ops.layouts.mxscale1_to_plain(torch.zeros(4, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="2-D"):
        swiglu_ops.layouts.mxscale1_to_blocked(torch.zeros(2, 4, 1, 2, dtype=torch.uint8), torch.tensor([4]))
    assert layouts.mxscale1_to_blocked(torch.zeros(0, 1, 2, dtype=torch.uint8), torch.tensor([0])).shape == (
        0,
        4,
    )
