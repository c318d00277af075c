"""The Triton backend: the GLU family (spec README 6.2) as one set of shared ``@triton.jit`` pieces assembled
into four kernels (``_kernels``), for CUDA tensors (Hopper and newer; nothing in the kernels is
sm_100-only). With ``TRITON_INTERPRET=1`` set before this package is imported, the same kernels run on CPU
tensors through Triton's interpreter, which is how CI checks them without a GPU.

The entry points follow the kernel contracts (``docs/design.md``), one per CANN
operator, and run every member of the GLU family with every option. The launch path never synchronises with
the device: grids are sized from shapes and the number of groups only, and ``valid_rows`` and the group ends
are read inside the kernels.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys

import torch

import triton

from ...numerics import glu as glu_math
from ...numerics import mx
from ...ops.registry import KERNELS, Backend
from . import _kernels
from ._kernels import INTERPRETED

NAME = "triton"

#: Launch options of every kernel: the spec forbids contracting its multiplies and adds into FMAs.
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


#: The GPU fast paths (constexpr ``HW_CVT``): single PTX instructions for the correctly rounded conversions
#: (``cvt.rn.bf16x2.f32``, ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` for the FP8 codes) instead of their
#: integer transcriptions, the backward's branch-free reciprocals and quotients with an exact redo of the
#: rare tile that needs it (``_kernels._recip_ge1``), and the MX forward's approximate quotient (its outputs
#: are codes, held to the contract's near-tie rule: ``_kernels._quotient``): 3.4-3.7x fewer SASS
#: instructions per element in the quantizers (benchmarks/sass_budget.py). Off by default until it has run
#: on a GPU: the backward and elementwise kernels compute the same bits as the integer path by the PTX
#: specification and ptxas's own expansions, but only the integer path has been checked on hardware (H200
#: and H100, bit-exact). Set ``SWIGLU_OPS_TRITON_HW_CVT=1`` (or this attribute) to opt in. Under the
#: interpreter it selects the same kernels with each PTX piece emulated (the integer conversions, an exact
#: reciprocal that is NaN wherever the PTX one might be inexact, the forward's quotient with a correctly
#: rounded reciprocal), which must give the default path's bytes, the MX forward's within the near-tie
#: rule (tests/test_triton_backend.py).
def hw_conversions_from_env(value: str | None) -> bool:
    """``SWIGLU_OPS_TRITON_HW_CVT``: unset, "" or "0" = off, "1" = on; anything else is an error."""
    if value in (None, "", "0", "1"):
        return value == "1"
    raise ValueError(f"SWIGLU_OPS_TRITON_HW_CVT must be 0 or 1, got {value!r}")


try:
    HW_CONVERSIONS, _SETTING_WHY = hw_conversions_from_env(os.environ.get("SWIGLU_OPS_TRITON_HW_CVT")), ""
except ValueError as exc:  # the backend is unavailable and says why (as the cpu backend's settings)
    HW_CONVERSIONS, _SETTING_WHY = False, f"ValueError: {exc}"

# Both MX kernels: a program takes one 32-row block and MX_TILES_PER_PROGRAM tiles of 32 rows x MX_BLOCK_N
# pairs along the row (a loop), with MX_NUM_WARPS warps: one warp per 32-column block of the tile, so that
# both amax reductions stay within a warp (docs/triton_backend.md). Group ends are scanned in chunks of
# MX_GROUP_CHUNK, once per program.
MX_BLOCK_N = 128
# The backward's tile in pairs: 64 pairs are 128 gradient columns, the forward tile's 128 output columns (at
# 128 pairs ptxas needs 255 registers and spills).
MX_BWD_BLOCK_N = 64
# The backward in the chunked layout on the HW_CVT path with plain loads: 128 pairs, whose A and B blocks of
# 32 pairs give the four warps one 32 x 32 block each (at 64 pairs the two blocks of a half span the four
# warps, two per block: the column amax crosses warps through shared memory, and each thread forms the
# scales of its columns for 2 rows instead of 4). ptxas fits it in 215-255 registers without spills there
# only: the integer path spills 96-296 bytes, masked loads 64-172, the clipped GLU with a token-contiguous
# y2 24 (sm_100).
MX_BWD_CHUNKED_BLOCK_N = 128
MX_NUM_WARPS = 4
MX_TILES_PER_PROGRAM = 4
MX_GROUP_CHUNK = 128
# The MX kernels' register budget (ptxas .maxnreg) for aligned tensors. Left to itself, ptxas caps some
# variants below what their tile needs (168 registers and 40 bytes of spills for the interleaved clipped
# backward, at 3 CTAs of 4 warps per SM); without a cap it takes up to 255 and 2 CTAs, and spills nothing.
MX_MAXNREG = 255
# The weighted backward (routing weight, spec 7.1) also forms the forward's activation for grad_weight: at
# the tiles above ptxas spills (sm_90: 372 bytes for the wide chunked tile on the HW_CVT path, 20 for the
# interleaved clipped GLU at 64 pairs), so it takes MX_BWD_BLOCK_N pairs, and 32 for the interleaved
# clipped GLU.
MX_BWD_WEIGHTED_INTERLEAVED_CLIPPED_BLOCK_N = 32
# clipped_swiglu / clipped_swiglu_grad: a program takes CLIPPED_ROWS rows x CLIPPED_CHUNKS chunks of
# CLIPPED_BLOCK pairs (a loop over the chunks).
CLIPPED_ROWS = 4
CLIPPED_CHUNKS = 4
# CUDA's limit of grid axes 1 and 2
MAX_GRID_Y = 65535
CLIPPED_BLOCK = 256
CLIPPED_NUM_WARPS = 4
# swiglu_group_grad: a tile is GROUP_GRAD_ROWS rows x GROUP_GRAD_BLOCK_H hidden columns (2048 elements).
GROUP_GRAD_ROWS = 4
GROUP_GRAD_BLOCK_H = 256
GROUP_GRAD_NUM_WARPS = 4
# Issue the loads of the next hidden chunk before the math of the current one (register double buffering).
GROUP_GRAD_PREFETCH = True
# ptxas register budget: with the prefetch and the loop unrolled by 2 (_kernels.GROUP_GRAD_UNROLL), ptxas
# left to itself caps fp32 with weight at 168 registers and spills 16 bytes; 192 fits every variant
# without spills (still 2 CTAs x 4 warps per SM). Aligned tensors only: the unaligned variant (no vector
# loads) spills under the cap and not without it.
GROUP_GRAD_MAXNREG = 192


def group_grad_maxnreg(aligned: bool) -> int | None:
    return GROUP_GRAD_MAXNREG if aligned else None


#: The oldest Triton whose front end builds every kernel (tests/test_triton_compile.py builds them with it;
#: pyproject.toml's floor): torch 2.9's. Older releases refuse parts of the kernels' code.
MIN_TRITON = (3, 5)


@functools.lru_cache(maxsize=8)  # is_available runs on every dispatch; the version string does not change
def triton_version_ok(version: str) -> bool:
    """Whether a Triton ``__version__`` string (``3.5.1``, ``3.6.0+git...``, ``3.5``) is at least
    ``MIN_TRITON``: its leading ``major.minor`` numbers (``3.4rc1`` is 3.4); anything else is not."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and (int(match[1]), int(match[2])) >= MIN_TRITON


def is_available(device) -> tuple[bool, str]:
    device = torch.device(device)
    if _SETTING_WHY:
        return False, _SETTING_WHY
    if not triton_version_ok(triton.__version__):
        need = ".".join(map(str, MIN_TRITON))
        return (
            False,
            f"needs Triton >= {need} (installed: {triton.__version__}); pip install 'triton>={need}'",
        )
    if device.type == "cuda":
        if INTERPRETED:
            return False, "TRITON_INTERPRET=1 was set when swiglu_ops.backends.triton was imported"
        if not torch.cuda.is_available():
            return False, "torch has no CUDA device here (a CPU-only build, or no GPU visible)"
        return True, ""
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return False, "CPU tensors need TRITON_INTERPRET=1 (Triton's interpreter)"
        if not INTERPRETED:
            return False, "TRITON_INTERPRET=1 must be set before swiglu_ops.backends.triton is imported"
        return True, ""
    return False, f"Triton kernels run on CUDA tensors, not {device.type}"


def _hw_cvt() -> bool:
    # The interpreter has no inline asm: there the HW_CVT kernels run the same fast formulation (keys,
    # exact redo) with emulated PTX pieces (_kernels._fast_emulated), so that CI can test it.
    return HW_CONVERSIONS


def _aligned(*tensors) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in tensors)


# -------------------------------------------------------------------------------- swiglu_group_grad


#: The kernels address within a row by 32-bit offsets (64-bit arithmetic once per row or row block): a
#: row of x holds fewer elements than this. The tensors may hold more in all.
MAX_ROW_ELEMENTS = 2**31


def _check_row(width: int, op: str) -> None:
    """ValueError for a row the kernels' 32-bit in-row offsets cannot address (the cpu and reference backends
    take it): an error, never a wrapped offset."""
    if width >= MAX_ROW_ELEMENTS:
        raise ValueError(
            f"backend 'triton' runs {op} on rows of x of fewer than 2**31 elements (32-bit offsets within a "
            f"row), got {width}; use backend='cpu' or 'reference', or split the rows"
        )


def swiglu_group_grad(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight) -> None:
    rows, hidden = dy.shape
    _check_row(2 * hidden, "swiglu_group_grad")
    aligned = hidden % 16 == 0 and _aligned(*(t for t in (dy, x, y_origin, grad_x) if t is not None))
    _kernels.swiglu_group_grad_kernel[(triton.cdiv(rows, GROUP_GRAD_ROWS),)](
        dy, x, weight, y_origin, valid_rows, grad_x, grad_weight,
        rows, hidden, clamp,
        HAS_WEIGHT=weight is not None, HAS_MASK=valid_rows is not None, ROWS=GROUP_GRAD_ROWS,
        BLOCK_H=GROUP_GRAD_BLOCK_H, PREFETCH=GROUP_GRAD_PREFETCH, HW_CVT=_hw_cvt(),
        num_warps=GROUP_GRAD_NUM_WARPS, maxnreg=group_grad_maxnreg(aligned), **LAUNCH_OPTIONS,
    )  # fmt: skip


# -------------------------------------------------------------------- clipped_swiglu (+ its gradient)


def small_numerators(glu, dtype: torch.dtype, hw_cvt: bool) -> bool:
    """Whether the MX forward's approximate quotient (the ``HW_CVT`` path) may meet fp32-subnormal numerators,
    where its quarter-scaled numerator is inexact and the kernel needs the form that scales the reciprocal
    instead (constexpr ``SMALL_NUM``, two more SASS instructions per element): fp32 inputs (widened bf16/fp16
    values, subnormals included, stay exact under the quarter), or a clipped SwiGLU whose ``limit`` (A~'s
    upper bound, a numerator) lies below 2**-100."""
    return hw_cvt and (dtype == torch.float32 or (glu.clipped and glu.limit < 2.0**-100))


def den_key(glu) -> bool:
    """Whether the clamp_mode-0 backward's fast reciprocal is keyed by its operand alone (constexpr
    ``DEN_KEY``, one instruction per pair less; ``_kernels._glu_bwd``): where L is finite in fp32 (A~ =
    min(a, L) is never +inf) and alpha is not negative (an A~ of -inf makes exp(A~ * -alpha) + 1 infinite
    or NaN). GPT-OSS's parameters qualify; an infinite L (the default) or a negative alpha keys by
    den + |A~|."""
    limit, alpha = torch.tensor(
        [glu.limit, glu.alpha], dtype=torch.float32, device="cpu"
    ).tolist()  # the kernels' values
    return bool(glu.clipped and glu.clamp_mode == 0 and math.isfinite(limit) and not alpha < 0)


def _clipped(x, dy, valid_rows, glu, out, backward: bool) -> None:
    rows, cols = x.shape
    _check_row(cols, "clipped_swiglu_grad" if backward else "clipped_swiglu")
    half = cols // 2
    n_chunks = triton.cdiv(half, CLIPPED_BLOCK)
    n_programs = triton.cdiv(n_chunks, CLIPPED_CHUNKS)
    for chunk0 in range(0, n_programs, MAX_GRID_Y):  # one launch unless a row holds 2**26 pairs or more
        grid = (triton.cdiv(rows, CLIPPED_ROWS), min(n_programs - chunk0, MAX_GRID_Y))
        _kernels.clipped_swiglu_kernel[grid](
            x, dy, valid_rows, out, rows, half, chunk0, n_chunks, glu.alpha, glu.limit, glu.bias,
            A_INDEX=glu.a_index, BACKWARD=backward, INTERLEAVED=glu.interleaved, MODE=glu.clamp_mode,
            HAS_MASK=valid_rows is not None, ROWS=CLIPPED_ROWS, BLOCK=CLIPPED_BLOCK, CHUNKS=CLIPPED_CHUNKS,
            DEN_KEY=den_key(glu), HW_CVT=_hw_cvt(),
            num_warps=CLIPPED_NUM_WARPS, **LAUNCH_OPTIONS,
        )  # fmt: skip


def clipped_swiglu(x, valid_rows, glu, y) -> None:
    _clipped(x, None, valid_rows, glu, y, backward=False)


def clipped_swiglu_grad(dy, x, valid_rows, glu, grad_x) -> None:
    _clipped(x, dy, valid_rows, glu, grad_x, backward=True)


# ------------------------------------------------------------------- the dual-axis MX operators


def mx_blocks_per_slice(m: int, num_groups: int | None) -> int:
    """Row-block programs per batch slice: every 32-row block of every group (and of the tail past the last
    end) gets one. Groups add at most one partial block each: sum(ceil(n_g / 32)) <= ceil(M / 32) + G + 1."""
    blocks = triton.cdiv(m, 32)
    return blocks if num_groups is None else blocks + num_groups + 1


def mx_maxnreg(aligned: bool) -> int | None:
    """ptxas register budget of the MX kernels (:data:`MX_MAXNREG`; none for unaligned tensors, whose
    narrower tile needs more registers without vector loads)."""
    return MX_MAXNREG if aligned else None


def mx_block_n(
    backward: bool, aligned: bool, transpose_y2: bool, hw_cvt: bool = False, *,
    interleaved: bool = True, clipped: bool = False, plain: bool = False, weighted: bool = False,
) -> int:  # fmt: skip
    """The MX kernels' tile width (BLOCK_N): :data:`MX_BWD_BLOCK_N` pairs (backward; with ``hw_cvt``
    :data:`MX_BWD_CHUNKED_BLOCK_N` in the chunked layout with ``plain`` loads, unless the GLU is
    ``clipped`` and y2 token-contiguous) or :data:`MX_BLOCK_N` output columns (forward), halved (to 32 at
    least) for tensors that are not 16-byte aligned (no vector loads: Triton spreads the tile one element
    per thread) and again for token-contiguous y2 on the integer path, whose ``tl.store`` has 64-bit
    addresses per code after a layout conversion: at the full width both spill on sm_100 (40-72 bytes).
    With ``hw_cvt`` the token-contiguous codes are stored by PTX from the tile's own layout
    (``_store_y2_tokens``), and the tile keeps its width. The ``weighted`` backward: never the wide tile,
    and :data:`MX_BWD_WEIGHTED_INTERLEAVED_CLIPPED_BLOCK_N` pairs for the interleaved clipped GLU."""
    if backward:
        wide = hw_cvt and plain and not interleaved and not (clipped and transpose_y2) and not weighted
        block_n = MX_BWD_CHUNKED_BLOCK_N if wide else MX_BWD_BLOCK_N
        if weighted and interleaved and clipped:
            block_n = MX_BWD_WEIGHTED_INTERLEAVED_CLIPPED_BLOCK_N
    else:
        block_n = MX_BLOCK_N
    for narrow in (not aligned, transpose_y2 and not hw_cvt):
        if narrow:
            block_n = max(block_n // 2, 32)
    return block_n


@functools.lru_cache(maxsize=256)
def padding(glu, dtype: torch.dtype, backward: bool) -> tuple[float, bool]:
    """``(b_pad, select)``: what the MX kernels' masked loads (not ``plain_loads``) put as B on the padding
    of a tile (pairs past N, rows past the last group; A loads 1.0, dy 0.0), and whether its values must be
    replaced by zeros with a select (constexpr ``PAD_SELECT``).

    The padding feeds the block amaxes, and the rows past the last group are stored, so it must come out as
    +0.0. The plain SwiGLU gives (1 / (e + 1)) * 0 = +0 by itself; for the clipped variants the GLU's own
    math decides, evaluated here by the reference on the padding's values in x's dtype: the forward with
    B = -bias (clip(-bias) + bias = +0 when |bias| <= limit), the backward with B = 0 and dy = 0 (+0 unless
    alpha or bias is infinite, or a factor's sign makes it -0). Where it is not +0 exactly, the kernels
    select (one compare and one select per element: the only cost, GPT-OSS's parameters do not pay it)."""
    if not glu.clipped:
        return 0.0, False
    b_pad = -glu.bias if not backward and glu.clamp_mode == 0 and math.isfinite(glu.bias) else 0.0
    b_pad = torch.tensor(b_pad, dtype=dtype, device="cpu").item()  # as the kernel's masked load gives it
    one, b, zero = (torch.tensor([v], dtype=dtype, device="cpu").float() for v in (1.0, b_pad, 0.0))
    outs = glu_math.backward(one, b, zero, glu) if backward else (glu_math.forward(one, b, glu),)
    exact = all(int(o.view(torch.int32)) == 0 for o in outs)  # +0.0, not -0.0
    return b_pad, not exact


@functools.lru_cache(maxsize=256)
def _bits(value: float, dtype: torch.dtype) -> int:
    """The bit pattern of ``value`` (exactly representable) in ``dtype``, as a signed integer of its width."""
    return (
        torch.tensor(value, dtype=dtype, device="cpu")
        .view({2: torch.int16, 4: torch.int32}[dtype.itemsize])
        .item()
    )


def row_vec(n: int, aligned: bool, hw_cvt: bool) -> bool:
    """Whether the MX kernels' row-wise FP8 codes may be zeroed four at a time after the PTX conversion
    (constexpr ``ROW_VEC``): where the loads are vectorised (16-byte aligned tensors, N pairs a multiple of
    16), so that a thread's four consecutive registers are four columns of one block. Elsewhere Triton
    lays the tile out one element per thread and register, and the codes are selected per element."""
    return hw_cvt and aligned and n % 16 == 0


def plain_loads(n: int, aligned: bool) -> bool:
    """Whether the MX kernels load without predicates (constexpr ``PLAIN_LOADS``): where every 32-column
    block of the N pairs is whole and the tensors are 16-byte aligned. Their clamped addresses then read
    copies of the block's own values instead of the padding (``_kernels._mx_quantize``, ``COPIES``)."""
    return aligned and n % 32 == 0


def _mx_common(
    x, group_ends, glu, scale_alg, fmt, s2, tensors, tile_pairs, backward, transpose_y2, weighted=False
):
    """Arguments both MX kernels share (the shape's, the GLU's, the format's and the tiling's, in the
    kernels' order; the forward adds its mxscale1 slots and the padding's B), whether the tensors are
    16-byte aligned, the grid and the constexprs. ``tile_pairs``: the pairs (forward: output columns, with
    the pad slot) a row spans. Zero-fills ``s2``: the kernels write only the slots that a 32-row block maps
    to."""
    op = "swiglu_backward_mx_quant_dual_axis" if backward else "swiglu_mx_quant_dual_axis"
    _check_row(x.shape[-1], op)
    s2.zero_()
    batch, m, _ = x.shape
    num_groups = None if group_ends is None else group_ends.numel()
    blocks = mx_blocks_per_slice(m, num_groups)
    aligned = _aligned(x, *tensors)
    plain = plain_loads(x.shape[-1] // 2, aligned)
    block_n = mx_block_n(
        backward, aligned, transpose_y2, _hw_cvt(), interleaved=glu.interleaved, clipped=glu.clipped,
        plain=plain, weighted=weighted,
    )  # fmt: skip
    n_tiles = triton.cdiv(tile_pairs, block_n)
    per_program = min(MX_TILES_PER_PROGRAM, n_tiles)
    inv_max = getattr(fmt, "inv_max", 0.0)  # RCEIL only (FP8)
    shape = (m, x.shape[-1] // 2, num_groups or 0, blocks, s2.shape[1])
    glu_args = (glu.alpha, glu.limit, glu.bias)
    tail = (inv_max, fmt.emax, fmt.mbits, n_tiles, per_program)
    b_pad, pad_select = padding(glu, x.dtype, backward)
    consts = dict(
        # 32-bit offsets within a 32-row block unless its rows hold 2**26 elements or more (or, for a
        # token-contiguous y2, within a tile's 128 columns of M tokens)
        WIDE=32 * x.shape[-1] >= 2**31 or (transpose_y2 and 128 * m >= 2**31),
        GROUPED=group_ends is not None, BLOCK_N=block_n,
        GROUP_CHUNK=MX_GROUP_CHUNK, TRANSPOSE_Y2=transpose_y2, A_INDEX=glu.a_index,
        PAD_SELECT=pad_select and not plain, PLAIN_LOADS=plain,
        INTERLEAVED=glu.interleaved, CLIPPED=glu.clipped, MODE=glu.clamp_mode, E5M2=fmt is mx.E5M2,
        SCALE_ALG=int(scale_alg), HW_CVT=_hw_cvt(), ROW_VEC=row_vec(x.shape[-1] // 2, aligned, _hw_cvt()),
        num_warps=MX_NUM_WARPS, **LAUNCH_OPTIONS,
    )  # fmt: skip
    if backward:
        consts["DEN_KEY"] = den_key(glu)
    else:
        consts["SMALL_NUM"] = small_numerators(glu, x.dtype, _hw_cvt())
    grid = (batch * blocks, triton.cdiv(n_tiles, per_program))
    if grid[1] > MAX_GRID_Y:  # CUDA's limit of grid axis 1: rows of about 2**24 pairs or more
        raise ValueError(
            f"backend 'triton' runs {op} on rows of at most {MAX_GRID_Y * per_program * block_n} pairs here "
            f"(CUDA's grid limit of {MAX_GRID_Y} programs along a row), got {tile_pairs}; use backend='cpu' "
            "or 'reference', or split the rows"
        )
    return aligned, grid, (shape, glu_args, b_pad, tail), consts


#: Rows per program of ``mx_grad_weight_kernel`` (the weighted backward's grad_weight over several programs).
GRAD_WEIGHT_ROWS = 256


def swiglu_bwd_mx_quant(
    x, dy, group_ends, glu, scale_alg, fmt, y1, s1, y2, s2, transpose_y2=False, weight=None, grad_weight=None
) -> None:
    """With ``weight`` (spec 7.1; fp32 [B*M]) the gradients are scaled per row and ``grad_weight`` (fp32
    [B*M]) is written: straight from the kernel where one program covers a row block's whole width, else
    from per-program parts added in order by ``mx_grad_weight_kernel`` (deterministic, no atomics)."""
    if (weight is None) != (grad_weight is None):
        raise ValueError("weight and grad_weight come together or not at all")
    tensors = (dy, y1, s1, y2, s2)
    weighted = weight is not None
    aligned, grid, args, consts = _mx_common(
        x, group_ends, glu, scale_alg, fmt, s2, tensors, x.shape[-1] // 2, True, transpose_y2, weighted
    )
    shape, glu_args, _b_pad, tail = args  # the backward pads B with 0 (dy = 0 zeroes its padding)
    parts = None
    if weight is not None:
        consts.update(HAS_WEIGHT=True, GW_DIRECT=grid[1] == 1)
        if grid[1] > 1:
            parts = torch.empty((grad_weight.numel(), grid[1]), dtype=torch.float32, device=x.device)
    _kernels.swiglu_bwd_mx_quant_kernel[grid](
        x, dy, group_ends, y1, s1, y2, s2, weight, grad_weight if parts is None else parts, *shape, *glu_args,
        *tail, maxnreg=mx_maxnreg(aligned), **consts,
    )  # fmt: skip
    if parts is not None:
        rows = grad_weight.numel()
        _kernels.mx_grad_weight_kernel[(triton.cdiv(rows, GRAD_WEIGHT_ROWS),)](
            parts, grad_weight, rows, grid[1], BLOCK=GRAD_WEIGHT_ROWS, **LAUNCH_OPTIONS
        )


def swiglu_mx_quant(
    x, group_ends, glu, scale_alg, fmt, round_mode, y1, s1, y2, s2, transpose_y2=False, weight=None
) -> None:
    """``weight`` (spec 7.1; fp32 [B*M] or None): stage 1 times the row's weight, last."""
    slots = s1.shape[-1]  # 2 * ceil(N / 64): the tiles cover the pad slot of an odd block count
    aligned, grid, args, consts = _mx_common(
        x, group_ends, glu, scale_alg, fmt, s2, (y1, s1, y2, s2), slots * 32, False, transpose_y2
    )
    shape, glu_args, b_pad, tail = args
    if weight is not None:
        consts["HAS_WEIGHT"] = True
    _kernels.swiglu_mx_quant_kernel[grid](
        x, group_ends, y1, s1, y2, s2, weight, *shape, slots, *glu_args, _bits(b_pad, x.dtype), *tail,
        FP4=fmt.packed, ROUND=_kernels.ROUND_MODES[round_mode], maxnreg=mx_maxnreg(aligned), **consts,
    )  # fmt: skip


BACKEND = Backend(NAME, sys.modules[__name__], KERNELS)  # every kernel contract, by its name here


__all__ = [
    "BACKEND",
    "NAME",
    "is_available",
    *sorted(KERNELS),
]
