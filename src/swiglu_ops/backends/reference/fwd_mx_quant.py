"""Reference SwigluMxQuantWithDualAxis: ``docs/operators.md`` section 4.

Stage 1: the GLU family's forward (CANN's plain SwiGLU ``(A / (exp(A * -1) + 1)) * B`` by default, the
clipped SwiGLU of GPT-OSS with its parameters) in fp32, rounded to x's dtype (spec 2.3; fp32 x is not
rounded). Stage 2: MX quantisation of those values along both axes (:mod:`.dual_axis`), with the rules of
:mod:`swiglu_ops.numerics.mx` (FP8 or FP4 elements, RCEIL or OCP scales, the round mode).
"""

from __future__ import annotations

import torch

from ...numerics import glu as glu_math
from ...numerics.glu import GluParams
from .dual_axis import quantize_dual_axis


def stage1(x: torch.Tensor, glu: GluParams) -> torch.Tensor:
    """The activation ``[.., M, N]`` in x's dtype (spec 2.2 / 2.3): A and B taken by ``glu`` (chunked or
    interleaved, ``activate_left``), the fp32 math of :func:`swiglu_ops.numerics.glu.forward`, one RNE
    rounding without saturation (an fp16 result above 65504 becomes inf)."""
    return glu_math.forward_rounded(x, glu)


def swiglu_mx_quant(
    x, group_ends, glu, scale_alg, fmt, round_mode, y1, s1, y2, s2, transpose_y2=False
) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y1, s1, y2, s2."""
    act = stage1(x, glu)  # [B, M, N] in x's dtype
    quantize_dual_axis(act, group_ends, fmt, scale_alg, round_mode, y1, s1, y2, s2, transpose_y2)
