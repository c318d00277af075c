"""Reference SwigluMxQuantWithDualAxis: ``docs/operators.md`` section 4.

Stage 1: the GLU family's forward (CANN's plain SwiGLU ``(A / (exp(A * -1) + 1)) * B`` by default, the
clipped SwiGLU of GPT-OSS with its parameters) in fp32 (with a routing weight, multiplied by it per row
last, spec 7.1), rounded to x's dtype (spec 2.3; fp32 x is not rounded). Stage 2: MX quantisation of those
values along both axes (:mod:`.dual_axis`), with the rules of :mod:`swiglu_ops.numerics.mx` (FP8 or FP4
elements, RCEIL or OCP scales, the round mode).
"""

from __future__ import annotations

import torch

from ...numerics import glu as glu_math
from ...numerics.glu import GluParams
from .dual_axis import quantize_dual_axis


def stage1(x: torch.Tensor, glu: GluParams, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The activation ``[B, M, N]`` in x's dtype (spec 2.2 / 2.3): A and B taken by ``glu`` (chunked or
    interleaved, ``activate_left``), the fp32 math of :func:`swiglu_ops.numerics.glu.forward`, one RNE
    rounding without saturation (an fp16 result above 65504 becomes inf).

    ``weight`` (spec 7.1; fp32, B*M elements, ``w[row] = weight[b*M + m]``) or None: the fp32 activation
    is multiplied by ``w[row]`` as its last fp32 operation (the IEEE product), before the rounding. Without
    it (the backward's ``act16``) the result is the unweighted stage 1."""
    return glu_math.forward_rounded(x, glu, weight)


def swiglu_mx_quant(
    x, group_ends, glu, scale_alg, fmt, round_mode, y1, s1, y2, s2, transpose_y2=False, weight=None
) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y1, s1, y2, s2.

    ``weight`` (spec 7.1) scales stage 1 per row; rows past the last group end stay 0 in every output
    whatever their weight (stage 2 zeroes them)."""
    act = stage1(x, glu, weight)  # [B, M, N] in x's dtype
    quantize_dual_axis(act, group_ends, fmt, scale_alg, round_mode, y1, s1, y2, s2, transpose_y2)
