"""Elementwise comparison helpers implementing the tolerances of the contract (spec README section 3).

- The ``reference`` backend is compared **exactly** (:func:`assert_exact`).
- Fast backends may use another ``exp``:
  * fp32 values within 4 ulp (:func:`assert_within_ulp`);
  * bf16/fp16 values, FP8 element codes and E8M0 scale codes identical except at rare near-tie positions
    (:func:`assert_near_ties`);
  * grad_weight within 1e-5 relative (:func:`assert_relative`).
- Two results cancel, and there "relative to the result" is unattainable for a legitimately different
  ``exp`` or summation order, so given the inputs the bound is taken relative to the size of the cancelling
  terms instead: silu' = s + f - f*s near g = -1.28 (:func:`group_grad_terms`) and a grad_weight row
  sum near zero (:func:`sum_magnitude`).
- Everywhere: shapes and dtypes equal, NaN positions equal, zeros equal including their sign, every element
  of every output checked (never a reduction).
"""

from __future__ import annotations

import torch

from swiglu_ops.numerics.tolerances import (  # noqa: F401 (sum_magnitude: the tests' import point)
    FP32_ULPS,
    GRAD_WEIGHT_RTOL,
    allowed_near_ties,
    group_grad_terms,
    relative_scale,
    sum_magnitude,
)

_INT_VIEW = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e8m0fnu: torch.uint8,
    torch.uint8: torch.uint8,
}
_SIGN_BIT = {torch.int32: 1 << 31, torch.int16: 1 << 15, torch.uint8: 1 << 7}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bit pattern as a non-negative int64 tensor."""
    itype = _INT_VIEW[t.dtype]
    width = {torch.int32: 32, torch.int16: 16, torch.uint8: 8}[itype]
    return t.contiguous().view(itype).to(torch.int64) & ((1 << width) - 1)


def _split(t: torch.Tensor):
    """(sign bit set, magnitude bits) of every element."""
    b = _bits(t)
    sign = _SIGN_BIT[_INT_VIEW[t.dtype]]
    return (b & sign) != 0, b & (sign - 1)


def _is_float(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _nan_mask(t: torch.Tensor) -> torch.Tensor:
    if _is_float(t) or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.isnan(t.float())
    return torch.zeros(t.shape, dtype=torch.bool)


def _where(mask: torch.Tensor, limit: int = 5) -> str:
    idx = mask.nonzero().tolist()
    more = f" (+{len(idx) - limit} more)" if len(idx) > limit else ""
    return f"{len(idx)} element(s) at {idx[:limit]}{more}"


def _check_meta(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    assert isinstance(actual, torch.Tensor), f"{name}: expected a tensor, got {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"


def _check_nans(actual: torch.Tensor, expected: torch.Tensor, name: str) -> torch.Tensor:
    """NaN positions must match (any NaN payload). Returns the mask of non-NaN elements."""
    nan_a, nan_e = _nan_mask(actual), _nan_mask(expected)
    assert torch.equal(nan_a, nan_e), f"{name}: NaN positions differ: {_where(nan_a != nan_e)}"
    return ~nan_e


def assert_exact(actual: torch.Tensor, expected: torch.Tensor, name: str = "tensor") -> None:
    """Bitwise equality of every non-NaN element (signed zeros and infinities too); NaNs in the same spots."""
    _check_meta(actual, expected, name)
    keep = _check_nans(actual, expected, name)
    diff = (_bits(actual) != _bits(expected)) & keep
    if diff.any():
        i = tuple(diff.nonzero()[0].tolist())
        raise AssertionError(
            f"{name}: {_where(diff)} differ; first {i}: {actual[i].item()!r} != {expected[i].item()!r} "
            f"(bits {_bits(actual)[i].item():#x} != {_bits(expected)[i].item():#x})"
        )


def _check_zeros(actual: torch.Tensor, expected: torch.Tensor, keep: torch.Tensor, name: str) -> None:
    """Where either side is a (signed) zero, both must be the same zero."""
    sa, ma = _split(actual)
    se, me = _split(expected)
    zero = ((ma == 0) | (me == 0)) & keep
    bad = zero & ((ma != me) | (sa != se))
    assert not bad.any(), f"{name}: zeros (or their signs) differ at {_where(bad)}"


def assert_within_ulp(
    actual: torch.Tensor,
    expected: torch.Tensor,
    ulps: int = FP32_ULPS,
    name: str = "tensor",
    magnitude: torch.Tensor | None = None,
) -> None:
    """Every element within ``ulps`` units in the last place (same sign); zeros and infinities exact.

    ``magnitude`` (optional, per element) measures the ulp at ``max(|expected|, magnitude)`` instead: the
    size of the terms a result cancelled from (see :func:`group_grad_terms`).
    """
    _check_meta(actual, expected, name)
    keep = _check_nans(actual, expected, name)
    _check_zeros(actual, expected, keep, name)
    sa, ma = _split(actual)
    se, me = _split(expected)
    inf = torch.isinf(expected.float()) | torch.isinf(actual.float())
    far = (ma - me).abs() > ulps
    if magnitude is not None:
        ulp = torch.finfo(expected.dtype).eps * torch.maximum(expected.double().abs(), magnitude.double())
        far = (actual.double() - expected.double()).abs() > ulps * ulp
    bad = keep & ((sa != se) | far | (inf & (ma != me)))
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(
            f"{name}: more than {ulps} ulp apart at {_where(bad)}; first {i}: "
            f"{actual[i].item()!r} vs {expected[i].item()!r}"
        )


def assert_near_ties(actual: torch.Tensor, expected: torch.Tensor, name: str = "tensor") -> None:
    """Identical codes except at most :func:`allowed_near_ties` elements exactly one unit apart.

    "One unit" means the same sign bit and magnitude codes differing by one: adjacent representable values
    of a bf16/fp16 number, of an FP8 element code, or adjacent E8M0 scale codes. For bf16/fp16 a zero must
    match exactly (with its sign): zeros come from exact arithmetic, never from a rounding tie. NaN
    positions must match.
    """
    _check_meta(actual, expected, name)
    keep = _check_nans(actual, expected, name)
    if _is_float(expected):
        _check_zeros(actual, expected, keep, name)
    sa, ma = _split(actual)
    se, me = _split(expected)
    differ = keep & ((sa != se) | (ma != me))
    far = differ & ((sa != se) | ((ma - me).abs() > 1))
    assert not far.any(), f"{name}: codes more than one unit apart at {_where(far)}"
    allowed = allowed_near_ties(expected.numel())
    count = int(differ.sum())
    assert count <= allowed, (
        f"{name}: {count} near-tie differences, at most {allowed} allowed: {_where(differ)}"
    )


def assert_relative(
    actual: torch.Tensor,
    expected: torch.Tensor,
    rtol: float = GRAD_WEIGHT_RTOL,
    name: str = "tensor",
    magnitude: torch.Tensor | None = None,
) -> None:
    """``|actual - expected| <= rtol * max(|expected|, magnitude)`` elementwise; NaN positions and
    infinities exact.

    ``magnitude`` is, for a sum, the sum of its terms' magnitudes (:func:`sum_magnitude`): a sum that cancels
    to almost nothing can only be reproduced in another summation order relative to its terms' size.
    """
    _check_meta(actual, expected, name)
    keep = _check_nans(actual, expected, name)
    a, e = actual.double(), expected.double()
    scale = relative_scale(expected, magnitude)
    inf = torch.isinf(e) | torch.isinf(a)
    close = torch.where(inf, a == e, (a - e).abs() <= rtol * scale)
    bad = keep & ~close
    assert not bad.any(), f"{name}: not within {rtol} relative at {_where(bad)}"


def assert_matches_reference(
    actual: torch.Tensor,
    expected: torch.Tensor,
    backend: str,
    name: str,
    *,
    grad_weight: bool = False,
    magnitude: torch.Tensor | None = None,
) -> None:
    """One output of ``backend`` against the reference's (or an exact expected value), per the contract.

    ``magnitude``: see :func:`assert_within_ulp` (fp32 grad_x) and :func:`assert_relative` (grad_weight).
    """
    if backend == "reference":
        assert_exact(actual, expected, name)
    elif grad_weight:
        assert_relative(actual, expected, name=name, magnitude=magnitude)
    elif expected.dtype == torch.float32:
        assert_within_ulp(actual, expected, name=name, magnitude=magnitude)
    else:
        assert_near_ties(actual, expected, name)


def assert_group_grad_matches(actual, expected, backend: str, inputs=None) -> None:
    """``(grad_x, grad_weight)`` of ``backend`` against the expected pair (grad_weight may be None).

    ``inputs = (dy, x, weight, y_origin, clamp)`` measures the fp32 grad_x bound at
    :func:`group_grad_terms` and the grad_weight bound at :func:`sum_magnitude`; without it (exact
    golden values, no cancellation) the plain bounds apply.
    """
    grad_x, grad_weight = actual
    dy, x, weight, y_origin, clamp = inputs if inputs is not None else (None,) * 5
    magnitude = None if inputs is None else group_grad_terms(dy, x, weight, clamp)
    assert_matches_reference(grad_x, expected[0], backend, "grad_x", magnitude=magnitude)
    if expected[1] is None:
        assert grad_weight is None, "grad_weight must be None without weight"
    else:
        magnitude = None if inputs is None else sum_magnitude(dy, y_origin)
        assert_matches_reference(
            grad_weight, expected[1], backend, "grad_weight", grad_weight=True, magnitude=magnitude
        )


MX_NAMES = ("y1", "mxscale1", "y2", "mxscale2")


def assert_mx_matches(actual, expected, backend: str) -> None:
    """``(y1, mxscale1, y2, mxscale2)`` of ``backend`` against the expected outputs, every element."""
    assert len(actual) == 4, f"expected 4 outputs, got {len(actual)}"
    for a, e, name in zip(actual, expected, MX_NAMES, strict=True):
        assert_matches_reference(a, e, backend, name)


def assert_bitwise_equal(actual, expected, name: str = "tensor") -> None:
    """Every bit identical, NaN payloads included (determinism checks)."""
    _check_meta(actual, expected, name)
    diff = _bits(actual) != _bits(expected)
    assert not diff.any(), f"{name}: bits differ at {_where(diff)}"
