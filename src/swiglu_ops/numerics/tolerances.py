"""The contract's tolerances for fast backends (spec README section 3), written once.

The test suite's comparators (``tests/_compare.py``), ``swiglu-ops verify`` and the GPU benchmark's check
all read them from here. The reference backend itself is compared exactly.
"""

from __future__ import annotations

import torch

#: "at most 1 in 10,000 elements" may sit one unit (ulp of a 16-bit gradient, FP8 code, E8M0 code) away.
NEAR_TIE_RATE = 10_000
#: fp32 gradients: within 4 ulp (measured at the cancelling terms' size where the result cancels).
FP32_ULPS = 4
#: grad_weight: within 1e-5 relative (to the summed terms' size where the sum cancels).
GRAD_WEIGHT_RTOL = 1e-5


def relative_scale(want: torch.Tensor, magnitude: torch.Tensor | None = None) -> torch.Tensor:
    """What a grad_weight difference is measured against (float64, want's shape): ``|want|``, or for a sum
    the larger of ``|want|`` and ``magnitude``, the sum of its terms' magnitudes (a sum that cancels to almost
    nothing can only be reproduced in another summation order relative to its terms' size)."""
    scale = want.double().abs()
    return scale if magnitude is None else torch.maximum(scale, magnitude.reshape(want.shape).double())


def sum_magnitude(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per row, the sum of ``|fp32(dy) * fp32(y)|`` over the last dim (float64): the size of the terms of
    swiglu_group_grad's grad_weight (``y`` = y_origin), its ``magnitude``."""
    return (dy.double() * y.double()).abs().sum(-1)


def norm_magnitude(dy: torch.Tensor, act16: torch.Tensor) -> torch.Tensor:
    """Per row, the l2 norm of ``dy * act16`` over the last dim (float64): the MX backward's grad_weight
    ``magnitude`` (spec 7.1; act16 the forward's unweighted activation rounded to x's dtype)."""
    return (dy.double() * act16.double()).norm(dim=-1)


def relative_error(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor | None = None) -> float:
    """The largest ``|got - want| / relative_scale(want, magnitude)``; compare it with ``GRAD_WEIGHT_RTOL``.
    Equal values (both 0, the same infinity) and NaN against NaN count 0; any other pair with a non-finite
    member counts inf."""
    g, w = got.double(), want.double()
    same = (g == w) | (g.isnan() & w.isnan())
    rel = (g - w).abs() / relative_scale(want, magnitude)
    rel = torch.where(same, 0.0, torch.where(g.isfinite() & w.isfinite(), rel, torch.inf))
    return float(rel.max()) if rel.numel() else 0.0


def allowed_near_ties(numel: int) -> int:
    """How many elements of a tensor may sit one unit away from the reference.

    "At most 1 in 10,000 elements" read as one per *started* 10,000 elements, ``ceil(numel / 10_000)``: a
    100-element tensor may hold one near tie (a tie can land anywhere), a 20,000-element tensor two, an
    empty tensor none.
    """
    return -(-numel // NEAR_TIE_RATE)


_UNSIGNED_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _sign_magnitude(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sign bit set, magnitude bits) of every element, as int64; FP4 (two E2M1 codes a byte) unpacked to one
    code per element (low nibble first). E8M0 has no sign: its whole code is the magnitude."""
    if t.dtype == torch.float4_e2m1fn_x2:
        b = t.contiguous().view(torch.uint8).to(torch.int64)
        codes = torch.stack([b & 0xF, b >> 4], dim=-1)
        return (codes & 0x8) != 0, codes & 0x7
    width = t.element_size() * 8
    bits = t.contiguous().view(_UNSIGNED_VIEW[t.element_size()]).to(torch.int64) & ((1 << width) - 1)
    if t.dtype == torch.float8_e8m0fnu:
        return torch.zeros_like(bits, dtype=torch.bool), bits
    sign = 1 << (width - 1)
    return (bits & sign) != 0, bits & (sign - 1)


def _nans(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.float4_e2m1fn_x2:  # E2M1 has no NaN
        return torch.zeros((*t.shape, 2), dtype=torch.bool, device=t.device)
    if t.dtype == torch.float8_e8m0fnu:
        return t.view(torch.uint8) == 0xFF
    return torch.isnan(t.float())


def near_tie_differences(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int]:
    """(elements that differ, elements that differ by more than a near tie) of two tensors of the same
    dtype and shape, by the contract's rule: NaN positions equal (any NaN bits), and elsewhere the same
    sign and magnitude codes at most one apart (adjacent bf16/fp16 values, FP8/FP4 element codes or E8M0
    scale codes; FP4 per element, not per packed byte); a bf16/fp16/fp32 zero must be the same zero."""
    nan_g, nan_w = _nans(got), _nans(want)
    sg, mg = _sign_magnitude(got)
    sw, mw = _sign_magnitude(want)
    keep = ~(nan_g | nan_w)
    differ = (nan_g != nan_w) | (keep & ((sg != sw) | (mg != mw)))
    far = (nan_g != nan_w) | (keep & ((sg != sw) | ((mg - mw).abs() > 1)))
    if want.dtype in _FLOATS:  # zeros come from exact arithmetic, never from a rounding tie
        far |= keep & ((mg == 0) | (mw == 0)) & (mg != mw)
    return int(differ.sum()), int(far.sum())


def near_tie_verdict(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int, bool]:
    """:func:`near_tie_differences` and the near-tie rule's verdict on them: no element further than one
    unit, and few enough one unit apart (counted per element: an FP4 byte holds two)."""
    count, far = near_tie_differences(got, want)
    elements = want.numel() * (2 if want.dtype == torch.float4_e2m1fn_x2 else 1)
    return count, far, far == 0 and count <= allowed_near_ties(elements)


def within_near_ties(got: torch.Tensor, want: torch.Tensor) -> bool:
    """The near-tie rule (:func:`near_tie_verdict`)."""
    return near_tie_verdict(got, want)[2]


def _columns(values, x: torch.Tensor, cols) -> torch.Tensor:
    """Two halves' float64 values put back at their columns of ``x`` (``cols``: their column slices)."""
    out = torch.empty(x.shape, dtype=torch.float64, device=x.device)
    for v, c in zip(values, cols, strict=True):
        out[..., c] = v
    return torch.nan_to_num(out, nan=0.0, posinf=0.0)


def group_grad_terms(dy: torch.Tensor, x: torch.Tensor, weight=None, clamp: float = 0.0) -> torch.Tensor:
    """Per ``swiglu_group_grad`` grad_x element (float64, x's shape), the size of the fp32 terms it is
    computed from: the gate gradient ``dy * (s + f - f*s) * u * w`` cancels near silu'(g) = 0 (g = -1.2785),
    so an ``exp`` one ulp away moves it by an ulp of the *terms*, many ulps of the result; the 4-ulp bound
    holds at ``|dy u~ w| * (s + |f| + |f s|)``. The up gradient ``dy * f * w`` does not cancel
    (``|dy f w|``)."""
    h = x.shape[-1] // 2
    g, u = x[..., :h].double(), x[..., h:].double()
    if clamp > 0:
        g, u = g.clamp(max=clamp), u.clamp(-clamp, clamp)
    s = torch.sigmoid(g)
    f = torch.nan_to_num(g * s)
    dyw = dy.double().abs()
    if weight is not None:
        dyw = dyw * weight.double().abs().reshape(*dy.shape[:-1], 1)
    return _columns(
        (dyw * u.abs() * (s + f.abs() + (f * s).abs()), dyw * f.abs()), x, (slice(0, h), slice(h, None))
    )


def clipped_grad_terms(dy: torch.Tensor, x: torch.Tensor, glu, dim: int = -1) -> torch.Tensor:
    """Per ``clipped_swiglu_grad`` grad_x element (float64, x's shape; the halves along ``dim``), the size of
    the terms it is computed from. The gate gradient ``dy (B~ + bias) s (1 + alpha A~ (1 - s))`` cancels
    twice: ``1 - s`` (computed as ``s * -1 + 1``) for large A~, where s nears 1 and its ulp becomes a large
    part of ``1 - s``, and ``1 + alpha A~ (1 - s)`` where the product nears -1; so its bound is measured at
    ``|dy (B~ + bias) s| (1 + |alpha A~| (1 + s))`` (clamp_mode 1: with B~, alpha 1 and the unclamped A). The
    up gradient does not cancel."""
    from .glu import split_columns  # (glu imports nothing from here; kept local to stay a leaf module)

    x, dy = x.movedim(dim, -1), dy.movedim(dim, -1)
    a_cols, b_cols = split_columns(x.shape[-1], glu)
    a, b, dy = x[..., a_cols].double(), x[..., b_cols].double(), dy.double()
    bt = b.clamp(-glu.limit, glu.limit)
    if glu.clamp_mode == 0:
        at = a.clamp(max=glu.limit)
        s = torch.sigmoid(glu.alpha * at)
        mag_a = (dy * (bt + glu.bias) * s).abs() * (1 + (glu.alpha * at).abs() * (1 + s))
        mag_b = (dy * at * s).abs()
    else:
        s = torch.sigmoid(a)
        mag_a = (dy * bt * s).abs() * (1 + a.abs() * (1 + s))
        mag_b = (dy * (a * s).clamp(max=glu.limit)).abs()
    return _columns((mag_a, mag_b), x, (a_cols, b_cols)).movedim(-1, dim)


def ulp_differences(
    got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor | None = None
) -> tuple[int, float]:
    """(elements further than ``FP32_ULPS`` from ``want``, the largest distance in ulps) of two fp32 tensors:
    NaN against NaN counts 0, zeros and infinities must be equal (signs included), other values of
    the same sign are measured in ulps of ``max(|want|, magnitude)`` (``magnitude``: the size of the terms a
    result cancels from, :func:`group_grad_terms`, :func:`clipped_grad_terms`; without it, in steps of the
    bit pattern)."""
    g, w = got.double(), want.double()
    if magnitude is None:  # steps of the bit pattern (same sign checked below)
        ulps = (got.view(torch.int32).to(torch.int64) - want.view(torch.int32).to(torch.int64)).abs().double()
    else:
        scale = torch.maximum(w.abs(), magnitude.to(w.device).reshape(w.shape))
        ulps = (g - w).abs() / (scale * torch.finfo(torch.float32).eps).clamp_min(2.0**-149)
    same = (got.view(torch.int32) == want.view(torch.int32)) | (g.isnan() & w.isnan())
    special = (g == 0) | (w == 0) | g.isinf() | w.isinf() | g.isnan() | w.isnan() | (g.sign() != w.sign())
    ulps = torch.where(same, 0.0, torch.where(special, torch.inf, ulps))
    return int((ulps > FP32_ULPS).sum()), float(ulps.max()) if ulps.numel() else 0.0
