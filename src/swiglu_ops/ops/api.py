"""The public functions: validate -> registry -> one backend kernel -> outputs, for every operator of the
table; and :func:`mx_dequantize`.

Every public operator function is generated from its row of :mod:`.table` (signature, defaults, docstring)
and runs :func:`call`, the one dispatch point:

0. Every scalar argument's type (its schema type, or its parameter's own rule) and the backend's name are
   checked, on every path below: the custom op's schema would coerce a wrong type.
1. Inside ``torch.compile`` the call becomes the registered custom op (one opaque node; its fake kernel gives
   the output shapes). A call whose tensors no kernel may read through a pointer (fake, meta, a tensor
   subclass such as a DTensor, or any call under an active ``TorchDispatchMode``) goes through the custom op
   as well, where torch dispatches it (the gate of :mod:`.validate`).
2. Otherwise the row's plan validates the arguments (:mod:`.validate`) and says what to allocate and how the
   kernel contract is called; inputs are detached and their negative/conjugate bits resolved.
3. The registry (:mod:`.registry`) selects the backend's kernel for the device and dtype.
4. The outputs are allocated (the backend's allocator where it has one) or the ``out=`` tensors checked
   (shape, dtype, device, contiguity, plain storage, no overlap with an input or each other by address), and
   the kernel writes them.

The custom ops' real kernel is step 2-4 (:func:`run`), so that eager calls skip the dispatcher's cost.
"""

from __future__ import annotations

import torch

from ..numerics.mx import dequantize, dst_name
from . import registry
from . import validate as V
from .table import OPERATORS, PUBLIC, REQUIRED, OpDef

__all__ = [op.name for op in PUBLIC] + ["mx_dequantize", "call", "run", "available_backends"]

available_backends = registry.available_backends


def _custom_op(op: OpDef):
    return getattr(torch.ops.swiglu_ops, op.name)


def _schema_values(op: OpDef, values: dict) -> dict:
    return {p.name: values[p.name] if p.to_schema is None else p.to_schema(values[p.name]) for p in op.params}


def _public_result(op: OpDef, outs, values: dict):
    """The outputs as the public function returns them: an absent output None (or left out where the row
    drops it); one output alone, not in a tuple."""
    if len(op.outputs) == 1:
        return outs[0]
    returned = op.returned(values)
    return tuple(
        t if o.present(values) else None for o, t in zip(op.outputs, outs, strict=True) if o in returned
    )


def _via_custom_op(op: OpDef, values: dict, backend, out):
    """Steps 1: the registered custom op (torch.compile, fake/meta tensors, subclasses, dispatch modes)."""
    compiling = torch.compiler.is_compiling()
    if out is not None and not (compiling and op.compile_out):
        if compiling:
            raise ValueError(
                f"out= is not supported inside torch.compile for {op.name}: Inductor cannot copy into "
                "float8_e8m0fnu / float4_e2m1fn_x2 tensors; use the returned tensors"
            )
        raise TypeError(
            f"out= needs plain dense tensors everywhere: {op.name} got a tensor that its kernels cannot "
            "read through a pointer (fake, meta, a subclass such as DTensor, or a dispatch mode is active); "
            "call it without out="
        )
    if compiling or any(V.is_dtensor(values[n]) for n in op.tensor_params):
        op.plan(**values)  # DTensor would wrap the fake kernel's TypeError / ValueError in a RuntimeError
    # detached as on the plain path: the operators are not differentiable (no output requires grad)
    args = {n: V.detached(v) for n, v in _schema_values(op, values).items()}
    outs = _custom_op(op)(**args, backend=backend)
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    if out is not None:  # torch.compile, copyable dtypes: the fresh results copied
        given = _out_slots(op, values, out)
        for name, o, t, r in zip(op.out_names(), op.outputs, given, outs, strict=True):
            if _absent_out(name, o.present(values), t):
                continue
            V.check_out(name, t, r.shape, r.dtype, r.device).copy_(r)
        return out
    return _public_result(op, outs, values)


def _out_slots(op: OpDef, values: dict, out) -> list:
    """``out=`` as one entry per output of the table (None for an absent output that takes no slot)."""
    if len(op.outputs) == 1:
        return [out]
    # as many as the public function returns: an absent dropped output takes no slot
    kept = op.returned(values)
    if not isinstance(out, (tuple, list)) or len(out) != len(kept):
        raise TypeError(f"out must be a ({', '.join(o.name for o in kept)}) tuple")
    slots = iter(out)
    return [next(slots) if o in kept else None for o in op.outputs]


def _absent_out(name: str, present: bool, t) -> bool:
    """Whether an output is absent for these arguments; its ``out=`` entry must then be None."""
    if present:
        return False
    if t is not None:
        raise ValueError(f"{name} must be None for these arguments (the output is absent)")
    return True


def _check_outs(op: OpDef, values: dict, plan, out, device) -> list:
    names = op.out_names()
    given = _out_slots(op, values, out)
    outs = []
    for name, t, spec in zip(names, given, plan.outputs, strict=True):
        if _absent_out(name, spec is not None, t):
            outs.append(None)
            continue
        outs.append(V.check_out(name, t, spec[0], spec[1], device))
        V.check_out_plain(name, t)
    V.check_outs_distinct(zip(names, outs, strict=True))
    for name, t in zip(names, outs, strict=True):
        if t is not None:
            V.check_no_overlap(name, t, **plan.inputs)
    return outs


def run(op: OpDef, values: dict, backend="auto", out=None):
    """Steps 2-4 on plain tensors: validate, select, allocate or check ``out=``, launch. Returns the outputs
    in table order (None for absent optional ones)."""
    values = {n: V.kernel_ready(v) for n, v in values.items()}
    plan = op.plan(**values)
    impl, kernel = registry.select(backend, op.kernel, op.name, plan.device, plan.dtype)
    if out is None:
        outs = [None if s is None else _empty(impl, s[0], s[1], plan.device) for s in plan.outputs]
    else:
        outs = _check_outs(op, values, plan, out, plan.device)
    if plan.launch is not None:
        plan.launch(kernel, outs)
    elif plan.fill is not None:
        plan.fill(outs)
    return outs


def _empty(impl, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output tensor: from the backend's own allocator when it has one (the cpu backend reuses freed
    outputs), else ``torch.empty``."""
    if impl.empty is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return impl.empty(tuple(shape), dtype)


def call(op: OpDef, values: dict, backend="auto", out=None):
    """The one dispatch point of every public operator function (module docstring)."""
    for p in op.params:  # before either path: the custom op's schema would coerce a wrong type
        p.check(values[p.name])
    registry.check_backend_name(backend)
    if torch.compiler.is_compiling() or V.needs_dispatch({n: values[n] for n in op.tensor_params}):
        return _via_custom_op(op, values, backend, out)
    return _public_result(op, run(op, values, backend, out), values)


def _make_public(op: OpDef):
    """The public function of a table row: a real Python signature (generated source, so that torch.compile
    traces it as plain bytecode) whose body is :func:`call`."""
    params, names, seen_kw = [], [], False
    for p in op.params:
        if p.kw_only and not seen_kw:
            params.append("*")
            seen_kw = True
        params.append(p.name if p.default is REQUIRED else f"{p.name}=_defaults[{p.name!r}]")
        names.append(p.name)
    if not seen_kw:
        params.append("*")
    params += ["backend='auto'", "out=None"]
    values = ", ".join(f"{n!r}: {n}" for n in names)
    source = f"def {op.name}({', '.join(params)}):\n    return _call(_op, {{{values}}}, backend, out)\n"
    namespace = {"_call": call, "_op": op, "_defaults": {p.name: p.default for p in op.params}}
    exec(compile(source, f"<swiglu_ops.ops.table: {op.name}>", "exec"), namespace)  # noqa: S102
    fn = namespace[op.name]
    fn.__doc__ = op.doc
    fn.__module__ = "swiglu_ops"
    return fn


for _op in PUBLIC:
    globals()[_op.name] = _make_public(_op)

#: The backward of ``clipped_swiglu(..., clamp_mode=1)`` (a library extension), for the autograd module.
clipped_swiglu_grad_mode1 = _make_public(OPERATORS["_clipped_swiglu_grad_mode1"])


# ------------------------------------------------------------------------------------ mx_dequantize


def mx_dequantize(
    data: torch.Tensor,
    scale: torch.Tensor,
    *,
    axis: int = -1,
    group_index: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    dst_dtype=None,
) -> torch.Tensor:
    """Inverse of the MX quantisation: ``value = element(data) * 2**(scale - 127)``.

    - ``axis=-1``: ``data`` is ``y1`` and ``scale`` is ``mxscale1`` ``[*batch, M, ceil(N/64), 2]`` (element j
      of a row uses block j // 32; N need not be a multiple of 32).
    - ``axis=-2``: ``data`` is ``y2`` and ``scale`` is ``mxscale2`` ``[*batch, R, N, 2]``; pass the same
      ``group_index`` (cumulative row ends: int64/int32, non-decreasing, >= 0, ending at M) that produced
      them.

    ``data`` is ``[*batch, M, N]`` FP8 (``float8_e4m3fn`` / ``float8_e5m2``) or ``[*batch, M, N/2]`` packed
    FP4 (``float4_e2m1fn_x2``), or ``uint8`` codes of the format named by ``dst_dtype`` (as the operators'
    argument: required for the E1M2 results, ``dst_dtype=swiglu_ops.float4_e1m2fn_x2``). The result is
    ``[*batch, M, N]`` (FP4 unpacked) in ``dtype`` (float32, float64, bfloat16 or float16; another dtype is
    a ``TypeError``). Scale code 0xFF (NaN block) dequantises to NaN; ``scale``
    is ``float8_e8m0fnu`` or uint8 raw codes. Works on every device and inside ``torch.compile`` (one custom
    op, ``torch.ops.swiglu_ops.mx_dequantize``).
    """
    V.check_dequantize_args(data, scale, axis, group_index, dtype)  # before the custom op's schema sees them
    tensors = {"data": data, "scale": scale, "group_index": group_index}
    if torch.compiler.is_compiling() or V.needs_dispatch(tensors):
        if not torch.compiler.is_compiling() and any(map(V.is_dtensor, tensors.values())):
            # DTensor would wrap the fake kernel's error in a RuntimeError (as in _via_custom_op)
            V.dequantize_spec(data, scale, axis, group_index, dst_dtype, dtype)
        return torch.ops.swiglu_ops.mx_dequantize(
            data, scale, axis=axis, group_index=group_index, dtype=dtype,
            dst_dtype=None if dst_dtype is None else dst_name(dst_dtype),
        )  # fmt: skip
    return dequantize_eager(data, scale, axis, group_index, dtype, dst_dtype)


def dequantize_eager(data, scale, axis, group_index, dtype, dst_dtype) -> torch.Tensor:
    """:func:`mx_dequantize` on plain tensors (also the custom op's real kernel)."""
    data, scale, group_index = map(V.kernel_ready, (data, scale, group_index))
    fmt, _ = V.dequantize_spec(data, scale, axis, group_index, dst_dtype, dtype)
    return dequantize(data, scale, fmt, axis=axis, group_index=group_index, dtype=dtype)
