"""The GLU family: which variant of the SwiGLU math an operator computes, as one set of parameters.

Every operator of the library is the same elementwise math on pairs ``(A, B)`` taken from the two halves of
``x``: the activated half A and the linear half B. The operators differ only in a handful of parameters
(spec README section 6.2, after TransformerEngine's activation functors):

- the **split**: chunked (A and B are the two halves of the row) or interleaved (A and B are the even and
  odd elements of the row), and which of the two is A (``activate_left``);
- the **variant**: CANN's plain SwiGLU (``silu(A) * B``; SwigluBackwardMxQuantWithDualAxis,
  SwigluMxQuantWithDualAxis) or the clipped SwiGLU of GPT-OSS (ClippedSwiglu / ClippedSwigluGrad:
  ``A~ * sigmoid(alpha * A~) * (clip(B, -limit, limit) + bias)`` with ``A~ = min(A, limit)``, closed masks in
  the backward, and ``clamp_mode``);
- what happens to the result (stored, or quantised along one or both axes): that is the operator.

:class:`GluParams` is that parameter set. The API validates the user's arguments into one, and every backend
receives it (the kernel contract in :mod:`swiglu_ops._api`). The math of each variant, in each CANN
operator's own operation order, is in :mod:`swiglu_ops.reference.glu` (the readable version) and in each
backend's one parametrized kernel family. ``swiglu_group_grad`` (SwigluGroupGrad) is the family's third
variant; its clamp and routing weight are arguments of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GluParams", "SWIGLU", "split_columns"]


@dataclass(frozen=True)
class GluParams:
    """One member of the GLU family (see the module docstring).

    Attributes:
        interleaved: A and B are the even/odd elements of each row (GPT-OSS's ``[..., ::2]`` /
            ``[..., 1::2]``) instead of its two halves.
        activate_left: chunked: A is the left half; interleaved: A is the even elements. ``False`` swaps them.
        clipped: the GPT-OSS variant (ClippedSwiglu / ClippedSwigluGrad) with ``alpha``, ``limit``, ``bias``
            and ``clamp_mode``; ``False``: CANN's plain SwiGLU, ``silu(A) * B`` (the others are unused).
        alpha: scale inside the sigmoid (fp32-exact value).
        limit: clamp limit, ``> 0`` (fp32-exact value; ``inf`` makes the clamps no-ops).
        bias: added to the clipped linear half (fp32-exact value).
        clamp_mode: 0 = clamp A before the activation (GPT-OSS); 1 = clamp the activation's output
            (alpha and bias unused, CANN ClippedSwigluV2).
    """

    interleaved: bool = False
    activate_left: bool = True
    clipped: bool = False
    alpha: float = 1.0
    limit: float = math.inf
    bias: float = 0.0
    clamp_mode: int = 0

    @property
    def a_index(self) -> int:
        """Which of the two parts of a row A is: 0 (left half / even elements) or 1 (right half / odd)."""
        return 0 if self.activate_left else 1


#: CANN's plain SwiGLU, chunked, A = left half: the default stage 1 of both MX operators.
SWIGLU = GluParams()


def split_columns(cols: int, glu: GluParams) -> tuple[slice, slice]:
    """The column slices of A and B in a row of ``cols`` (even) elements."""
    half = cols // 2
    if glu.interleaved:
        parts = (slice(0, cols, 2), slice(1, cols, 2))
    else:
        parts = (slice(0, half), slice(half, cols))
    return (parts[0], parts[1]) if glu.activate_left else (parts[1], parts[0])
