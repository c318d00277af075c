"""The operators as PyTorch custom ops, ``torch.ops.swiglu_ops.<name>``, generated from the operator table.

For every row of :mod:`.table`: the schema (its parameters' schema types and defaults, then
``str backend='auto'``; one ``Tensor`` per output), the real kernel (one implementation for CPU and CUDA
tensors: :func:`swiglu_ops.ops.api.run`, i.e. validation, the registry's backend, the kernel) and the fake
kernel (the same validation, then the output shapes and dtypes of the row's plan; group_index *values* are
only checked by the real kernel). So ``torch.compile(fullgraph=True)`` traces code that calls them (one
opaque node each), ``torch.library.opcheck`` checks schema, fake and real kernel against each other, and
fake tensors, meta tensors and tensor subclasses reach the operators through torch's dispatcher.

The ops return fresh tensors (no ``out=``, nothing mutated). An output that exists only with some argument
(``swiglu_group_grad``'s grad_weight without weight) is an empty fp32 ``(0,)`` tensor here (a schema cannot
return None); the public functions return None there. Also here: ``torch.ops.swiglu_ops.mx_dequantize``.
Their DTensor sharding rules are in :mod:`.sharding`, registered at the end of this module (at once, or when
``torch.distributed.tensor`` is imported).
"""

from __future__ import annotations

import dataclasses

import torch

from ..numerics import mx
from . import api, registry, sharding
from .table import OPERATORS, REQUIRED, OpDef

_DEVICES = ("cpu", "cuda")


def schema_params(op: OpDef) -> list:
    """The row's parameters in schema order: torch.library takes no keyword-only tensor, so a keyword-only
    tensor of the public function (the MX operators' ``weight``) is positional here, after the others."""
    tensors = [p for p in op.params if p.is_tensor]
    return tensors + [p for p in op.params if not p.is_tensor]


def schema(op: OpDef) -> str:
    """The custom op's schema, from the row."""
    parts, seen_kw = [], False
    for p in schema_params(op):
        p = p if not p.is_tensor else dataclasses.replace(p, kw_only=False)
        if p.kw_only and not seen_kw:
            parts.append("*")
            seen_kw = True
        parts.append(f"{p.schema} {p.name}" + ("" if p.default is REQUIRED else f"={p.schema_default()}"))
    if not seen_kw:
        parts.append("*")
    parts.append("str backend='auto'")
    outs = ", ".join("Tensor" for _ in op.outputs)
    return f"({', '.join(parts)}) -> " + (outs if len(op.outputs) == 1 else f"({outs})")


def _values(op: OpDef, args: dict) -> dict:
    """Schema values -> the public function's values (e.g. a format name back to the dtype)."""
    return {p.name: args[p.name] if p.from_schema is None else p.from_schema(args[p.name]) for p in op.params}


def _absent_output(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,), dtype=torch.float32)


def _results(op: OpDef, outs, like: torch.Tensor):
    outs = [_absent_output(like) if t is None else t for t in outs]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _first_tensor(op: OpDef, args: dict) -> torch.Tensor:
    return next(args[n] for n in op.tensor_params if args[n] is not None)


def _register(op: OpDef) -> None:
    params = schema_params(op)
    names = [p.name for p in params]

    def bind(args, kwargs):
        """The dispatcher's arguments as the public function's values, and the backend."""
        values = dict(zip(names, args, strict=False)) | kwargs
        backend = values.pop("backend", "auto")
        for p in params[len(args) :]:
            values.setdefault(p.name, p.default if p.to_schema is None else p.to_schema(p.default))
        return _values(op, values), backend

    def real(*args, **kwargs):
        values, backend = bind(args, kwargs)
        return _results(op, api.run(op, values, backend), _first_tensor(op, values))

    def fake(*args, **kwargs):
        values, backend = bind(args, kwargs)
        plan = op.plan(**values)
        if plan.device.type == "meta":  # no kernel to select: the backend's name only
            registry.check_backend_name(backend)
        else:
            registry.select(backend, op.kernel, op.name, plan.device, plan.dtype)  # a bad backend errs here
        like = _first_tensor(op, values)
        outs = [None if s is None else like.new_empty(s[0], dtype=s[1]) for s in plan.outputs]
        return _results(op, outs, like)

    real.__name__ = fake.__name__ = op.name
    defined = torch.library.custom_op(
        op.qualified, real, mutates_args=(), device_types=_DEVICES, schema=schema(op)
    )
    defined.register_fake(fake)


for _op in OPERATORS.values():
    _register(_op)


# -------------------------------------------------------------------------------------- mx_dequantize

_MX_DEQUANTIZE_SCHEMA = (
    "(Tensor data, Tensor scale, int axis=-1, Tensor? group_index=None, *, ScalarType dtype=float32, "
    "str? dst_dtype=None) -> Tensor"
)


@torch.library.custom_op(
    "swiglu_ops::mx_dequantize", mutates_args=(), device_types=_DEVICES, schema=_MX_DEQUANTIZE_SCHEMA
)
def mx_dequantize(data, scale, axis=-1, group_index=None, *, dtype=torch.float32, dst_dtype=None):
    """See :func:`swiglu_ops.mx_dequantize`; ``dst_dtype`` is the format's name (a string) or None."""
    dst = None if dst_dtype is None else mx.dst_from_name(dst_dtype)
    return api.dequantize_eager(data, scale, axis, group_index, dtype, dst)


@mx_dequantize.register_fake
def _mx_dequantize_fake(data, scale, axis=-1, group_index=None, *, dtype=torch.float32, dst_dtype=None):
    from .validate import dequantize_spec

    dst = None if dst_dtype is None else mx.dst_from_name(dst_dtype)
    _, shape = dequantize_spec(data, scale, axis, group_index, dst, dtype)
    return data.new_empty(shape, dtype=dtype)


# DTensor's sharding rules for every op of this module (registered once torch.distributed.tensor is imported)
sharding.register_when_loaded()
