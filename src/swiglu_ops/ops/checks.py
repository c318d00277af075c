"""How a fast backend's results are judged against the reference backend's, per output of an operator of
the table (contract section 3; the numbers live in :mod:`swiglu_ops.numerics.tolerances`).

``swiglu-ops verify`` (every operator on small random calls) and ``swiglu-ops bench`` (every timed case, on
its own inputs) both judge with :func:`compare_outputs`, and the test suite measures fp32 results and
grad_weight at the same sizes (:func:`error_scale`). Shapes and dtypes must be equal, NaN positions too.

- codes, scales and 16-bit results: equal bit for bit, except the near ties (at most one element per
  started 10,000, each the same sign and one code or value away; FP4 per element; zeros exact);
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
    near_tie_verdict,
    norm_magnitude,
    relative_error,
    sum_magnitude,
    ulp_differences,
)
from .table import OpDef
from .validate import glu_params, mx_glu_params

__all__ = ["call_values", "compare_outputs", "error_scale", "with_defaults"]


def call_values(fn, args: tuple, kwargs: dict) -> dict:
    """The arguments of a call of the public function ``fn`` by parameter name, defaults included."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _near_ties(name: str, got: torch.Tensor, want: torch.Tensor) -> tuple[str, bool]:
    count, far, ok = near_tie_verdict(got.cpu(), want.cpu())
    return f"{name} {count} differ" + (f" ({far} beyond a near tie)" if far else ""), ok


def error_scale(op: OpDef, output: str, values: dict) -> torch.Tensor | None:
    """What a difference in ``output`` of a call of ``op`` (``values``: its arguments by name, defaults
    included) is measured against, elementwise (None: the result itself):

    - ``grad_weight``, a sum: its terms' size per row, ``sum|grad_y * y_origin|`` (swiglu_group_grad) or the
      l2 norm of ``y_grad * act16`` (the MX backward, spec 7.1);
    - an fp32 gradient that cancels: the size of the terms it cancels from (``group_grad_terms``,
      ``clipped_grad_terms``)."""
    if output == "grad_weight":
        if values.get("y_origin") is not None:
            return sum_magnitude(values["grad_y"], values["y_origin"]).cpu()
        if values.get("y_grad") is not None:
            glu = mx_glu_params(
                values["activate_left"],
                values["interleaved"],
                values["limit"],
                values["alpha"],
                values["bias"],
            )
            return norm_magnitude(values["y_grad"], forward_rounded(values["x"], glu)).cpu()
        return None
    if op.name == "swiglu_group_grad":
        return group_grad_terms(values["grad_y"], values["x"], values["weight"], values["clamp_limit"]).cpu()
    if op.name == "clipped_swiglu_grad":
        glu = glu_params(
            interleaved=values["interleaved"], clipped=True, alpha=values["alpha"], limit=values["limit"],
            bias=values["bias"],
        )  # fmt: skip
        return clipped_grad_terms(values["grad_y"], values["x"], glu, values["dim"]).cpu()
    return None


def with_defaults(op: OpDef, values: dict) -> dict:
    """``values`` with the defaults of the parameters they leave out."""
    return {**{p.name: p.default for p in op.params}, **values}


def compare_outputs(op: OpDef, values: dict, got, want) -> list[tuple[str, bool]]:
    """One ``(what was found, within the contract)`` per output that the reference returned, for a call of
    ``op`` with ``values`` (its public function's arguments by name) that gave ``got`` on a fast backend and
    ``want`` on the reference."""
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    if len(got) != len(want):
        return [(f"{len(got)} outputs, the reference returns {len(want)}", False)]
    values = with_defaults(op, values)
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
        g, w = g.cpu(), w.cpu()
        if out.name == "grad_weight":
            rel = relative_error(g, w, error_scale(op, out.name, values))
            found.append((f"{out.name} max rel {rel:.1e}", rel <= GRAD_WEIGHT_RTOL))
        elif w.dtype == torch.float32:
            beyond, worst = ulp_differences(g, w, error_scale(op, out.name, values))
            found.append((f"{out.name} max {worst:.1f} ulp", beyond == 0))
        else:
            found.append(_near_ties(out.name, g, w))
    return found
