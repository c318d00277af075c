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


def unit_differences(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int]:
    """(elements that differ, largest difference in units of the raw bit patterns) of two tensors of the
    same dtype and shape; a quick count for logs and install checks (the tests also compare signs, zeros
    and NaN positions)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[got.element_size()]
    diff = (got.view(view).to(torch.int64) - want.view(view).to(torch.int64)).abs()
    return int((diff != 0).sum()), int(diff.max()) if diff.numel() else 0


def within_near_ties(got: torch.Tensor, want: torch.Tensor) -> bool:
    """The near-tie rule on raw bit patterns: few enough differences, each one unit."""
    count, worst = unit_differences(got, want)
    return count <= allowed_near_ties(want.numel()) and worst <= 1
