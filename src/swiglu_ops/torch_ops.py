"""The two operators as PyTorch custom ops: ``torch.ops.swiglu_ops.swiglu_group_grad`` and
``torch.ops.swiglu_ops.swiglu_backward_mx_quant_dual_axis``.

Registering them with :mod:`torch.library` lets ``torch.compile(fullgraph=True)`` trace through code that
calls them (the op stays one opaque node; its fake implementation gives Inductor the output shapes) and lets
``torch.library.opcheck`` verify schema, fake kernel and real kernel against each other.

- The real kernel (one implementation registered for CPU and CUDA tensors) is :mod:`swiglu_ops._api`:
  validation, then dispatch to the backend named by ``backend``.
- The fake kernel runs the same validation (shapes, dtypes, attributes; group_index *values* are only
  checked by the real kernel) and allocates the outputs. Every output shape depends only on input shapes;
  mxscale2's row count depends on ``G = group_index.numel()``, which is static.
- Both ops return fresh tensors (no ``out=``, nothing mutated). The public functions
  :func:`swiglu_ops.swiglu_group_grad` / :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis` are the
  eager entry points that also accept ``out=``.

**grad_weight without weight.** A custom-op schema cannot return an optional tensor, so
``swiglu_group_grad`` returns ``grad_weight`` as an empty fp32 tensor of shape ``(0,)`` when ``weight`` is
None (schema ``-> (Tensor, Tensor)``). :func:`swiglu_ops.swiglu_group_grad` returns ``None`` there instead.
"""

from __future__ import annotations

import torch

from . import _api

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
    "int scale_alg=1, ScalarType dst_dtype=float8_e4m3fn, float max_dtype_value=0.0, str backend='auto') "
    "-> (Tensor, Tensor, Tensor, Tensor)"
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
    scale_alg: int = 1,
    dst_dtype: torch.dtype = torch.float8_e4m3fn,
    max_dtype_value: float = 0.0,
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
    backend="auto",
):
    _api.validate_mx_quant(
        x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value
    )
    _api.resolve_backend(backend, x.device)
    return tuple(x.new_empty(s, dtype=d) for s, d in _api.mx_output_specs(x, group_index, dst_dtype))
