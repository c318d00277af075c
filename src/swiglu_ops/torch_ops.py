"""The operators as PyTorch custom ops: ``torch.ops.swiglu_ops.swiglu_group_grad``,
``torch.ops.swiglu_ops.swiglu_backward_mx_quant_dual_axis``, ``torch.ops.swiglu_ops.clipped_swiglu`` and
``torch.ops.swiglu_ops.clipped_swiglu_grad`` (plus the private ``_clipped_swiglu_grad_mode1``, the backward
of the clamp_mode-1 forward used by :class:`swiglu_ops.nn.ClippedSwigluFunction`), and
``torch.ops.swiglu_ops.swiglu_mx_quant_dual_axis``, whose ``dst_dtype`` is the format's name (a string, see
its schema).

Registering them with :mod:`torch.library` lets ``torch.compile(fullgraph=True)`` trace through code that
calls them (the op stays one opaque node; its fake implementation gives Inductor the output shapes) and lets
``torch.library.opcheck`` verify schema, fake kernel and real kernel against each other.

- The real kernel (one implementation registered for CPU and CUDA tensors) is :mod:`swiglu_ops._api`:
  validation, then dispatch to the backend named by ``backend``.
- The fake kernel runs the same validation (shapes, dtypes, attributes; group_index *values* are only
  checked by the real kernel) and allocates the outputs. Every output shape depends only on input shapes;
  mxscale2's row count depends on ``G = group_index.numel()``, which is static.
- The ops return fresh tensors (no ``out=``, nothing mutated). The public functions
  (:func:`swiglu_ops.swiglu_group_grad`, :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis`,
  :func:`swiglu_ops.clipped_swiglu`, ...) are the eager entry points that also accept ``out=``.

**grad_weight without weight.** A custom-op schema cannot return an optional tensor, so
``swiglu_group_grad`` returns ``grad_weight`` as an empty fp32 tensor of shape ``(0,)`` when ``weight`` is
None (schema ``-> (Tensor, Tensor)``). :func:`swiglu_ops.swiglu_group_grad` returns ``None`` there instead.
"""

from __future__ import annotations

import torch

from . import _api, layouts, mx

_LIB = "swiglu_ops"
_DEVICES = ("cpu", "cuda")


def _empty_weight_grad(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((0,), dtype=torch.float32)


# Explicit schemas: the contract of the ops, independent of Python annotations (which would turn the int
# attribute into SymInt).
_GROUP_GRAD_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor? weight=None, Tensor? y_origin=None, Tensor? group_index=None, "
    "float clamp_limit=0.0, *, str backend='auto') -> (Tensor, Tensor)"
)
_MX_QUANT_SCHEMA = (
    "(Tensor x, Tensor y_grad, Tensor? group_index=None, *, bool activate_left=True, str round_mode='rint', "
    "int? scale_alg=1, ScalarType dst_dtype=float8_e4m3fn, float max_dtype_value=0.0, float? limit=None, "
    "float? alpha=None, float? bias=None, bool interleaved=False, bool transpose_y2=False, "
    "str backend='auto') -> (Tensor, Tensor, Tensor, Tensor)"
)


@torch.library.custom_op(
    f"{_LIB}::swiglu_group_grad", mutates_args=(), device_types=_DEVICES, schema=_GROUP_GRAD_SCHEMA
)
def swiglu_group_grad(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    y_origin: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    clamp_limit: float = 0.0,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`swiglu_ops.swiglu_group_grad`; grad_weight is an empty ``(0,)`` tensor without weight."""
    grad_x, grad_weight = _api.swiglu_group_grad(
        grad_y, x, weight, y_origin, group_index, clamp_limit, backend=backend
    )
    return grad_x, _empty_weight_grad(x) if grad_weight is None else grad_weight


@swiglu_group_grad.register_fake
def _swiglu_group_grad_fake(
    grad_y, x, weight=None, y_origin=None, group_index=None, clamp_limit=0.0, *, backend="auto"
):
    _api.validate_group_grad(grad_y, x, weight, y_origin, group_index, clamp_limit)
    _api.resolve_backend(backend, x.device)
    grad_x = x.new_empty(x.shape, dtype=grad_y.dtype)
    if weight is None:
        return grad_x, _empty_weight_grad(x)
    return grad_x, x.new_empty(weight.shape, dtype=torch.float32)


@torch.library.custom_op(
    f"{_LIB}::swiglu_backward_mx_quant_dual_axis",
    mutates_args=(),
    device_types=_DEVICES,
    schema=_MX_QUANT_SCHEMA,
)
def swiglu_backward_mx_quant_dual_axis(
    x: torch.Tensor,
    y_grad: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    activate_left: bool = True,
    round_mode: str = "rint",
    scale_alg: int | None = 1,
    dst_dtype: torch.dtype = torch.float8_e4m3fn,
    max_dtype_value: float = 0.0,
    limit: float | None = None,
    alpha: float | None = None,
    bias: float | None = None,
    interleaved: bool = False,
    transpose_y2: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """See :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis`."""
    return _api.swiglu_backward_mx_quant_dual_axis(
        x,
        y_grad,
        group_index,
        activate_left=activate_left,
        round_mode=round_mode,
        scale_alg=scale_alg,
        dst_dtype=dst_dtype,
        max_dtype_value=max_dtype_value,
        limit=limit,
        alpha=alpha,
        bias=bias,
        interleaved=interleaved,
        transpose_y2=transpose_y2,
        backend=backend,
    )


@swiglu_backward_mx_quant_dual_axis.register_fake
def _swiglu_backward_mx_quant_dual_axis_fake(
    x,
    y_grad,
    group_index=None,
    *,
    activate_left=True,
    round_mode="rint",
    scale_alg=1,
    dst_dtype=torch.float8_e4m3fn,
    max_dtype_value=0.0,
    limit=None,
    alpha=None,
    bias=None,
    interleaved=False,
    transpose_y2=False,
    backend="auto",
):
    scale_alg = _api.bwd_mx_scale_alg(scale_alg)
    fmt = _api.validate_mx_quant(
        x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value
    )
    _api.check_transpose_y2(transpose_y2, fmt)
    _api.mx_glu_params(activate_left, interleaved, limit, alpha, bias)
    _api.resolve_backend(backend, x.device)
    specs = _api.mx_output_specs(x, group_index, dst_dtype, transpose_y2)
    return tuple(x.new_empty(s, dtype=d) for s, d in specs)


# ------------------------------------------------------------------------------ clipped SwiGLU (GPT-OSS)

_CLIPPED_ATTRS = "int dim=-1, float alpha=1.702, float limit=7.0, float bias=1.0, bool interleaved=True"
_CLIPPED_SCHEMA = (
    f"(Tensor x, Tensor? group_index=None, *, {_CLIPPED_ATTRS}, int clamp_mode=0, "
    "str backend='auto') -> Tensor"
)
_CLIPPED_GRAD_SCHEMA = (
    f"(Tensor grad_y, Tensor x, Tensor? group_index=None, *, {_CLIPPED_ATTRS}, str backend='auto') -> Tensor"
)
_CLIPPED_GRAD_MODE1_SCHEMA = (
    "(Tensor grad_y, Tensor x, Tensor? group_index=None, *, int dim=-1, float limit=7.0, "
    "bool interleaved=True, str backend='auto') -> Tensor"
)


@torch.library.custom_op(
    f"{_LIB}::clipped_swiglu", mutates_args=(), device_types=_DEVICES, schema=_CLIPPED_SCHEMA
)
def clipped_swiglu(
    x: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    dim: int = -1,
    alpha: float = 1.702,
    limit: float = 7.0,
    bias: float = 1.0,
    interleaved: bool = True,
    clamp_mode: int = 0,
    backend: str = "auto",
) -> torch.Tensor:
    """See :func:`swiglu_ops.clipped_swiglu` (not differentiable itself: autograd goes through
    :class:`swiglu_ops.nn.ClippedSwigluFunction`)."""
    return _api.clipped_swiglu(
        x, group_index, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved,
        clamp_mode=clamp_mode, backend=backend,
    )  # fmt: skip


@clipped_swiglu.register_fake
def _clipped_swiglu_fake(
    x,
    group_index=None,
    *,
    dim=-1,
    alpha=1.702,
    limit=7.0,
    bias=1.0,
    interleaved=True,
    clamp_mode=0,
    backend="auto",
):
    d, _ = _api.validate_clipped_swiglu(
        x, group_index, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved,
        clamp_mode=clamp_mode,
    )  # fmt: skip
    _api.resolve_backend(backend, x.device)
    return x.new_empty(_api.clipped_half_shape(x.shape, d))


@torch.library.custom_op(
    f"{_LIB}::clipped_swiglu_grad", mutates_args=(), device_types=_DEVICES, schema=_CLIPPED_GRAD_SCHEMA
)
def clipped_swiglu_grad(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    dim: int = -1,
    alpha: float = 1.702,
    limit: float = 7.0,
    bias: float = 1.0,
    interleaved: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """See :func:`swiglu_ops.clipped_swiglu_grad`."""
    return _api.clipped_swiglu_grad(
        grad_y, x, group_index, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved,
        backend=backend,
    )  # fmt: skip


def _clipped_grad_fake(grad_y, x, group_index, dim, limit, interleaved, backend, **glu):
    _api.validate_clipped_swiglu(
        x, group_index, dim=dim, limit=limit, interleaved=interleaved, grad_y=grad_y, backward=True, **glu
    )
    _api.resolve_backend(backend, x.device)
    return x.new_empty(x.shape)


@clipped_swiglu_grad.register_fake
def _clipped_swiglu_grad_fake(
    grad_y, x, group_index=None, *, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, backend="auto"
):
    return _clipped_grad_fake(
        grad_y, x, group_index, dim, limit, interleaved, backend, alpha=alpha, bias=bias, clamp_mode=0
    )


@torch.library.custom_op(
    f"{_LIB}::_clipped_swiglu_grad_mode1",
    mutates_args=(),
    device_types=_DEVICES,
    schema=_CLIPPED_GRAD_MODE1_SCHEMA,
)
def _clipped_swiglu_grad_mode1(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    dim: int = -1,
    limit: float = 7.0,
    interleaved: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """Private (a swiglu_ops extension, not a CANN operator): the backward of
    ``clipped_swiglu(..., clamp_mode=1)`` used by the autograd module
    (:func:`swiglu_ops._api.clipped_swiglu_grad_mode1`)."""
    return _api.clipped_swiglu_grad_mode1(
        grad_y, x, group_index, dim=dim, limit=limit, interleaved=interleaved, backend=backend
    )


@_clipped_swiglu_grad_mode1.register_fake
def _clipped_swiglu_grad_mode1_fake(
    grad_y, x, group_index=None, *, dim=-1, limit=7.0, interleaved=True, backend="auto"
):
    return _clipped_grad_fake(
        grad_y, x, group_index, dim, limit, interleaved, backend, alpha=1.0, bias=0.0, clamp_mode=1
    )


# ----------------------------------------------------------------- forward SwiGLU + dual-axis MX (FP8/FP4)

# The destination format travels as its **name** (``str dst_dtype``): the E1M2 sentinel
# ``swiglu_ops.float4_e1m2fn_x2`` is a string, not a ScalarType, and one string argument carries all four
# formats alike: "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2" (a torch dtype's name without
# "torch.") and "float4_e1m2fn_x2" (the sentinel's value). ``swiglu_ops.mx.dst_name`` converts a dtype.
_MX_FORWARD_SCHEMA = (
    "(Tensor x, Tensor? group_index=None, *, bool activate_left=True, str round_mode='rint', "
    "int? scale_alg=None, str dst_dtype='float8_e4m3fn', float max_dtype_value=0.0, float? limit=None, "
    "float? alpha=None, float? bias=None, bool interleaved=False, bool transpose_y2=False, "
    "str backend='auto') -> (Tensor, Tensor, Tensor, Tensor)"
)


@torch.library.custom_op(
    f"{_LIB}::swiglu_mx_quant_dual_axis", mutates_args=(), device_types=_DEVICES, schema=_MX_FORWARD_SCHEMA
)
def swiglu_mx_quant_dual_axis(
    x: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    activate_left: bool = True,
    round_mode: str = "rint",
    scale_alg: int | None = None,
    dst_dtype: str = "float8_e4m3fn",
    max_dtype_value: float = 0.0,
    limit: float | None = None,
    alpha: float | None = None,
    bias: float | None = None,
    interleaved: bool = False,
    transpose_y2: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """See :func:`swiglu_ops.swiglu_mx_quant_dual_axis`; ``dst_dtype`` is the format's name (a string)."""
    return _api.swiglu_mx_quant_dual_axis(
        x, group_index, activate_left=activate_left, round_mode=round_mode, scale_alg=scale_alg,
        dst_dtype=mx.dst_from_name(dst_dtype), max_dtype_value=max_dtype_value, limit=limit, alpha=alpha,
        bias=bias, interleaved=interleaved, transpose_y2=transpose_y2, backend=backend,
    )  # fmt: skip


@swiglu_mx_quant_dual_axis.register_fake
def _swiglu_mx_quant_dual_axis_fake(
    x,
    group_index=None,
    *,
    activate_left=True,
    round_mode="rint",
    scale_alg=None,
    dst_dtype="float8_e4m3fn",
    max_dtype_value=0.0,
    limit=None,
    alpha=None,
    bias=None,
    interleaved=False,
    transpose_y2=False,
    backend="auto",
):
    fmt, *_ = _api.validate_mx_forward(
        x, group_index, activate_left, round_mode, scale_alg, mx.dst_from_name(dst_dtype), max_dtype_value,
        limit, alpha, bias, interleaved,
    )  # fmt: skip
    _api.check_transpose_y2(transpose_y2, fmt)
    _api.resolve_backend(backend, x.device)
    specs = _api.mx_forward_output_specs(x, group_index, fmt, transpose_y2)
    return tuple(x.new_empty(s, dtype=d) for s, d in specs)


# ---------------------------------------------------------------- dequantisation and scale layouts (opaque)
#
# Inside torch.compile the public functions swiglu_ops.mx_dequantize and swiglu_ops.layouts.* become these
# ops: one opaque node each, whose real kernel is the eager function. Inductor cannot generate code that
# reads or writes float8_e8m0fnu tensors (its C++ and Triton code generators have no such type), and every
# output shape here is a function of input shapes (and the number of groups) only, so a fake kernel exists.

_MX_DEQUANTIZE_SCHEMA = (
    "(Tensor data, Tensor scale, int axis=-1, Tensor? group_index=None, *, ScalarType dtype=float32, "
    "str? dst_dtype=None) -> Tensor"
)


@torch.library.custom_op(
    f"{_LIB}::mx_dequantize", mutates_args=(), device_types=_DEVICES, schema=_MX_DEQUANTIZE_SCHEMA
)
def mx_dequantize(data, scale, axis=-1, group_index=None, *, dtype=torch.float32, dst_dtype=None):
    """See :func:`swiglu_ops.mx_dequantize`; ``dst_dtype`` is the format's name (a string) or None."""
    dst = None if dst_dtype is None else mx.dst_from_name(dst_dtype)
    return mx.mx_dequantize(data, scale, axis=axis, group_index=group_index, dtype=dtype, dst_dtype=dst)


@mx_dequantize.register_fake
def _mx_dequantize_fake(data, scale, axis=-1, group_index=None, *, dtype=torch.float32, dst_dtype=None):
    dst = None if dst_dtype is None else mx.dst_from_name(dst_dtype)
    _, shape = mx.dequantize_spec(data, scale, axis, group_index, dst)
    return data.new_empty(shape, dtype=dtype)


@torch.library.custom_op(
    f"{_LIB}::to_blocked", mutates_args=(), device_types=_DEVICES, schema="(Tensor scales) -> Tensor"
)
def to_blocked(scales):
    """See :func:`swiglu_ops.layouts.to_blocked`."""
    return layouts.to_blocked(scales)


@to_blocked.register_fake
def _to_blocked_fake(scales):
    layouts._check_scales("scales", scales, rank=2)
    rows, cols = scales.shape
    return scales.new_empty((layouts._ceil_to(rows, 128), layouts._ceil_to(cols, 4)))


@torch.library.custom_op(
    f"{_LIB}::mxscale1_to_blocked",
    mutates_args=(),
    device_types=_DEVICES,
    schema="(Tensor mxscale1, Tensor? group_index=None) -> Tensor",
)
def mxscale1_to_blocked(mxscale1, group_index=None):
    """See :func:`swiglu_ops.layouts.mxscale1_to_blocked`."""
    return layouts.mxscale1_to_blocked(mxscale1, group_index)


@mxscale1_to_blocked.register_fake
def _mxscale1_to_blocked_fake(mxscale1, group_index=None):
    plain = layouts.mxscale1_to_plain(mxscale1)
    cols = layouts._ceil_to(plain.shape[-1], 4)
    if group_index is None:
        return mxscale1.new_empty((layouts._ceil_to(plain.numel() // plain.shape[-1], 128), cols))
    if plain.dim() != 2:
        raise ValueError("group_index is only supported with 2-D x (mxscale1 of rank 3)")
    layouts._check_groups(group_index, mxscale1, plain.shape[0])
    return mxscale1.new_empty((128 * layouts.blocked_tiles_bound(plain.shape[0], group_index.numel()), cols))


_MXSCALE2_SCHEMA = "(Tensor mxscale2, SymInt num_rows, Tensor? group_index=None) -> Tensor"


@torch.library.custom_op(
    f"{_LIB}::mxscale2_to_blocked", mutates_args=(), device_types=_DEVICES, schema=_MXSCALE2_SCHEMA
)
def mxscale2_to_blocked(mxscale2, num_rows, group_index=None):
    """See :func:`swiglu_ops.layouts.mxscale2_to_blocked`."""
    return layouts.mxscale2_to_blocked(mxscale2, num_rows, group_index)


@mxscale2_to_blocked.register_fake
def _mxscale2_to_blocked_fake(mxscale2, num_rows, group_index=None):
    layouts._check_mxscale2(mxscale2, num_rows, group_index)
    g = None if group_index is None else group_index.numel()
    tiles = layouts.blocked_tiles_bound(num_rows, g)
    return mxscale2.new_empty((layouts._ceil_to(mxscale2.shape[1], 128), 4 * tiles))


@torch.library.custom_op(
    f"{_LIB}::mxscale2_to_plain", mutates_args=(), device_types=_DEVICES, schema=_MXSCALE2_SCHEMA
)
def mxscale2_to_plain(mxscale2, num_rows, group_index=None):
    """See :func:`swiglu_ops.layouts.mxscale2_to_plain`."""
    return layouts.mxscale2_to_plain(mxscale2, num_rows, group_index)


@mxscale2_to_plain.register_fake
def _mxscale2_to_plain_fake(mxscale2, num_rows, group_index=None):
    layouts._check_mxscale2(mxscale2, num_rows, group_index)
    g = 1 if group_index is None else group_index.numel()
    return mxscale2.new_empty((-(-num_rows // 32) + g - 1, mxscale2.shape[1]))
