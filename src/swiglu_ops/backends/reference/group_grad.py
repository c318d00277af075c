"""Reference SwigluGroupGrad: ``docs/operators.md`` section 1 (``swiglu_group_grad.md`` section 9), step
by step.

Readable, not fast. fp32 throughout, the kernel's operation order, one rounding per operation (every
multiply/add is a separate PyTorch op on whole tensors, so nothing can be contracted into an FMA), masks
multiplied (never selected), and grad_weight in NumPy's float32 pairwise order.
"""

from __future__ import annotations

import torch


def numpy_pairwise_sum(a: torch.Tensor) -> torch.Tensor:
    """Row sums of fp32 ``a[R, n]`` in exactly NumPy's float32 pairwise order, without the final ``0.0 +``.

    Spec section 5: n < 8 -> sequential from -0.0; 8 <= n <= 128 -> eight strided accumulators combined as
    ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) then the n % 8 tail sequentially; n > 128 -> split at n/2 rounded down
    to a multiple of 8 and add the two halves' sums.
    """
    n = a.shape[1]
    if n < 8:
        res = torch.full(a.shape[:1], -0.0, dtype=torch.float32, device=a.device)
        for i in range(n):
            res = res + a[:, i]
        return res
    if n <= 128:
        r = a[:, 0:8].clone()
        body = n - n % 8
        for i in range(8, body, 8):
            r = r + a[:, i : i + 8]
        res = ((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))
        for i in range(body, n):
            res = res + a[:, i]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return numpy_pairwise_sum(a[:, :n2]) + numpy_pairwise_sum(a[:, n2:])


def grad_weight_sum(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The routing-weight gradient of both operators that have one, [rows] fp32: ``0.0 +`` the NumPy pairwise
    sum of ``fp32(dy) * fp32(y)`` over the last axis (the ``0.0 +`` makes a -0.0 sum +0.0)."""
    n = y.shape[-1]
    return 0.0 + numpy_pairwise_sum(dy.float().reshape(-1, n) * y.float().reshape(-1, n))


def swiglu_group_grad(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes grad_x/grad_weight."""
    rows, hidden = dy.shape
    dy = dy.float()
    xf = x.float()
    g, u = xf[:, :hidden], xf[:, hidden:]

    has_clamp = clamp > 0
    if has_clamp:
        c = torch.tensor(clamp, dtype=torch.float32, device=x.device)
        # Masks from the ORIGINAL inputs, open intervals; NaN compares false -> mask 0.
        m_g = (g < c).float()
        m_u = ((u < c) & (-u < c)).float()
        g = torch.minimum(g, c)  # NaN-propagating
        u = torch.minimum(torch.maximum(u, -c), c)

    s = 1.0 / (1.0 + torch.exp(-g))
    f = g * s
    f = torch.where(g == -torch.inf, torch.zeros_like(f), f)  # -inf * 0 = NaN -> 0
    sp = (s + f) - (f * s)  # silu'(g) = s + f - f*s
    sp = torch.where(g == torch.inf, torch.ones_like(sp), sp)
    sp = torch.where(g == -torch.inf, torch.zeros_like(sp), sp)

    dg = dy * sp
    dg = dg * u
    du = dy * f
    if weight is not None:
        w = weight.reshape(rows, 1)
        dg = dg * w
        du = du * w
    if has_clamp:
        dg = dg * m_g
        du = du * m_u
    if valid_rows is not None:
        m_r = (torch.arange(rows, device=x.device) < valid_rows).float().unsqueeze(1)
        dg = dg * m_r
        du = du * m_r

    grad_x[:, :hidden] = dg.to(grad_x.dtype)  # RNE; fp16 overflow -> inf
    grad_x[:, hidden:] = du.to(grad_x.dtype)

    if grad_weight is not None:
        grad_weight.copy_(grad_weight_sum(dy, y_origin))  # grad_weight is never masked
