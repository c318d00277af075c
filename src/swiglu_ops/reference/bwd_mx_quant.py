"""Reference SwigluBackwardMxQuantWithDualAxis: ``shared/spec/swiglu_backward_mx_quant.md`` sections 2-4.

Stage 1 (fp32 SwiGLU backward in the kernel's operation order, rounded to x's dtype) then stage 2 (MX
quantisation of those 16-bit values along both axes) built from the rules in :mod:`swiglu_ops.mx`.
"""

from __future__ import annotations

import torch

from .. import mx


def swiglu_backward_fp32(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor):
    """Spec 2.2: gradients of the activated half A and the linear half B, fp32, kernel order, no FMA."""
    s = 1.0 / (1.0 + torch.exp(-a))
    t = ((-s) + 1.0) * a + 1.0
    grad_a = ((t * b) * s) * g
    grad_b = (s * g) * a
    return grad_a, grad_b


def stage1(x: torch.Tensor, dy: torch.Tensor, activate_left: bool) -> torch.Tensor:
    """grad_x in x's dtype and x's column layout (spec 2.3/2.4, contract: columns follow x)."""
    n = dy.shape[-1]
    left, right = x[..., :n].float(), x[..., n:].float()
    a, b = (left, right) if activate_left else (right, left)
    grad_a, grad_b = swiglu_backward_fp32(a, b, dy.float())
    grad_left, grad_right = (grad_a, grad_b) if activate_left else (grad_b, grad_a)
    return torch.cat([grad_left, grad_right], dim=-1).to(x.dtype)  # RNE, no saturation


def quantize_rowwise(grad: torch.Tensor, fmt: mx.FP8Format, scale_alg: int):
    """-1 axis: 32 consecutive columns per block. Returns (y1 codes [.., M, C], scale codes [.., M, C/32])."""
    *lead, c = grad.shape
    blocks = grad.reshape(*lead, c // mx.BLOCK, mx.BLOCK)
    y, codes = mx.quantize_blocks(blocks, -1, fmt, scale_alg)
    return y.reshape(*lead, c), codes


def quantize_colwise(grad2d: torch.Tensor, ranges, bases, fmt: mx.FP8Format, scale_alg: int, rows: int):
    """-2 axis for one [M, C] slice: 32-row blocks restarting at every group start, zero padded.

    Returns (y2 codes [M, C], mxscale2 codes [rows, C, 2]); rows outside every group stay 0 in y2 and unused
    scale slots stay 0.
    """
    m, c = grad2d.shape
    y2 = torch.zeros(m, c, dtype=torch.uint8, device=grad2d.device)
    slots = torch.zeros(2 * rows, c, dtype=torch.int64, device=grad2d.device)  # slot 2r+s -> [r, :, s]
    for (start, end), base in zip(ranges, bases, strict=True):
        n = end - start
        if n <= 0:
            continue
        nblk = -(-n // mx.BLOCK)
        padded = torch.zeros(nblk * mx.BLOCK, c, dtype=grad2d.dtype, device=grad2d.device)
        padded[:n] = grad2d[start:end]
        y, codes = mx.quantize_blocks(padded.reshape(nblk, mx.BLOCK, c), 1, fmt, scale_alg)
        y2[start:end] = y.reshape(nblk * mx.BLOCK, c)[:n]
        slots[2 * base : 2 * base + nblk] = codes
    return y2, slots.reshape(rows, 2, c).transpose(1, 2)


def swiglu_bwd_mx_quant(x, dy, group_ends, activate_left, scale_alg, fmt, y1, s1, y2, s2) -> None:
    """Backend entry point (see ``swiglu_ops._api`` for the argument contract). Writes y1, s1, y2, s2."""
    batch, m, c = x.shape
    rows = s2.shape[1]
    grad = stage1(x, dy, activate_left)  # [B, M, C] in x's dtype

    ranges, bases = mx.column_block_groups(group_ends, m)
    covered = ranges[-1][1]  # rows past the last (clamped) end belong to no group: outputs are zeros

    q1, c1 = quantize_rowwise(grad, fmt, scale_alg)
    q1[:, covered:] = 0
    c1[:, covered:] = 0
    y1.copy_(q1)
    s1.copy_(c1)
    for b in range(batch):
        q2, c2 = quantize_colwise(grad[b], ranges, bases, fmt, scale_alg, rows)
        y2[b].copy_(q2)
        s2[b].copy_(c2)
