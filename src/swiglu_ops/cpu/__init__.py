"""The ``cpu`` backend: fused kernels for CPU tensors, parallel over all cores.

Each operator is one pass over memory (read the inputs once, write the outputs once); see
``docs/cpu_backend.md`` for the design, the measurements and the choice of technology. The Numba kernels
(``_group_grad``, ``_mx_quant``) run every dtype on every CPU; they are compiled on first use for each dtype
and cached on disk next to this package (or in ``NUMBA_CACHE_DIR``). On CPUs with AVX-512, 16-bit dtypes go
to the C kernels of ``_simd.c`` (``_native``), which give bit-identical results faster.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .. import mx
from . import _native, _numerics
from ._group_grad import group_grad_kernel, pairwise_plan
from ._memory import OutputCache, cache_bytes_from_env
from ._mx_quant import mx_quant_kernel, row_blocks

NAME = "cpu"

_KINDS = {torch.bfloat16: _numerics.BF16, torch.float16: _numerics.FP16, torch.float32: _numerics.FP32}
_STORAGE = {torch.bfloat16: torch.uint16, torch.float16: torch.uint16, torch.float32: torch.uint32}


#: Freed outputs kept for reuse, at most this many MiB of them (``SWIGLU_OPS_CPU_CACHE_MB``, 0 disables).
OUTPUT_CACHE = OutputCache(max_bytes=cache_bytes_from_env(os.environ.get("SWIGLU_OPS_CPU_CACHE_MB")))


def empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """Output allocation for ``swiglu_ops._api``: large outputs reuse the memory of freed ones."""
    return OUTPUT_CACHE.empty(shape, dtype)


def empty_cache() -> None:
    """Release the memory of every freed output kept for reuse."""
    OUTPUT_CACHE.clear()


def is_available(device) -> tuple[bool, str]:
    if torch.device(device).type != "cpu":
        return False, "the cpu backend runs on CPU tensors only"
    return True, ""


def _bits(t: torch.Tensor) -> np.ndarray:
    """Zero-copy NumPy view of a float tensor's storage bits (uint16 for bf16/fp16, uint32 for fp32)."""
    return t.view(_STORAGE[t.dtype]).numpy()


def swiglu_group_grad(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight) -> None:
    """Backend entry point (see ``swiglu_ops._api`` for the argument contract). Writes grad_x/grad_weight."""
    rows, hidden = dy.shape
    kind = _KINDS[dy.dtype]
    valid_rows = rows if valid_rows is None else int(valid_rows)
    leaves, merges = pairwise_plan(hidden)
    weighted = None if weight is None else (weight.numpy(), _bits(y_origin), grad_weight.numpy())
    if _native.available(kind):
        _native.group_grad(
            kind, _bits(dy), _bits(x), weighted, valid_rows, clamp, leaves, merges, _bits(grad_x)
        )
        return
    if weighted is None:  # Numba takes empty arrays instead
        no_weight = np.empty(0, dtype=np.float32)
        weighted = (no_weight, np.empty((0, hidden), dtype=_bits(dy).dtype), no_weight)
    weight_np, y_origin_np, grad_weight_np = weighted
    group_grad_kernel(kind, clamp > 0)(
        _bits(dy), _bits(x), weight_np, y_origin_np, valid_rows, np.float32(clamp), leaves, merges,
        _bits(grad_x), grad_weight_np,
    )  # fmt: skip


def swiglu_bwd_mx_quant(x, dy, group_ends, activate_left, scale_alg, fmt, y1, s1, y2, s2) -> None:
    """Backend entry point (see ``swiglu_ops._api`` for the argument contract). Writes y1, s1, y2, s2."""
    batch, m, _ = x.shape
    ranges, bases = mx.column_block_groups(group_ends, m)
    covered = ranges[-1][1]  # rows past the last (clamped) end belong to no group: outputs are zeros
    if covered < m:
        y1[:, covered:] = 0
        s1[:, covered:] = 0
        y2[:, covered:] = 0
    kind = _KINDS[x.dtype]
    simd = _native.available(kind)
    mx_quant_kernel(kind, fmt, simd)(
        _bits(x),
        _bits(dy),
        row_blocks(batch, ranges, bases),
        activate_left,
        scale_alg,
        _native.sigmoid_table(kind) if simd else np.empty(0, np.float32),
        y1.numpy(),
        s1.numpy(),
        y2.numpy(),
        s2.numpy(),
    )


__all__ = ["NAME", "empty", "empty_cache", "is_available", "swiglu_group_grad", "swiglu_bwd_mx_quant"]
