"""Reference SwigluBackwardMxQuantWithDualAxis: ``docs/operators.md`` section 2.

Stage 1 (fp32 SwiGLU backward in the kernel's operation order, rounded to x's dtype) then stage 2 (MX
quantisation of those 16-bit values along both axes, :mod:`.dual_axis`) built from the rules in
:mod:`swiglu_ops.numerics.mx`.
"""

from __future__ import annotations

import torch

from ...numerics import glu as glu_math
from ...numerics.glu import GluParams
from .dual_axis import quantize_dual_axis


def stage1(x: torch.Tensor, dy: torch.Tensor, glu: GluParams) -> torch.Tensor:
    """grad_x in x's dtype and x's column layout (spec 2.2-2.4; contract: columns follow x): the GLU
    family's backward (plain SwiGLU by default, clipped SwiGLU with the GPT-OSS parameters), rounded."""
    return glu_math.backward_rounded(x, dy, glu)


def swiglu_bwd_mx_quant(x, dy, group_ends, glu, scale_alg, fmt, y1, s1, y2, s2, transpose_y2=False) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y1, s1, y2, s2."""
    grad = stage1(x, dy, glu)  # [B, M, C] in x's dtype
    quantize_dual_axis(grad, group_ends, fmt, scale_alg, "rint", y1, s1, y2, s2, transpose_y2)
