"""Reference ClippedSwiglu / ClippedSwigluGrad: ``docs/operators.md`` section 3 (``clipped_swiglu.md``
section 12), step by step.

The math of both directions (operation order of sections 3 and 4, the clamp_mode-1 extension of section 10),
the split of the ``[pre, cut]`` rows into A and B (interleaved or chunked) and the single rounding to the I/O
dtype (RNE; fp16 overflow becomes inf) are :mod:`swiglu_ops.numerics.glu` (``forward_rounded`` /
``backward_rounded``, the MX operators' stage 1 too); this module adds what is specific to the two
operators: the row bound ``valid_rows`` (rows past it are +0.0, selected, never computed into the result).
"""

from __future__ import annotations

import torch

from ...numerics import glu as glu_math
from ...numerics.glu import GluParams


def _row_mask(rows: int, valid_rows: torch.Tensor | None, device) -> torch.Tensor | None:
    """``[rows, 1]`` bool, True for the rows ``< valid_rows`` (None: every row is valid)."""
    if valid_rows is None:
        return None
    return (torch.arange(rows, device=device) < valid_rows).unsqueeze(1)


def _zero_invalid_rows(values: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Rows past the valid count become exactly +0.0, whatever was computed there (a select)."""
    if keep is None:
        return values
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))


def clipped_swiglu(x: torch.Tensor, valid_rows, glu: GluParams, y: torch.Tensor) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y [R, C/2]."""
    out = glu_math.forward_rounded(x, glu)  # one rounding, RNE
    y.copy_(_zero_invalid_rows(out, _row_mask(x.shape[0], valid_rows, x.device)))


def clipped_swiglu_grad(
    dy: torch.Tensor, x: torch.Tensor, valid_rows, glu: GluParams, grad_x: torch.Tensor
) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes grad_x [R, C]."""
    grad = glu_math.backward_rounded(x, dy, glu)  # one rounding, RNE
    grad_x.copy_(_zero_invalid_rows(grad, _row_mask(x.shape[0], valid_rows, x.device)))
