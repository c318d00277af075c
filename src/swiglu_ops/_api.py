"""Argument validation (once, for every backend), output allocation and backend dispatch.

The public functions in :mod:`swiglu_ops` are thin wrappers around :func:`swiglu_group_grad` and
:func:`swiglu_backward_mx_quant_dual_axis` here. After validation every backend receives the same
normalised arguments (the *kernel contract*):

``swiglu_group_grad(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight) -> None``
    ``dy`` [R, H] and ``x`` [R, 2H] contiguous, same dtype (bf16/fp16/fp32), R >= 1, H >= 1;
    ``weight`` [R] fp32 contiguous or None; ``y_origin`` [R, H] contiguous or None (both or neither);
    ``valid_rows`` a 0-d int64 tensor on the data's device (already clamped to [0, R]) or None (all rows
    valid); ``clamp`` a Python float exactly representable in fp32, ``> 0`` enables the clamp;
    ``grad_x`` [R, 2H] (dtype of dy) and ``grad_weight`` [R] fp32 (or None) are contiguous outputs to write.

``swiglu_bwd_mx_quant(x, dy, group_ends, activate_left, scale_alg, fmt, y1, s1, y2, s2) -> None``
    ``x`` [B, M, C] and ``dy`` [B, M, C/2] contiguous (bf16/fp16/fp32), B*M >= 1, C % 64 == 0;
    ``group_ends`` an int64 [G] contiguous tensor of cumulative row ends (then B == 1) or None. Backends
    clamp every end into [previous end, M] (a no-op for validated CPU input); rows past the last end
    belong to no group and all their outputs are 0. ``fmt`` is a :class:`swiglu_ops.mx.FP8Format`.
    Outputs (all uint8, contiguous): ``y1``/``y2`` [B, M, C] element codes, ``s1`` [B, M, C/32] row-wise
    scale codes in block order, ``s2`` [B, R, C, 2] column-wise scale codes, **already zero-filled**: the
    backend writes only the slots that a 32-row block maps to.

``empty(shape, dtype) -> Tensor`` (optional)
    Allocates the outputs when the caller passes no ``out=`` (default ``torch.empty`` on the data's device).
"""

from __future__ import annotations

import importlib
import math
import numbers

import torch
from torch._subclasses.fake_tensor import is_fake

from . import mx

_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int64, torch.int32)
BACKENDS = ("reference", "cpu", "triton")
_MODULES = {"reference": "swiglu_ops.reference", "cpu": "swiglu_ops.cpu", "triton": "swiglu_ops.triton"}


# --------------------------------------------------------------------------------------------- dispatch


def _load(name: str):
    return importlib.import_module(_MODULES[name])


def backend_status(name: str, device: torch.device) -> tuple[bool, str]:
    """Whether backend ``name`` can run on ``device``, and why not."""
    try:
        module = _load(name)
    except ImportError as exc:  # optional dependency (numba, triton) missing
        return False, f"cannot import its dependencies ({exc})"
    is_available = getattr(module, "is_available", None)
    if is_available is None:  # e.g. a partial install that left only a namespace package
        return False, f"{module.__name__} is incomplete (no is_available)"
    return is_available(device)


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Names of the backends that can run on ``device``, fastest first."""
    device = torch.device(device)
    order = ("triton", "cpu", "reference") if device.type == "cuda" else ("cpu", "triton", "reference")
    return [b for b in order if backend_status(b, device)[0]]


def resolve_backend(backend: str, device: torch.device):
    """The backend module for ``backend`` on ``device``; ``"auto"`` picks the fastest available one.

    Unknown or unavailable backends raise ``ValueError`` (never a silent fallback).
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    if backend == "auto":
        preferred = ("triton",) if device.type == "cuda" else ("cpu",)
        for name in (*preferred, "reference"):
            if backend_status(name, device)[0]:
                return _load(name)
        raise ValueError(f"no backend available for device {device}")  # unreachable: reference always is
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {('auto', *BACKENDS)}, got {backend!r}")
    ok, why = backend_status(backend, device)
    if not ok:
        raise ValueError(f"backend {backend!r} is not available for {device} tensors: {why}")
    return _load(backend)


# ------------------------------------------------------------------------------------------- validation


def _check_tensor(name: str, t, *, optional: bool = False) -> None:
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_device(ref: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} must be on the same device as the data ({ref.device}), got {t.device}")


def _check_out(name: str, t, shape, dtype, device) -> torch.Tensor:
    _check_tensor(name, t)
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t


def _check_group_index(group_index) -> None:
    _check_tensor("group_index", group_index)
    if group_index.dtype not in _INDEX_DTYPES:
        raise TypeError(f"group_index must be int64 or int32, got {group_index.dtype}")
    if group_index.dim() != 1 or group_index.numel() < 1:
        raise ValueError(f"group_index must be 1-D and non-empty, got shape {tuple(group_index.shape)}")


def _fp32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def _valid_rows(group_index: torch.Tensor, rows: int) -> torch.Tensor:
    """Count-mode row mask bound: clamp(int64 sum with wraparound, 0, rows), as a 0-d device tensor."""
    return group_index.to(torch.int64).sum().clamp(0, rows)


def validate_group_grad(grad_y, x, weight, y_origin, group_index, clamp_limit):
    """Every rejection of swiglu_group_grad.md section 2 plus the contract; returns the clamp as fp32."""
    _check_tensor("grad_y", grad_y)
    _check_tensor("x", x)
    if grad_y.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"grad_y must be bfloat16, float16 or float32, got {grad_y.dtype}")
    if x.dtype != grad_y.dtype:
        raise TypeError(f"x must have the dtype of grad_y ({grad_y.dtype}), got {x.dtype}")
    if grad_y.dim() < 2:
        raise ValueError(f"grad_y must have rank >= 2, got shape {tuple(grad_y.shape)}")
    if x.dim() != grad_y.dim():
        raise ValueError(f"x must have the rank of grad_y ({grad_y.dim()}), got shape {tuple(x.shape)}")
    if x.shape[:-1] != grad_y.shape[:-1]:
        raise ValueError(
            f"x leading dims {tuple(x.shape[:-1])} must equal grad_y leading dims {tuple(grad_y.shape[:-1])}"
        )
    hidden = grad_y.shape[-1]
    if x.shape[-1] != 2 * hidden:
        raise ValueError(f"x last dim must be 2 * grad_y last dim = {2 * hidden}, got {x.shape[-1]}")
    if hidden <= 0:
        raise ValueError("grad_y last dim (H) must be greater than 0")
    if isinstance(clamp_limit, bool) or not isinstance(clamp_limit, numbers.Real):
        raise TypeError(f"clamp_limit must be a real number, got {type(clamp_limit).__name__}")
    if not clamp_limit >= 0.0:
        raise ValueError(f"clamp_limit must be >= 0 (0 disables the clamp), got {clamp_limit}")
    _check_tensor("weight", weight, optional=True)
    _check_tensor("y_origin", y_origin, optional=True)
    if (weight is None) != (y_origin is None):
        raise ValueError("weight and y_origin must be provided together (both or neither)")
    rows = math.prod(grad_y.shape[:-1])
    if weight is not None:
        if weight.dtype != torch.float32:
            raise TypeError(f"weight must be float32, got {weight.dtype}")
        if weight.numel() != rows:
            raise ValueError(f"weight must have numel == rows = {rows}, got shape {tuple(weight.shape)}")
        if y_origin.dtype != grad_y.dtype:
            raise TypeError(f"y_origin must have the dtype of grad_y ({grad_y.dtype}), got {y_origin.dtype}")
        if y_origin.shape != grad_y.shape:
            raise ValueError(f"y_origin must have shape {tuple(grad_y.shape)}, got {tuple(y_origin.shape)}")
    if group_index is not None:
        _check_group_index(group_index)
    _check_device(grad_y, x=x, weight=weight, y_origin=y_origin, group_index=group_index)
    return _fp32(clamp_limit)


def validate_mx_quant(
    x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value
):
    """Every rejection of swiglu_backward_mx_quant.md section 1.5 plus the contract; returns the FP8Format."""
    _check_tensor("x", x)
    _check_tensor("y_grad", y_grad)
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if y_grad.dtype != x.dtype:
        raise TypeError(f"y_grad must have the dtype of x ({x.dtype}), got {y_grad.dtype}")
    if not isinstance(dst_dtype, torch.dtype):
        raise TypeError(f"dst_dtype must be a torch.dtype, got {type(dst_dtype).__name__}")
    fmt = mx.fp8_format(dst_dtype)
    if not isinstance(activate_left, bool):
        raise TypeError(f"activate_left must be a bool, got {type(activate_left).__name__}")
    if round_mode != "rint":
        raise ValueError(f"round_mode must be 'rint' (the only mode for FP8 outputs), got {round_mode!r}")
    if isinstance(scale_alg, bool) or not isinstance(scale_alg, numbers.Integral):
        raise TypeError(f"scale_alg must be an int, got {type(scale_alg).__name__}")
    if scale_alg not in (0, 1):
        raise ValueError(f"scale_alg must be 0 (OCP floor) or 1 (RCEIL / cuBLAS), got {scale_alg}")
    if isinstance(max_dtype_value, bool) or not isinstance(max_dtype_value, numbers.Real):
        raise TypeError(f"max_dtype_value must be a number, got {type(max_dtype_value).__name__}")
    if max_dtype_value != 0.0:
        raise ValueError(f"max_dtype_value is reserved and must be 0.0, got {max_dtype_value}")
    if not 2 <= x.dim() <= 6:
        raise ValueError(f"x must have rank 2..6, got shape {tuple(x.shape)}")
    c = x.shape[-1]
    if c <= 0 or c % 64 != 0:
        raise ValueError(f"x last dim (2N) must be a positive multiple of 64, got {c}")
    expected = (*x.shape[:-1], c // 2)
    if tuple(y_grad.shape) != expected:
        raise ValueError(f"y_grad must have shape {expected}, got {tuple(y_grad.shape)}")
    if group_index is not None:
        _check_group_index(group_index)
        if x.dim() != 2:
            raise ValueError(f"group_index is only supported with 2-D x, got x of rank {x.dim()}")
        _check_device(x, group_index=group_index)
        # Traced or fake tensors (torch.compile, opcheck) carry no values: the real kernel checks them.
        traced = torch.compiler.is_compiling() or is_fake(group_index)
        if group_index.device.type == "cpu" and not traced:
            _check_group_ends(group_index, x.shape[0])
    _check_device(x, y_grad=y_grad)
    return fmt


def _check_group_ends(group_index: torch.Tensor, m: int) -> None:
    ends = group_index.to(torch.int64)
    if bool((ends < 0).any()):
        raise ValueError(f"group_index (cumulative row ends) must be >= 0, got {ends.tolist()}")
    if ends.numel() > 1 and bool((ends[1:] < ends[:-1]).any()):
        raise ValueError(f"group_index (cumulative row ends) must be non-decreasing, got {ends.tolist()}")
    if int(ends[-1]) != m:
        raise ValueError(f"group_index last value must equal the number of rows M = {m}, got {int(ends[-1])}")


# ------------------------------------------------------------------------------------------------- ops


def swiglu_group_grad(
    grad_y, x, weight=None, y_origin=None, group_index=None, clamp_limit=0.0, *, backend="auto", out=None
):
    """Backward of ``y = silu(min(g, c)) * clip(u, -c, c) * weight`` with a group row mask.

    Args:
        grad_y: ``[..., H]`` bf16/fp16/fp32 upstream gradient (rank >= 2; leading dims are rows).
        x: ``[..., 2H]`` forward input, same dtype; gate ``g = x[..., :H]``, up ``u = x[..., H:]``.
        weight: fp32 per-row routing weight with ``numel == rows`` (any shape), or None.
        y_origin: ``[..., H]`` forward output; required exactly when ``weight`` is given.
        group_index: 1-D int64/int32 group **counts**; rows ``>= clamp(sum, 0, rows)`` get zero gradient.
        clamp_limit: ``0`` disables the clamp; ``> 0`` (``inf`` included) enables open-interval masks.
        backend: "auto", "reference", "cpu" or "triton".
        out: optional preallocated ``(grad_x, grad_weight)`` to write into.

    Returns:
        ``(grad_x, grad_weight)``: grad_x like x in grad_y's dtype; grad_weight fp32 in weight's shape
        (``None`` without weight) equal to ``sum_h fp32(grad_y) * fp32(y_origin)`` in NumPy pairwise order.
        It is **not** divided by weight: pass the *unweighted* forward output as ``y_origin`` to get the
        true dL/dweight (``swiglu_ops.ClampedSwiGLU`` does this).
    """
    clamp = validate_group_grad(grad_y, x, weight, y_origin, group_index, clamp_limit)
    impl = resolve_backend(backend, x.device)
    hidden = grad_y.shape[-1]
    rows = math.prod(grad_y.shape[:-1])
    if out is None:
        grad_x = _empty(impl, x.shape, grad_y.dtype, x.device)
        grad_weight = None if weight is None else _empty(impl, weight.shape, torch.float32, x.device)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError("out must be a (grad_x, grad_weight) tuple")
        grad_x = _check_out("out[0] (grad_x)", out[0], x.shape, grad_y.dtype, x.device)
        if weight is None:
            if out[1] is not None:
                raise ValueError("out[1] (grad_weight) must be None when weight is None")
            grad_weight = None
        else:
            grad_weight = _check_out("out[1] (grad_weight)", out[1], weight.shape, torch.float32, x.device)
    if rows == 0:
        return grad_x, grad_weight
    impl.swiglu_group_grad(
        grad_y.reshape(rows, hidden).contiguous(),
        x.reshape(rows, 2 * hidden).contiguous(),
        None if weight is None else weight.reshape(rows).contiguous(),
        None if y_origin is None else y_origin.reshape(rows, hidden).contiguous(),
        None if group_index is None else _valid_rows(group_index, rows),
        clamp,
        grad_x.view(rows, 2 * hidden),
        None if grad_weight is None else grad_weight.view(rows),
    )
    return grad_x, grad_weight


def _empty(impl, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output tensor: from the backend's own allocator when it has one (the cpu backend reuses freed
    outputs, see ``swiglu_ops.cpu.OutputCache``), else ``torch.empty``."""
    alloc = getattr(impl, "empty", None)
    return torch.empty(shape, dtype=dtype, device=device) if alloc is None else alloc(tuple(shape), dtype)


def mx_output_specs(x, group_index, dst_dtype):
    """(shape, dtype) of y1, mxscale1, y2, mxscale2 for ``x`` (spec 1.2); the fake kernel uses it too."""
    *lead, m, c = x.shape
    r = mx.mxscale2_rows(m, None if group_index is None else group_index.numel())
    shapes = (tuple(x.shape), mx.mxscale1_shape(x.shape), tuple(x.shape), (*lead, r, c, 2))
    dtypes = (dst_dtype, torch.float8_e8m0fnu, dst_dtype, torch.float8_e8m0fnu)
    return list(zip(shapes, dtypes, strict=True))


def swiglu_backward_mx_quant_dual_axis(
    x,
    y_grad,
    group_index=None,
    *,
    activate_left=True,
    round_mode="rint",
    scale_alg=1,
    dst_dtype=torch.float8_e4m3fn,
    max_dtype_value=0.0,
    backend="auto",
    out=None,
):
    """SwiGLU backward, rounded to x's dtype, then MX-quantised along both axes in one pass.

    Args:
        x: ``[..., M, 2N]`` (rank 2..6) bf16/fp16/fp32, ``2N % 64 == 0``; A = left half if ``activate_left``.
        y_grad: ``[..., M, N]``, same dtype.
        group_index: 1-D int64/int32 cumulative row **ends** (2-D x only); token-axis blocks restart at
            every group start.
        scale_alg: 1 = RCEIL ("cuBLAS", default), 0 = OCP floor.
        dst_dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
        round_mode / max_dtype_value: must be "rint" / 0.0 (Ascend's only accepted values).
        backend: "auto", "reference", "cpu" or "triton".
        out: optional preallocated ``(y1, mxscale1, y2, mxscale2)``.

    Returns:
        ``(y1, mxscale1, y2, mxscale2)``: y1/y2 like x in dst_dtype; mxscale1 ``[..., M, 2N/64, 2]`` and
        mxscale2 ``[..., R, 2N, 2]`` (``R = M//64 + G`` with groups, else ``ceil(M/64)``) as
        ``torch.float8_e8m0fnu`` (``.view(torch.uint8)`` gives the raw E8M0 codes).
    """
    fmt = validate_mx_quant(
        x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value
    )
    impl = resolve_backend(backend, x.device)
    specs = mx_output_specs(x, group_index, dst_dtype)
    names = ("out[0] (y1)", "out[1] (mxscale1)", "out[2] (y2)", "out[3] (mxscale2)")
    if out is None:
        outs = [_empty(impl, s, d, x.device) for s, d in specs]
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 4:
            raise TypeError("out must be a (y1, mxscale1, y2, mxscale2) tuple")
        outs = [_check_out(n, t, s, d, x.device) for n, t, (s, d) in zip(names, out, specs, strict=True)]
    y1, s1, y2, s2 = outs
    s2.view(torch.uint8).zero_()  # unused mxscale2 rows are zero-filled (contract section 2)
    *lead, m, c = x.shape
    batch = math.prod(lead)
    if batch * m == 0:
        return y1, s1, y2, s2
    impl.swiglu_bwd_mx_quant(
        x.reshape(batch, m, c).contiguous(),
        y_grad.reshape(batch, m, c // 2).contiguous(),
        None if group_index is None else group_index.to(torch.int64).contiguous(),
        activate_left,
        int(scale_alg),
        fmt,
        y1.view(torch.uint8).view(batch, m, c),
        s1.view(torch.uint8).view(batch, m, c // 32),
        y2.view(torch.uint8).view(batch, m, c),
        s2.view(torch.uint8).view(batch, s2.shape[-3], c, 2),
    )
    return y1, s1, y2, s2
