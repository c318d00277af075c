"""The GLU family: which variant of the SwiGLU math an operator computes (:class:`GluParams`), and that math.

Every operator of the library is the same elementwise math on pairs ``(A, B)`` taken from the two halves of
``x``: the activated half A and the linear half B. The operators differ only in a handful of parameters
(after TransformerEngine's activation functors):

- the **split**: chunked (A and B are the two halves of the row) or interleaved (A and B are the even and
  odd elements of the row), and which of the two is A (``activate_left``);
- the **variant**: CANN's plain SwiGLU (``silu(A) * B``; SwigluBackwardMxQuantWithDualAxis,
  SwigluMxQuantWithDualAxis) or the clipped SwiGLU of GPT-OSS (ClippedSwiglu / ClippedSwigluGrad:
  ``A~ * sigmoid(alpha * A~) * (clip(B, -limit, limit) + bias)`` with ``A~ = min(A, limit)``, closed masks in
  the backward, and ``clamp_mode``);
- what happens to the result (stored, or quantised along one or both axes): that is the operator.

:class:`GluParams` is that parameter set: the operator layer validates the user's arguments into one and
every backend receives it. :func:`forward` and :func:`backward` are the math of each variant in each CANN
operator's own operation order, written once in readable PyTorch: the reference backend is built from them,
the training layer's bf16 baselines use them, and every fast backend's kernels are tested against them.
Every operation is a separate fp32 PyTorch op on whole tensors (nothing can be contracted into an FMA), in
the order of the operator documents; ``min``/``max`` propagate NaN.

- plain SwiGLU (``glu.clipped`` false): forward = SwigluMxQuantWithDualAxis stage 1,
  ``(a / (exp(a * -1) + 1)) * b``; backward = SwigluBackwardMxQuantWithDualAxis stage 1.
- clipped SwiGLU (GPT-OSS): ClippedSwiglu and ClippedSwigluGrad (the clamp_mode 1 backward is the library's
  extension: the exact derivative of the clamp_mode 1 forward).

``swiglu_group_grad`` (SwigluGroupGrad) is the family's third variant; its clamp and routing weight are
arguments of its own (:mod:`swiglu_ops.backends.reference.group_grad`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "GluParams",
    "SWIGLU",
    "split_columns",
    "fp32_value",
    "fp32_bits",
    "forward",
    "backward",
    "forward_rounded",
    "backward_rounded",
    "act16_product",
]


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


def fp32_value(value: float) -> float:
    """``value`` rounded to the nearest fp32 (ties to even; overflow to inf), in plain Python arithmetic so
    that torch.compile traces it as a constant (``float(torch.tensor(v))`` would graph-break): how CANN's
    float attributes (alpha, limit, bias, clamp_limit) reach the kernels."""
    if value != value or value in (math.inf, -math.inf) or value == 0.0:
        return float(value)
    mant, exp = math.frexp(value)  # value = mant * 2**exp, 0.5 <= |mant| < 1
    bits = 24 if exp >= -125 else exp + 149  # fp32 significand bits at this exponent (subnormals: fewer)
    if bits < 0:
        return math.copysign(0.0, value)
    rounded = math.ldexp(float(round(math.ldexp(mant, bits))), exp - bits)  # round(): ties to even
    if abs(rounded) > FP32_MAX:
        return math.copysign(math.inf, value)
    return rounded if rounded != 0.0 else math.copysign(0.0, value)


FP32_MAX = 3.4028234663852886e38


def fp32_bits(value: float) -> int:
    """The IEEE bits of ``value``, a Python float that is an fp32 value exactly (:func:`fp32_value`'s
    results are), by integer arithmetic, so that no C conversion (which obeys the calling thread's
    flush-to-zero) takes part. NaN gives the canonical 0x7FC00000."""
    sign = 0x80000000 if math.copysign(1.0, value) < 0 else 0
    magnitude = abs(value)
    if magnitude != magnitude:
        return 0x7FC00000
    if magnitude == math.inf:
        return sign | 0x7F800000
    if magnitude == 0.0:
        return sign
    mant, exp = math.frexp(magnitude)  # magnitude = mant * 2**exp, 0.5 <= mant < 1 (exact)
    if exp - 1 >= -126:  # normal: 1.f * 2**(exp - 1), 24 significant bits
        return sign | (exp - 1 + 127) << 23 | (int(math.ldexp(mant, 24)) - (1 << 23))
    return sign | int(math.ldexp(magnitude, 149))  # subnormal: a multiple of 2**-149


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _clip(b: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """``max(min(b, L), -L)``, NaN-propagating."""
    return torch.maximum(torch.minimum(b, limit), -limit)


def forward(a: torch.Tensor, b: torch.Tensor, glu: GluParams) -> torch.Tensor:
    """The activation output ``y`` in fp32 (before the rounding to the I/O dtype)."""
    if not glu.clipped:
        return (a / (torch.exp(a * -1.0) + 1.0)) * b
    limit = _scalar(glu.limit, a)
    if glu.clamp_mode == 0:
        at = torch.minimum(a, limit)
        den = torch.exp(at * -glu.alpha) + 1.0
        return (at / den) * (_clip(b, limit) + glu.bias)
    silu = a / (torch.exp(a * -1.0) + 1.0)
    return torch.minimum(silu, limit) * _clip(b, limit)


def backward(a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor, glu: GluParams):
    """``(grad_a, grad_b)`` in fp32 (before the rounding to the I/O dtype)."""
    if not glu.clipped:
        s = 1.0 / (1.0 + torch.exp(-a))
        t = ((-s) + 1.0) * a + 1.0
        return ((t * b) * s) * dy, (s * dy) * a
    limit = _scalar(glu.limit, a)
    zero = torch.zeros((), dtype=torch.float32, device=a.device)
    b_ok = (b <= limit) & (b >= -limit)  # closed masks on the raw inputs; NaN -> masked
    if glu.clamp_mode == 0:
        at = torch.minimum(a, limit)
        den = torch.exp(at * -glu.alpha) + 1.0
        s = (at * 0.0 + 1.0) / den
        bp = _clip(b, limit) + glu.bias
        db = (dy * at) * s
        t = (s * -1.0) + 1.0
        t = ((((t * at) * glu.alpha) + 1.0) * s) * bp
        da = t * dy
        a_ok = a <= limit
    else:  # library extension: the exact derivative of the clamp_mode 1 forward (clipped_swiglu.md 10)
        den = torch.exp(a * -1.0) + 1.0
        silu = a / den
        s = 1.0 / den
        db = dy * torch.minimum(silu, limit)
        t = ((((s * -1.0) + 1.0) * a + 1.0) * s) * _clip(b, limit)
        da = t * dy
        a_ok = silu <= limit
    return torch.where(a_ok, da, zero), torch.where(b_ok, db, zero)


def _row_weight(weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (fp32, one per row of x's flattened leading dims) as a column to multiply rows by."""
    return None if weight is None else weight.reshape(*x.shape[:-1], 1)


def forward_rounded(x: torch.Tensor, glu: GluParams, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The activation of ``x [..., 2N]`` (A and B taken by ``glu``): :func:`forward` in fp32, rounded once to
    x's dtype (RNE, no saturation: an fp16 result above 65504 becomes inf). The dual-axis forward
    operator's stage 1. With a routing ``weight`` (fp32, one per row) the fp32 activation is multiplied by
    its row's weight as the last fp32 operation, after every mask and select, then rounded (spec 7.1)."""
    a_cols, b_cols = split_columns(x.shape[-1], glu)
    xf = x.float()
    act = forward(xf[..., a_cols], xf[..., b_cols], glu)
    w = _row_weight(weight, x)
    return (act if w is None else act * w).to(x.dtype)


def backward_rounded(
    x: torch.Tensor, dy: torch.Tensor, glu: GluParams, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of ``x [..., 2N]`` for ``dy [..., N]`` in x's column layout (the gradient of column j of
    x is in column j): :func:`backward` in fp32, rounded once to x's dtype. The dual-axis backward
    operator's stage 1; a routing ``weight`` multiplies both fp32 halves as their last operation."""
    a_cols, b_cols = split_columns(x.shape[-1], glu)
    xf = x.float()
    grad_a, grad_b = backward(xf[..., a_cols], xf[..., b_cols], dy.float(), glu)
    w = _row_weight(weight, x)
    if w is not None:
        grad_a, grad_b = grad_a * w, grad_b * w
    grad = torch.empty_like(xf)
    grad[..., a_cols] = grad_a
    grad[..., b_cols] = grad_b
    return grad.to(x.dtype)


def act16_product(dy: torch.Tensor, x: torch.Tensor, glu: GluParams) -> torch.Tensor:
    """``fp32(dy) * fp32(act16)`` elementwise, ``act16`` = :func:`forward_rounded` of ``x`` without a
    weight (the unweighted activation in x's dtype): the terms whose per-row sum is dL/dweight of the
    weighted forward (spec 7.1). ``dy`` has ``act16``'s shape ``[..., N]``."""
    return dy.float() * forward_rounded(x, glu).float()
