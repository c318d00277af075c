"""swiglu_ops: Ascend's fused SwiGLU-backward MoE operators for PyTorch on CPU and NVIDIA GPUs.

- :func:`swiglu_group_grad`: clamped SwiGLU backward with a per-token routing weight, a row mask from
  ``group_index`` (counts) and the routing-weight gradient (CANN ``SwigluGroupGrad``).
- :func:`swiglu_backward_mx_quant_dual_axis`: SwiGLU backward fused with dual-axis MX (FP8 + E8M0) block
  quantisation, token-axis blocks restarting at every expert group (CANN
  ``SwigluBackwardMxQuantWithDualAxis``).
- :func:`mx_dequantize`: the inverse of the quantisation.

Every function takes ``backend=`` ("auto", "reference", "cpu", "triton").
"""

from __future__ import annotations

import torch

from . import _api, layouts, torch_ops  # noqa: F401  (torch_ops registers torch.ops.swiglu_ops.*)
from ._api import available_backends
from .mx import mx_dequantize
from .nn import ClampedSwiGLU, MXGradient, clamped_swiglu, swiglu_mx_backward

__version__ = "0.1.0"


def swiglu_group_grad(
    grad_y, x, weight=None, y_origin=None, group_index=None, clamp_limit=0.0, *, backend="auto", out=None
):
    """Backward of ``y = silu(min(g, c)) * clip(u, -c, c) * weight`` with a group row mask.

    Args:
        grad_y: ``[..., H]`` bf16/fp16/fp32 upstream gradient (rank >= 2; leading dims are rows).
        x: ``[..., 2H]`` forward input, same dtype; gate ``g = x[..., :H]``, up ``u = x[..., H:]``.
        weight: fp32 per-row routing weight with ``numel == rows`` (any shape), or None.
        y_origin: ``[..., H]`` forward output; required exactly when ``weight`` is given.
        group_index: 1-D int64/int32 group **counts**; rows ``>= clamp(sum, 0, rows)`` get zero gradient.
        clamp_limit: ``0`` disables the clamp; ``> 0`` (``inf`` included) enables open-interval masks.
        backend: "auto", "reference", "cpu" or "triton".
        out: optional preallocated ``(grad_x, grad_weight)`` to write into.

    Returns:
        ``(grad_x, grad_weight)``: grad_x like x in grad_y's dtype; grad_weight fp32 in weight's shape
        (``None`` without weight) equal to ``sum_h fp32(grad_y) * fp32(y_origin)`` in NumPy pairwise order.
        It is **not** divided by weight: pass the *unweighted* forward output as ``y_origin`` to get the
        true dL/dweight (``swiglu_ops.ClampedSwiGLU`` does this).
    """
    return _api.swiglu_group_grad(
        grad_y, x, weight, y_origin, group_index, clamp_limit, backend=backend, out=out
    )


def swiglu_backward_mx_quant_dual_axis(
    x,
    y_grad,
    group_index=None,
    *,
    activate_left=True,
    round_mode="rint",
    scale_alg=1,
    dst_dtype=torch.float8_e4m3fn,
    max_dtype_value=0.0,
    backend="auto",
    out=None,
):
    """SwiGLU backward, rounded to x's dtype, then MX-quantised along both axes in one pass.

    Args:
        x: ``[..., M, 2N]`` (rank 2..6) bf16/fp16/fp32, ``2N % 64 == 0``; A = left half if ``activate_left``.
        y_grad: ``[..., M, N]``, same dtype.
        group_index: 1-D int64/int32 cumulative row **ends** (2-D x only); token-axis blocks restart at
            every group start.
        scale_alg: 1 = RCEIL ("cuBLAS", default), 0 = OCP floor.
        dst_dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
        round_mode / max_dtype_value: must be "rint" / 0.0 (Ascend's only accepted values).
        backend: "auto", "reference", "cpu" or "triton".
        out: optional preallocated ``(y1, mxscale1, y2, mxscale2)``.

    Returns:
        ``(y1, mxscale1, y2, mxscale2)``: y1/y2 like x in dst_dtype; mxscale1 ``[..., M, 2N/64, 2]`` and
        mxscale2 ``[..., R, 2N, 2]`` (``R = M//64 + G`` with groups, else ``ceil(M/64)``) as
        ``torch.float8_e8m0fnu`` (``.view(torch.uint8)`` gives the raw E8M0 codes).
    """
    return _api.swiglu_backward_mx_quant_dual_axis(
        x,
        y_grad,
        group_index,
        activate_left=activate_left,
        round_mode=round_mode,
        scale_alg=scale_alg,
        dst_dtype=dst_dtype,
        max_dtype_value=max_dtype_value,
        backend=backend,
        out=out,
    )


__all__ = [
    "swiglu_group_grad",
    "swiglu_backward_mx_quant_dual_axis",
    "mx_dequantize",
    "available_backends",
    "layouts",
    "ClampedSwiGLU",
    "clamped_swiglu",
    "swiglu_mx_backward",
    "MXGradient",
    "__version__",
]
