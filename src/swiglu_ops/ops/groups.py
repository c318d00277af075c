"""Conversions between the two group conventions and PyTorch's ``offs`` (``docs/integration.md`` section 8).

- **Counts** (CANN ``SwigluGroupGrad``, ``ClippedSwiglu`` / ``ClippedSwigluGrad``, and so
  :func:`swiglu_ops.swiglu_group_grad`, :func:`swiglu_ops.clipped_swiglu`, :func:`swiglu_ops.clamped_swiglu`):
  ``group_index[g]`` = the number of rows of group ``g``; the valid rows are the first
  ``clamp(sum, 0, rows)``.
- **Cumulative row ends** (CANN's dual-axis MX operators, and so
  :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis`, :func:`swiglu_ops.swiglu_mx_quant_dual_axis`,
  :func:`swiglu_ops.swiglu_mx_backward`, :mod:`swiglu_ops.layouts`): ``group_index[g]`` = the row after the
  last row of group ``g``; the last value is the row count M. This is PyTorch's ``offs``
  (``torch._grouped_mm``, ``torch._scaled_grouped_mm``; int32 there), and torchao's ``group_end_offsets``.

Both helpers are elementwise device ops (no host synchronisation; they trace under ``torch.compile``) and keep
the input's dtype and device.
"""

from __future__ import annotations

import torch

__all__ = ["counts_to_ends", "ends_to_counts"]


def _check(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")


def counts_to_ends(counts: torch.Tensor) -> torch.Tensor:
    """Group counts (tokens per group) -> cumulative row ends (PyTorch's ``offs``): ``cumsum(counts)``.

    Example: ``counts_to_ends(torch.tensor([3, 0, 5]))`` is ``tensor([3, 3, 8])``; pass
    ``.to(torch.int32)`` of it to ``torch._grouped_mm(..., offs=...)``.
    """
    _check("counts (group counts)", counts)
    return torch.cumsum(counts, 0, dtype=counts.dtype)


def ends_to_counts(ends: torch.Tensor) -> torch.Tensor:
    """Cumulative row ends (PyTorch's ``offs``) -> group counts: ``ends[g] - ends[g - 1]`` (``ends[0]``
    first).

    Example: ``ends_to_counts(torch.tensor([3, 3, 8]))`` is ``tensor([3, 0, 5])``: the counts that
    :func:`swiglu_ops.swiglu_group_grad` expects for the groups of ``offs``.
    """
    _check("ends (cumulative row ends)", ends)
    return torch.diff(ends, prepend=ends.new_zeros(1))
