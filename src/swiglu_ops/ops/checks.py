"""How a fast backend's results are judged against the reference backend's, per output of an operator of
the table (contract section 3; the numbers live in :mod:`swiglu_ops.numerics.tolerances`).

``swiglu-ops verify`` (every operator on small random calls) and ``swiglu-ops bench`` (every timed case, on
its own inputs) both judge with :func:`compare_outputs`; the test suite's comparators read the same
tolerances and also compare signs, zeros and NaN positions.

- codes, scales and 16-bit results: equal bit for bit, except the near ties (at most one element per
  started 10,000, each one unit of the raw bit pattern away);
- fp32 results: within ``FP32_ULPS`` ulp (another ``exp``), measured where a gradient cancels at the size of
  the terms it cancels from (``group_grad_terms``, ``clipped_grad_terms``);
- ``grad_weight`` (an fp32 sum): within ``GRAD_WEIGHT_RTOL``, relative to the summed terms' size
  (swiglu_group_grad's ``grad_y * y_origin``, the MX backward's ``y_grad * act16``, spec 7.1).
"""

from __future__ import annotations

import inspect

import torch

from ..numerics.glu import forward_rounded
from ..numerics.tolerances import (
    GRAD_WEIGHT_RTOL,
    clipped_grad_terms,
    group_grad_terms,
    near_tie_differences,
    norm_magnitude,
    relative_error,
    sum_magnitude,
    ulp_differences,
    within_near_ties,
)
from .table import OpDef
from .validate import glu_params, mx_glu_params

__all__ = ["call_values", "compare_outputs"]


def call_values(fn, args: tuple, kwargs: dict) -> dict:
    """The arguments of a call of the public function ``fn`` by parameter name, defaults included."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _near_ties(name: str, got: torch.Tensor, want: torch.Tensor) -> tuple[str, bool]:
    got, want = got.cpu(), want.cpu()
    count, far = near_tie_differences(got, want)
    return f"{name} {count} differ" + (f" ({far} beyond a near tie)" if far else ""), within_near_ties(
        got, want
    )


def _grad_weight_terms(values: dict) -> torch.Tensor | None:
    """The size grad_weight's difference is measured at, per row (module docstring)."""
    if values.get("y_origin") is not None:
        return sum_magnitude(values["grad_y"], values["y_origin"]).cpu()
    if "y_grad" in values:
        glu = mx_glu_params(
            values.get("activate_left", True), values.get("interleaved", False), values.get("limit"),
            values.get("alpha"), values.get("bias"),
        )  # fmt: skip
        return norm_magnitude(values["y_grad"], forward_rounded(values["x"], glu)).cpu()
    return None


def _close(name: str, got: torch.Tensor, want: torch.Tensor, values: dict) -> tuple[str, bool]:
    rel = relative_error(got.cpu(), want.cpu(), _grad_weight_terms(values))
    return f"{name} max rel {rel:.1e}", rel <= GRAD_WEIGHT_RTOL


def _fp32_terms(op: OpDef, values: dict) -> torch.Tensor | None:
    """Where an operator's fp32 result cancels, the size of its terms (its ulps are measured there)."""
    if op.name == "swiglu_group_grad":
        return group_grad_terms(
            values["grad_y"], values["x"], values.get("weight"), values["clamp_limit"]
        ).cpu()
    if op.name == "clipped_swiglu_grad":
        glu = glu_params(
            interleaved=values["interleaved"], clipped=True, alpha=values["alpha"], limit=values["limit"],
            bias=values["bias"],
        )  # fmt: skip
        return clipped_grad_terms(values["grad_y"], values["x"], glu, values["dim"]).cpu()
    return None


def _within_ulps(name: str, got: torch.Tensor, want: torch.Tensor, terms) -> tuple[str, bool]:
    beyond, worst = ulp_differences(got.cpu(), want.cpu(), terms)
    return f"{name} max {worst:.1f} ulp", beyond == 0


def compare_outputs(op: OpDef, values: dict, got, want) -> list[tuple[str, bool]]:
    """One ``(what was found, within the contract)`` per output that the reference returned, for a call of
    ``op`` with ``values`` (its public function's arguments by name) that gave ``got`` on a fast backend and
    ``want`` on the reference."""
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    if len(got) != len(want):
        return [(f"{len(got)} outputs, the reference returns {len(want)}", False)]
    values = {**{p.name: p.default for p in op.params}, **values}  # (the defaults of what is not given)
    found = []
    for out, g, w in zip(op.returned(values), got, want, strict=True):
        if w is None:
            if g is not None:
                found.append((f"{out.name} given where the reference returns none", False))
            continue
        if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape:
            what = (
                "missing"
                if g is None
                else f"{getattr(g, 'dtype', type(g).__name__)} {tuple(getattr(g, 'shape', ()))}"
            )
            found.append((f"{out.name} {what}, not {w.dtype} {tuple(w.shape)}", False))
            continue
        if out.name == "grad_weight":
            found.append(_close(out.name, g, w, values))
        elif w.dtype == torch.float32:
            found.append(_within_ulps(out.name, g, w, _fp32_terms(op, values)))
        else:
            found.append(_near_ties(out.name, g, w))
    return found
