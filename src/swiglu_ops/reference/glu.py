"""The GLU family's math in readable PyTorch: one function per direction, the variant chosen by
:class:`swiglu_ops.glu.GluParams`, each CANN operator's own operation order.

Every operation is a separate fp32 PyTorch op on whole tensors (nothing can be contracted into an FMA), in
the order of the operator documents; ``min``/``max`` propagate NaN. The inputs are the fp32 widenings of the
activated half ``a`` (A), the linear half ``b`` (B) and, for the backward, the upstream gradient ``dy``.

- plain SwiGLU (``glu.clipped`` false):
  forward = SwigluMxQuantWithDualAxis stage 1 (``swiglu_mx_quant.md`` 2.2): ``(a / (exp(a * -1) + 1)) * b``;
  backward = SwigluBackwardMxQuantWithDualAxis stage 1 (``swiglu_backward_mx_quant.md`` 2.2).
- clipped SwiGLU (GPT-OSS): ClippedSwiglu (``clipped_swiglu.md`` 3.1 / 3.2) and ClippedSwigluGrad (4; the
  clamp_mode 1 backward is the library extension of its section 10).
"""

from __future__ import annotations

import torch

from ..glu import GluParams


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
