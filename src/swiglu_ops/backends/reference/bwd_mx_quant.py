"""Reference SwigluBackwardMxQuantWithDualAxis: ``docs/operators.md`` section 2.

Stage 1 (fp32 SwiGLU backward in the kernel's operation order, rounded to x's dtype) then stage 2 (MX
quantisation of those 16-bit values along both axes, :mod:`.dual_axis`) built from the rules in
:mod:`swiglu_ops.numerics.mx`. With a routing weight (spec 7.1) stage 1 is multiplied by it per row, and the
routing-weight gradient is the pairwise sum of ``dy * act16`` per row.
"""

from __future__ import annotations

import torch

from ...numerics import glu as glu_math
from ...numerics.glu import GluParams
from . import fwd_mx_quant
from .dual_axis import quantize_dual_axis
from .group_grad import grad_weight_sum


def stage1(x: torch.Tensor, dy: torch.Tensor, glu: GluParams, weight: torch.Tensor | None = None):
    """grad_x in x's dtype and x's column layout (spec 2.2-2.4; contract: columns follow x): the GLU
    family's backward (plain SwiGLU by default, clipped SwiGLU with the GPT-OSS parameters), rounded.

    ``weight`` (spec 7.1; fp32, B*M elements) or None: both fp32 gradient halves are multiplied by
    ``w[row]`` as their last fp32 operation (after every mask and select), before the rounding."""
    return glu_math.backward_rounded(x, dy, glu, weight)


def grad_weight_of(x: torch.Tensor, dy: torch.Tensor, glu: GluParams) -> torch.Tensor:
    """dL/dweight of the weighted forward (spec 7.1), [B*M] fp32: ``0.0 + pairwise_fp32_sum(fp32(dy) *
    fp32(act16))`` over the hidden axis in NumPy's pairwise order, ``act16`` = the forward operator's
    unweighted stage 1 with the same GLU parameters, rounded to x's dtype. Every row, whatever the groups:
    exactly :func:`.group_grad.swiglu_group_grad`'s grad_weight for ``y_origin = act16``.
    """
    return grad_weight_sum(dy, fwd_mx_quant.stage1(x, glu))  # act16: [B, M, N] in x's dtype


def swiglu_bwd_mx_quant(
    x, dy, group_ends, glu, scale_alg, fmt, y1, s1, y2, s2, transpose_y2=False, weight=None, grad_weight=None
) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y1, s1, y2, s2 and, with
    ``weight`` (spec 7.1), ``grad_weight`` [B*M] fp32 (None exactly when weight is None)."""
    grad = stage1(x, dy, glu, weight)  # [B, M, C] in x's dtype
    quantize_dual_axis(grad, group_ends, fmt, scale_alg, "rint", y1, s1, y2, s2, transpose_y2)
    if weight is not None:
        grad_weight.copy_(grad_weight_of(x, dy, glu).reshape(grad_weight.shape))
