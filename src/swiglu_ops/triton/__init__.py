"""The Triton backend: the GLU family (spec README 6.2) as one set of shared ``@triton.jit`` pieces assembled
into four kernels (``_kernels``), for CUDA tensors (Hopper and newer; nothing in the kernels is
sm_100-only). With ``TRITON_INTERPRET=1`` set before this package is imported, the same kernels run on CPU
tensors through Triton's interpreter, which is how CI checks them without a GPU.

The entry points follow the kernel contract in :mod:`swiglu_ops._api`, one per CANN operator, and run every
member of the GLU family with every option. The launch path never synchronises with the device: grids
are sized from shapes and the number of groups only, and ``valid_rows`` and the group ends are read inside
the kernels.
"""

from __future__ import annotations

import os

import torch
import triton

from .. import mx
from . import _kernels
from ._kernels import INTERPRETED

NAME = "triton"

#: Launch options of every kernel: the spec forbids contracting its multiplies and adds into FMAs.
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


#: Use single PTX instructions for the correctly rounded conversions (``rcp.rn.f32`` for the sigmoid's
#: division, ``cvt.rn.bf16x2.f32``, ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` for the FP8 codes) instead of
#: their integer transcriptions: about 2.8x fewer instructions per element in the quantizer (static count,
#: docs/triton_backend.md). Off by default until it has run on a GPU: both paths compute the same bits by
#: the PTX specification, but only the integer path has been checked on hardware (H200, bit-exact). Set
#: ``SWIGLU_OPS_TRITON_HW_CVT=1`` (or this attribute) to opt in; the interpreter always uses the integer
#: path.
def hw_conversions_from_env(value: str | None) -> bool:
    """``SWIGLU_OPS_TRITON_HW_CVT``: unset, "" or "0" = off, "1" = on; anything else is an error."""
    if value in (None, "", "0", "1"):
        return value == "1"
    raise ValueError(f"SWIGLU_OPS_TRITON_HW_CVT must be 0 or 1, got {value!r}")


HW_CONVERSIONS = hw_conversions_from_env(os.environ.get("SWIGLU_OPS_TRITON_HW_CVT"))

# Both MX kernels: a tile is 32 rows x MX_BLOCK_N pairs; group ends are scanned in chunks. 64 x 8 warps
# with the integer conversions: of the backward tiles measured on an H200 (64 x 8, 32 x 4, 128 x 8, ...),
# 64 and 32 pairs were fastest and 128 pairs 20-80 % slower. With HW_CONVERSIONS, the static analysis
# favours 128 x 8 (2 rows x 8 columns per thread amortise the per-column scale math; docs/triton_backend.md).
MX_BLOCK_N = 64
# Tensors that are not 16-byte aligned (views at odd offsets) get no vector loads; Triton then spreads the
# tile one element per thread and a 128-wide tile spills on sm_100, so they use at most this width.
MX_BLOCK_N_UNALIGNED = 64
MX_GROUP_CHUNK = 128
MX_NUM_WARPS = 8
# The forward MX kernel's register budget (ptxas .maxnreg) for aligned tensors: 2 CTAs x 8 warps per SM. Left
# to itself, ptxas aims some FP4 variants at an occupancy cliff (64 or 48 registers) and spills a few bytes.
MX_FWD_MAXNREG = 128
# clipped_swiglu / clipped_swiglu_grad: a program takes CLIPPED_ROWS rows x CLIPPED_BLOCK pairs (no loop).
CLIPPED_ROWS = 4
CLIPPED_BLOCK = 256
CLIPPED_NUM_WARPS = 4
# swiglu_group_grad: a tile is GROUP_GRAD_ROWS rows x GROUP_GRAD_BLOCK_H hidden columns (2048 elements).
GROUP_GRAD_ROWS = 4
GROUP_GRAD_BLOCK_H = 256
GROUP_GRAD_NUM_WARPS = 4
# Issue the loads of the next hidden chunk before the math of the current one (register double buffering).
GROUP_GRAD_PREFETCH = True


def is_available(device) -> tuple[bool, str]:
    device = torch.device(device)
    if device.type == "cuda":
        if INTERPRETED:
            return False, "TRITON_INTERPRET=1 was set when swiglu_ops.triton was imported"
        return True, ""
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return False, "CPU tensors need TRITON_INTERPRET=1 (Triton's interpreter)"
        if not INTERPRETED:
            return False, "TRITON_INTERPRET=1 must be set before swiglu_ops.triton is imported"
        return True, ""
    return False, f"Triton kernels run on CUDA tensors, not {device.type}"


def _hw_cvt() -> bool:
    return HW_CONVERSIONS and not INTERPRETED


def _aligned(*tensors) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in tensors)


# -------------------------------------------------------------------------------- swiglu_group_grad


def swiglu_group_grad(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight) -> None:
    rows, hidden = dy.shape
    _kernels.swiglu_group_grad_kernel[(triton.cdiv(rows, GROUP_GRAD_ROWS),)](
        dy, x, weight, y_origin, valid_rows, grad_x, grad_weight,
        rows, hidden, clamp,
        HAS_WEIGHT=weight is not None, HAS_MASK=valid_rows is not None, ROWS=GROUP_GRAD_ROWS,
        BLOCK_H=GROUP_GRAD_BLOCK_H, PREFETCH=GROUP_GRAD_PREFETCH, HW_CVT=_hw_cvt(),
        num_warps=GROUP_GRAD_NUM_WARPS, **LAUNCH_OPTIONS,
    )  # fmt: skip


# -------------------------------------------------------------------- clipped_swiglu (+ its gradient)


def _clipped(x, dy, valid_rows, glu, out, backward: bool) -> None:
    rows, cols = x.shape
    half = cols // 2
    n_chunks = triton.cdiv(half, CLIPPED_BLOCK)
    _kernels.clipped_swiglu_kernel[(triton.cdiv(rows, CLIPPED_ROWS) * n_chunks,)](
        x, dy, valid_rows, out,
        rows, half, n_chunks, glu.a_index, glu.alpha, glu.limit, glu.bias,
        BACKWARD=backward, INTERLEAVED=glu.interleaved, MODE=glu.clamp_mode, HAS_MASK=valid_rows is not None,
        ROWS=CLIPPED_ROWS, BLOCK=CLIPPED_BLOCK, HW_CVT=_hw_cvt(),
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


def mx_fwd_maxnreg(aligned: bool) -> int | None:
    """ptxas register budget of the forward MX kernel (:data:`MX_FWD_MAXNREG`; none for unaligned tensors,
    whose narrower tile needs more registers without vector loads)."""
    return MX_FWD_MAXNREG if aligned else None


def _mx_common(x, group_ends, glu, scale_alg, fmt, s2, tensors):
    """Arguments both MX kernels share, whether the tensors are 16-byte aligned, the row-block count and the
    tile width of the launch."""
    batch, m, _ = x.shape
    num_groups = None if group_ends is None else group_ends.numel()
    blocks = mx_blocks_per_slice(m, num_groups)
    aligned = _aligned(x, *tensors)
    block_n = MX_BLOCK_N if aligned else min(MX_BLOCK_N, MX_BLOCK_N_UNALIGNED)
    inv_max = getattr(fmt, "inv_max", 0.0)  # RCEIL only (FP8)
    args = (
        m, x.shape[-1] // 2, num_groups or 0, blocks, s2.shape[1],
        glu.a_index, glu.alpha, glu.limit, glu.bias, inv_max, fmt.emax, fmt.mbits, fmt.bias, fmt.max_code,
    )  # fmt: skip
    consts = dict(
        GROUPED=group_ends is not None, BLOCK_N=block_n, GROUP_CHUNK=MX_GROUP_CHUNK,
        INTERLEAVED=glu.interleaved, CLIPPED=glu.clipped, MODE=glu.clamp_mode, E5M2=fmt is mx.E5M2,
        SCALE_ALG=int(scale_alg), HW_CVT=_hw_cvt(), num_warps=MX_NUM_WARPS, **LAUNCH_OPTIONS,
    )  # fmt: skip
    return aligned, batch * blocks, block_n, args, consts


def swiglu_bwd_mx_quant(x, dy, group_ends, glu, scale_alg, fmt, y1, s1, y2, s2, transpose_y2=False) -> None:
    _, rows, block_n, args, consts = _mx_common(x, group_ends, glu, scale_alg, fmt, s2, (dy, y1, s1, y2, s2))
    grid = (rows, triton.cdiv(x.shape[-1] // 2, block_n))
    _kernels.swiglu_bwd_mx_quant_kernel[grid](
        x, dy, group_ends, y1, s1, y2, s2, *args, TRANSPOSE_Y2=transpose_y2, **consts
    )


def swiglu_mx_quant(
    x, group_ends, glu, scale_alg, fmt, round_mode, y1, s1, y2, s2, transpose_y2=False
) -> None:
    outs = (y1, s1, y2, s2)
    aligned, rows, block_n, args, consts = _mx_common(x, group_ends, glu, scale_alg, fmt, s2, outs)
    slots = s1.shape[-1]  # 2 * ceil(N / 64): the grid covers the pad slot of an odd block count
    grid = (rows, triton.cdiv(slots * 32, block_n))
    _kernels.swiglu_mx_quant_kernel[grid](
        x, group_ends, y1, s1, y2, s2, *args[:5], slots, *args[5:],
        FP4=fmt.packed, ROUND=_kernels.ROUND_MODES[round_mode], TRANSPOSE_Y2=transpose_y2,
        maxnreg=mx_fwd_maxnreg(aligned), **consts,
    )  # fmt: skip


__all__ = [
    "NAME",
    "is_available",
    "swiglu_group_grad",
    "clipped_swiglu",
    "clipped_swiglu_grad",
    "swiglu_bwd_mx_quant",
    "swiglu_mx_quant",
]
