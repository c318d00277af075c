"""Autograd functions and modules built on the two operators.

- :func:`clamped_swiglu` / :class:`ClampedSwiGLU`: the MoE expert activation
  ``y = silu(min(g, c)) * clip(u, -c, c) * w`` with a row mask, whose backward is the fused
  ``swiglu_group_grad`` operator.
- :func:`swiglu_mx_backward`: plain SwiGLU ``y = silu(A) * B`` whose backward is the fused SwiGLU backward +
  dual-axis MXFP8 quantisation (``swiglu_backward_mx_quant_dual_axis``); autograd receives the dequantised
  gradient and :class:`MXGradient` keeps the quantised tensors for FP8 GEMMs.

Both backwards call the registered custom ops (``torch.ops.swiglu_ops.*``), so they trace under
``torch.compile``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import _api, torch_ops  # noqa: F401  (torch_ops registers torch.ops.swiglu_ops.*)
from .mx import mx_dequantize

__all__ = ["clamped_swiglu", "ClampedSwiGLU", "MXGradient", "swiglu_mx_backward"]

_ops = torch.ops.swiglu_ops


# ------------------------------------------------------------------------------------- clamped SwiGLU


def _unweighted_forward(x: torch.Tensor, group_index: torch.Tensor | None, clamp: float) -> torch.Tensor:
    """fp32 ``silu(min(g, c)) * clip(u, -c, c)``, exactly 0 on the rows the group mask drops."""
    hidden = x.shape[-1] // 2
    g, u = x[..., :hidden].float(), x[..., hidden:].float()
    if clamp > 0:
        g = torch.clamp(g, max=clamp)  # NaN propagates, as in the backward operator
        u = torch.clamp(u, -clamp, clamp)
    y = F.silu(g) * u
    if group_index is not None:
        rows = math.prod(x.shape[:-1])
        valid = torch.arange(rows, device=x.device) < _api._valid_rows(group_index, rows)
        y = torch.where(valid.reshape(*x.shape[:-1], 1), y, 0.0)
    return y


def _half(x) -> torch.Tensor:
    """``x[..., :H]``: stands in for grad_y / y_origin when the backward's validation runs at forward time."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must have rank >= 2, got shape {tuple(x.shape)}")
    if x.shape[-1] % 2 != 0:
        raise ValueError(f"x last dim must be even (two halves), got {x.shape[-1]}")
    return x[..., : x.shape[-1] // 2]


def _validate_forward(x, weight, group_index, clamp_limit) -> float:
    """The backward operator's validation, run at forward time so that errors point at the forward call."""
    half = _half(x)
    return _api.validate_group_grad(
        half, x, weight, None if weight is None else half, group_index, clamp_limit
    )


class _ClampedSwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, group_index, clamp_limit, backend):
        clamp = _validate_forward(x, weight, group_index, clamp_limit)
        y = _unweighted_forward(x, group_index, clamp)
        if weight is not None:
            y = y * weight.reshape(*x.shape[:-1], 1)
        ctx.save_for_backward(x, weight, group_index)
        ctx.clamp, ctx.backend = clamp, backend
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, group_index = ctx.saved_tensors
        # y_origin must be the UNWEIGHTED output (recomputed here instead of stored): the operator returns
        # sum(dy * y_origin), which is w times the true dL/dw if y_origin includes the weight. Masked rows
        # have y_origin == 0, so their weight gradient is the true 0 although the operator never masks it.
        y_origin = None if weight is None else _unweighted_forward(x, group_index, ctx.clamp).to(x.dtype)
        grad_x, grad_weight = _ops.swiglu_group_grad(
            grad_y.to(x.dtype), x, weight, y_origin, group_index, ctx.clamp, backend=ctx.backend
        )
        return grad_x, (grad_weight if weight is not None else None), None, None, None


def clamped_swiglu(x, weight=None, group_index=None, clamp_limit=0.0, *, backend="auto"):
    """``y = silu(min(g, c)) * clip(u, -c, c) * w`` with a group row mask; backward by ``swiglu_group_grad``.

    Args:
        x: ``[..., 2H]`` bf16/fp16/fp32; gate ``g = x[..., :H]``, up ``u = x[..., H:]``.
        weight: fp32 per-row routing weight (``numel == rows``, any shape) or None.
        group_index: 1-D int64/int32 group **counts**. Rows ``>= clamp(sum, 0, rows)`` of the flattened
            leading dims output 0 and get zero gradient (x and weight).
        clamp_limit: ``c``; 0 disables the clamp.
        backend: backend of the backward operator.

    Returns:
        ``[..., H]`` in x's dtype, computed in fp32 (``(silu * clip) * w``) and rounded once.

    Gradient conventions (those of the operator): the clamp masks are open intervals, so at ``g == c`` the
    gate gradient is 0 and at ``u == +-c`` the up gradient is 0 (the up gradient at ``g == c`` is
    ``dy * silu(c) * w``). ``weight.grad`` is the true ``sum_h dy * silu(g~) * u~`` (see ``backward``).
    """
    return _ClampedSwiGLUFunction.apply(x, weight, group_index, clamp_limit, backend)


class ClampedSwiGLU(torch.nn.Module):
    """Module form of :func:`clamped_swiglu`: ``ClampedSwiGLU(clamp_limit)(x, weight, group_index)``."""

    def __init__(self, clamp_limit: float = 0.0, *, backend: str = "auto"):
        super().__init__()
        self.clamp_limit = clamp_limit
        self.backend = backend

    def forward(self, x, weight=None, group_index=None):
        return clamped_swiglu(x, weight, group_index, self.clamp_limit, backend=self.backend)

    def extra_repr(self) -> str:
        return f"clamp_limit={self.clamp_limit}, backend={self.backend!r}"


# ----------------------------------------------------------------------------------- MX-quantised backward


@dataclass
class MXGradient:
    """The MX-quantised gradient of x, filled in by the backward of :func:`swiglu_mx_backward`.

    ``y1``/``mxscale1``: row-wise blocks (32 columns; operand of the dgrad GEMM). ``y2``/``mxscale2``:
    column-wise blocks (32 tokens, restarting at every group; operand of the wgrad GEMM). Scales are in
    Ascend's paired layout; :mod:`swiglu_ops.layouts` converts them to plain or cuBLAS blocked layouts.
    """

    y1: torch.Tensor | None = None
    mxscale1: torch.Tensor | None = None
    y2: torch.Tensor | None = None
    mxscale2: torch.Tensor | None = None
    group_index: torch.Tensor | None = None


class _SwiGLUMXFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group_index, activate_left, scale_alg, dst_dtype, backend, capture):
        _api.validate_mx_quant(x, _half(x), group_index, activate_left, "rint", scale_alg, dst_dtype, 0.0)
        n = x.shape[-1] // 2
        a, b = (x[..., :n], x[..., n:]) if activate_left else (x[..., n:], x[..., :n])
        ctx.save_for_backward(x, group_index)
        ctx.options = dict(
            activate_left=activate_left, scale_alg=scale_alg, dst_dtype=dst_dtype, backend=backend
        )
        ctx.capture = capture
        return (F.silu(a.float()) * b.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        x, group_index = ctx.saved_tensors
        y1, s1, y2, s2 = _ops.swiglu_backward_mx_quant_dual_axis(
            x, grad_y.to(x.dtype), group_index, **ctx.options
        )
        if ctx.capture is not None:
            ctx.capture.y1, ctx.capture.mxscale1, ctx.capture.y2, ctx.capture.mxscale2 = y1, s1, y2, s2
            ctx.capture.group_index = group_index
        return mx_dequantize(y1, s1, axis=-1, dtype=x.dtype), None, None, None, None, None, None


def swiglu_mx_backward(
    x,
    group_index=None,
    *,
    activate_left=True,
    scale_alg=1,
    dst_dtype=torch.float8_e4m3fn,
    backend="auto",
    capture: MXGradient | None = None,
):
    """Plain SwiGLU ``y = silu(A) * B`` whose gradient is MX-quantised by the fused operator.

    The forward is exact (fp32 math rounded to x's dtype). The backward runs
    ``swiglu_backward_mx_quant_dual_axis`` (no clamp, no routing weight: it is the plain SwiGLU backward) and
    returns the **row-wise** dequantised gradient ``fp8(y1) * 2**(mxscale1 - 127)`` in x's dtype to autograd,
    i.e. the gradient a dgrad GEMM on ``(y1, mxscale1)`` sees. Pass an :class:`MXGradient` as ``capture`` to
    also receive the quantised tensors (``y1``, ``mxscale1``, ``y2``, ``mxscale2``) for FP8 GEMMs (eager
    mode only: ``torch.compile`` rejects the backward's write to an outside object; compile without it).

    Args:
        x: ``[..., M, 2N]`` bf16/fp16/fp32 with ``2N % 64 == 0``; A is the left half if ``activate_left``.
        group_index: 1-D int64/int32 cumulative row **ends** (2-D x only); token-axis blocks restart at every
            group start. Must end at M.
        scale_alg, dst_dtype, backend: as in :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis`.
    """
    return _SwiGLUMXFunction.apply(x, group_index, activate_left, scale_alg, dst_dtype, backend, capture)
