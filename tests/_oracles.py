"""Independent oracles: inputs whose quantised gradient is known exactly, the block layouts of spec section 4
written as plain loops, and float64 autograd of the clamped SwiGLU forward.

None of these call a backend, so a test built on them can fail on the reference backend too.
"""

from __future__ import annotations

import torch

from swiglu_ops.numerics import mx

#: sigma(ACT) == 1 exactly in fp32 (exp(-32) < 2**-25), so in spec 2.2 t = ((-1) + 1) * ACT + 1 = 1.
ACT = 32.0


def known_gradient_inputs(values: torch.Tensor, *, activate_left: bool = True):
    """``(x, y_grad, grad)`` such that the mx op's rounded stage-1 gradient is exactly ``grad``.

    With A = 32 and B = 1 the kernel's operation order gives gA = ((1 * 1) * 1) * g = g and
    gB = (1 * g) * 32 = 32 g, both exact (32 g overflows to inf only beyond dtype max / 32). ``values`` is
    y_grad ``[..., M, N]`` in x's dtype; ``grad`` is ``[..., M, 2N]`` in x's column layout.
    """
    a = torch.full_like(values, ACT)
    b = torch.ones_like(values)
    ga, gb = values, (values.float() * ACT).to(values.dtype)
    if activate_left:
        return torch.cat([a, b], dim=-1), values, torch.cat([ga, gb], dim=-1)
    return torch.cat([b, a], dim=-1), values, torch.cat([gb, ga], dim=-1)


def _group_ranges(m: int, group_index):
    if group_index is None:
        return [(0, m)], [0]
    ranges, start = [], 0
    for end in group_index.tolist():
        ranges.append((start, end))
        start = end
    return ranges, [s // 64 + g for g, (s, _) in enumerate(ranges)]


def _quantize_slice(grad: torch.Tensor, group_index, fmt: mx.FP8Format, scale_alg: int):
    m, c = grad.shape
    y1 = torch.zeros(m, c, dtype=torch.uint8)
    s1 = torch.zeros(m, c // 32, dtype=torch.uint8)
    for k in range(c // 32):  # -1 axis: one 32-column block at a time
        codes, scale = mx.quantize_blocks(grad[:, 32 * k : 32 * k + 32], 1, fmt, scale_alg)
        y1[:, 32 * k : 32 * k + 32] = codes
        s1[:, k] = scale.to(torch.uint8)
    ranges, bases = _group_ranges(m, group_index)
    y2 = torch.zeros(m, c, dtype=torch.uint8)
    s2 = torch.zeros(
        mx.mxscale2_rows(m, None if group_index is None else len(ranges)), c, 2, dtype=torch.uint8
    )
    for (start, end), base in zip(ranges, bases, strict=True):
        for t, r0 in enumerate(range(start, end, 32)):  # -2 axis: blocks restart at the group start
            r1 = min(r0 + 32, end)
            block = torch.zeros(32, c, dtype=grad.dtype)
            block[: r1 - r0] = grad[r0:r1]  # zero padding, never rows of the next group
            codes, scale = mx.quantize_blocks(block, 0, fmt, scale_alg)
            y2[r0:r1] = codes[: r1 - r0]
            s2[base + t // 2, :, t % 2] = scale.to(torch.uint8)
    return y1, s1, y2, s2


def expected_mx(grad: torch.Tensor, group_index=None, *, dst_dtype=torch.float8_e4m3fn, scale_alg: int = 1):
    """``(y1, mxscale1, y2, mxscale2)`` for a known stage-1 gradient ``[..., M, C]`` (spec 4.1 / 4.2)."""
    fmt = mx.fp8_format(dst_dtype)
    *lead, m, c = grad.shape
    slices = [_quantize_slice(g, group_index, fmt, scale_alg) for g in grad.reshape(-1, m, c)]
    y1, s1, y2, s2 = (torch.stack(parts) for parts in zip(*slices, strict=True))
    return (
        y1.reshape(*lead, m, c).view(dst_dtype),
        s1.reshape(*lead, m, c // 64, 2).view(torch.float8_e8m0fnu),
        y2.reshape(*lead, m, c).view(dst_dtype),
        s2.reshape(*lead, *s2.shape[1:]).view(torch.float8_e8m0fnu),
    )


def autograd_group_grad(dy, x, weight=None, clamp: float = 0.0) -> torch.Tensor:
    """float64 grad_x of ``sum(dy * silu(min(g, c)) * clip(u, -c, c) * w)`` (no clamp when c == 0)."""
    g, u = (t.detach().double().requires_grad_() for t in x.chunk(2, dim=-1))
    if clamp > 0:
        y = torch.nn.functional.silu(torch.clamp(g, max=clamp)) * torch.clamp(u, -clamp, clamp)
    else:
        y = torch.nn.functional.silu(g) * u
    if weight is not None:
        y = y * weight.double().reshape(*y.shape[:-1], 1)
    (y * dy.double()).sum().backward()
    return torch.cat([g.grad, u.grad], dim=-1)


_SMALLEST_SUBNORMAL = {torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24, torch.float32: 2.0**-149}
#: Relative rounding of the final cast (half an ulp) plus a margin for fp32 intermediates.
_REL = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-20}


def assert_close_to_autograd(grad_x, dy, x, weight=None, clamp: float = 0.0, valid_rows=None) -> None:
    """grad_x within rounding of the float64 gradient; rows >= ``valid_rows`` exactly +-0.

    Tolerance per element: the final cast's relative rounding, plus fp32 error of silu' = s + f - f*s,
    whose terms reach 1 + 2|g| while the result may cancel: ``2**-19 * |dy u w| (1 + 2|g|)`` for dg and
    ``2**-19 * |dy g w|`` for du, plus the dtype's smallest subnormal (results that underflow).
    Callers keep inputs away from the clamp boundaries, where the derivative jumps.
    """
    expected = autograd_group_grad(dy, x, weight, clamp)
    g, u = x.double().chunk(2, dim=-1)
    dyw = dy.double().abs()
    if weight is not None:
        dyw = dyw * weight.double().abs().reshape(*dy.shape[:-1], 1)
    err = torch.cat([dyw * u.abs() * (1 + 2 * g.abs()), dyw * g.abs()], dim=-1) * 2.0**-19
    tiny = _SMALLEST_SUBNORMAL[grad_x.dtype]
    tol = _REL[grad_x.dtype] * expected.abs() + err + tiny
    got = grad_x.double()
    if valid_rows is not None:
        rows = got.reshape(-1, got.shape[-1])
        assert bool((rows[valid_rows:] == 0).all()), "masked rows must be +-0"
        expected.reshape(-1, got.shape[-1])[valid_rows:] = 0
    bad = ~((got - expected).abs() <= tol)
    assert not bad.any(), (
        f"{int(bad.sum())} element(s) off the float64 gradient, first at {bad.nonzero()[0].tolist()}: "
        f"{got[bad][0].item()} vs {expected[bad][0].item()}"
    )
