"""DTensor sharding rules of the custom ops (spec README 7.2), generated from the operator table.

Every row of :mod:`.table` is declared here once (:data:`LAYOUTS`): the *role* of each tensor parameter and
each output (``data``: x's shape or x's with the hidden dim halved, token dims first; ``weight``: one value
per row, sharded like the rows; ``scale``: an MX scale, ``[*batch, M, P, 2]`` or ``[*batch, R, C, 2]``;
``y2``: the possibly transposed y2; ``group``: group_index, always replicated) and the rule that says, for
given arguments and mesh size, which dims of x are *token* dims and which one is the *hidden* dim that may
be sharded exactly (:data:`DEQUANTIZE`: the same for ``torch.ops.swiglu_ops.mx_dequantize``). From that,
:func:`strategies` writes DTensor's strategy list (``register_sharding``'s convention: one
``(output placements, input placements)`` pair per strategy, one entry per output and per argument, None for
a non-tensor or absent argument); DTensor picks the cheapest strategy for the inputs' placements and
redistributes the inputs to it. So the result is always the single-process result on the whole tensor:

- ``Replicate`` everywhere: always offered (listed first).
- ``Shard(k)`` of a token dim, without ``group_index`` (a group count or end refers to global rows). Rows
  are independent, except in the MX operators, whose token-axis blocks are 32 rows and whose mxscale2 rows
  pair two blocks: there the M dim is offered only when every shard holds whole 64-row pairs
  (``M % (64 * mesh size) == 0``; leading batch dims always). A weight is sharded like the rows, and only
  when its shape is x's leading dims (another shape of the same numel would not split like the rows).
- ``Shard`` of the hidden dim, only for the interleaved gate/up layout (a chunked layout pairs column j with
  column j + N, which live on different shards): the clipped operators with ``interleaved=True``
  (``x.shape[dim] % (2 * mesh size) == 0``) and the MX operators with ``interleaved=True`` when every
  shard's MX output width is a multiple of 64 (whole 32-element blocks and whole mxscale1 / mxscale2 pairs),
  and without ``weight`` (grad_weight sums over the hidden axis in pairwise order: a Partial sum of the
  shards' sums would not be bitwise that).

Every other placement (a hidden shard of a chunked layout, a token shard with groups, misaligned M or N,
``Partial`` (reduced first, in the input's dtype), ``_StridedShard``) is redistributed by DTensor to one of
these strategies before the kernel runs. On meshes of several dims the conditions use the whole mesh's size
(conservative: a tensor dim sharded on every mesh dim still splits on whole blocks).

The rules are registered with ``torch.distributed.tensor.experimental.register_sharding``, once
``torch.distributed.tensor`` is imported (a DTensor cannot exist before; importing it costs more than the
rest of the package, so :func:`register_when_loaded` waits for it). ``register_sharding`` caches a decision
keyed on the tensor specs and only the *int* attributes; a bool such as ``interleaved`` changes the rule, so
the ops' schema info is replaced to key on every attribute.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..numerics import mx
from .table import OPERATORS, OpDef

__all__ = ["LAYOUTS", "Dims", "strategies", "register", "register_when_loaded"]

_DTENSOR_MODULE = "torch.distributed.tensor"


@dataclass(frozen=True)
class Dims:
    """What may be sharded exactly for one call: x's token dims, its hidden dim (None: not shardable) and,
    for the MX operators, which token dim is M (the one a transposed y2 moves last)."""

    token: tuple[int, ...]
    hidden: int | None
    m_dim: int | None = None
    transpose_y2: bool = False


@dataclass(frozen=True)
class Layout:
    """One row's declaration: ``roles`` names the role of each tensor parameter and output (by name);
    ``dims(values, mesh_size) -> Dims`` is the rule of the row's layout."""

    roles: dict[str, str]
    dims: Callable[[dict, int], Dims]


def _shape(t) -> tuple[int, ...] | None:
    return None if t is None else tuple(t.shape)


def _group_grad_dims(values: dict, n: int) -> Dims:
    """swiglu_group_grad: rows are independent; x is [gate | up] halves, so no hidden sharding."""
    x, weight = _shape(values["x"]), _shape(values["weight"])
    rows_ok = values["group_index"] is None and (weight is None or weight == x[:-1])
    return Dims(tuple(range(len(x) - 1)) if rows_ok else (), None)


def _clipped_dims(values: dict, n: int) -> Dims:
    """The clipped operators: x as [pre, cut] rows with d = dim; token dims are those before d; the hidden
    dim d splits on whole pairs of the interleaved layout when ``x.shape[d] % (2n) == 0`` (each shard's
    flattened rows then hold whole consecutive pairs, and y's d splits on the same pairs)."""
    x = _shape(values["x"])
    d = values["dim"] % max(len(x), 1)
    token = tuple(range(d)) if values["group_index"] is None else ()
    hidden = d if values["interleaved"] and x[d] % (2 * n) == 0 else None
    return Dims(token, hidden)


def _mx_dims(width_of: Callable[[int], int]) -> Callable[[dict, int], Dims]:
    """The MX operators: x [*batch, M, C]; ``width_of(C)`` is the MX output width per row (C for the
    backward's y1, N = C/2 for the forward's act)."""

    def dims(values: dict, n: int) -> Dims:
        x, weight = _shape(values["x"]), _shape(values["weight"])
        *lead, m, c = x
        token: tuple[int, ...] = ()
        if values["group_index"] is None and (weight is None or weight == x[:-1]):
            token = tuple(range(len(lead))) + ((len(lead),) if m % (64 * n) == 0 else ())
        hidden_ok = values["interleaved"] and weight is None and width_of(c) % (64 * n) == 0
        return Dims(token, len(x) - 1 if hidden_ok else None, len(lead), bool(values["transpose_y2"]))

    return dims


_MX_OUT_ROLES = dict(y1="data", mxscale1="scale", y2="y2", mxscale2="scale", grad_weight="weight")

#: Every operator's declaration, by name (a test checks that every row of the table has one).
LAYOUTS: dict[str, Layout] = {
    "swiglu_group_grad": Layout(
        dict(grad_y="data", x="data", weight="weight", y_origin="data", group_index="group")
        | dict(grad_x="data", grad_weight="weight"),
        _group_grad_dims,
    ),
    "swiglu_backward_mx_quant_dual_axis": Layout(
        dict(x="data", y_grad="data", group_index="group", weight="weight") | _MX_OUT_ROLES,
        _mx_dims(lambda c: c),
    ),
    "swiglu_mx_quant_dual_axis": Layout(
        dict(x="data", group_index="group", weight="weight") | _MX_OUT_ROLES, _mx_dims(lambda c: c // 2)
    ),
    "clipped_swiglu": Layout(dict(x="data", group_index="group", y="data"), _clipped_dims),
    "clipped_swiglu_grad": Layout(
        dict(grad_y="data", x="data", group_index="group", grad_x="data"), _clipped_dims
    ),
    "_clipped_swiglu_grad_mode1": Layout(
        dict(grad_y="data", x="data", group_index="group", grad_x="data"), _clipped_dims
    ),
}


def _packed(values: dict) -> bool:
    """Whether mx_dequantize's data holds packed FP4 (two elements a byte): its dtype, or for uint8 codes
    the format that ``dst_dtype`` names."""
    dst = values.get("dst_dtype")
    if dst is None:
        data = values["data"]  # a DTensorSpec (its tensor_meta) or a tensor
        fmt = mx.format_of_dtype(data.tensor_meta.dtype if hasattr(data, "tensor_meta") else data.dtype)
    else:
        fmt = mx.element_format(mx.dst_from_name(dst) if isinstance(dst, str) else dst)
    return fmt is not None and fmt.packed


def _dequantize_dims(values: dict, n: int) -> Dims:
    """mx_dequantize: data [*batch, M, W] (W bytes: N codes, or N/2 packed FP4 bytes) and its scale. Axis -1
    (mxscale1 [*batch, M, P, 2]): rows are independent, but given group ends (global row numbers, checked
    against M) M is not split; the columns split on whole 64-element scale pairs (``W % (64n) == 0``; packed
    FP4, two elements a byte: ``W % (32n) == 0``). Axis -2 (mxscale2 [*batch, R, N, 2]): columns are
    independent (whole bytes: ``W % n == 0``); M splits on whole 64-row pairs without groups, batch dims
    always."""
    data = _shape(values["data"])
    *lead, m, w = data
    token = tuple(range(len(lead)))
    if values["axis"] == -1:
        token += (len(lead),) if values["group_index"] is None else ()
        pair = 32 if _packed(values) else 64  # bytes of data per 64-element scale pair
        return Dims(token, len(data) - 1 if w % (pair * n) == 0 else None)
    if values["group_index"] is None and m % (64 * n) == 0:
        token += (len(lead),)
    return Dims(token, len(data) - 1 if w % n == 0 else None)


#: mx_dequantize (not a row of the table: its custom op is defined beside them in :mod:`.custom_ops`).
DEQUANTIZE = Layout(dict(data="data", scale="scale", group_index="group", out="data"), _dequantize_dims)


def _placement(role: str, mode: tuple[str, int] | None, dims: Dims):
    """The placement of a tensor of ``role`` in the strategy ``mode`` (None: replicate, ``("token", k)``,
    ``("hidden", d)``)."""
    from torch.distributed.tensor import Replicate, Shard

    if mode is None or role == "group":
        return Replicate()
    kind, k = mode
    if kind == "token":
        if role == "y2" and dims.transpose_y2 and k == dims.m_dim:
            return Shard(k + 1)  # [*batch, C, M]: M is last
        return Shard(k)  # data, weight, scale ([*batch, M, P, 2] / [*batch, R, C, 2]), y2
    if role == "weight":
        raise AssertionError("hidden sharding is never offered with a weight")
    if role == "y2" and dims.transpose_y2:
        return Shard(k - 1)
    return Shard(k)  # data; scale1's pair dim and scale2's column dim are at x's last index too


def _bind(overload, args: tuple, kwargs: dict) -> dict:
    """The strategy function's arguments by schema name, defaults filled in (the dispatcher leaves out
    trailing arguments equal to their defaults)."""
    values = {}
    for i, a in enumerate(overload._schema.arguments):
        if i < len(args):
            values[a.name] = args[i]
        elif a.name in kwargs:
            values[a.name] = kwargs[a.name]
        else:
            values[a.name] = a.default_value
    return values


def strategies(op: OpDef | None, overload, args: tuple, kwargs: dict) -> list:
    """``register_sharding``'s strategy list for one call of ``op`` (module docstring; None:
    mx_dequantize)."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    layout = DEQUANTIZE if op is None else LAYOUTS[op.name]
    values = _bind(overload, args, kwargs)
    specs = [v for v in (*args, *kwargs.values()) if isinstance(v, DTensorSpec)]
    n = specs[0].mesh.size()
    try:
        dims = layout.dims(values, n)
    except (IndexError, ZeroDivisionError, TypeError, KeyError):
        dims = Dims((), None)  # arguments the op rejects: replicate, and let its checks say why
    modes = [None] + [("token", k) for k in dims.token]
    if dims.hidden is not None:
        modes.append(("hidden", dims.hidden))
    # an absent output (the custom op's empty (0,) tensor) is replicated, like group_index
    roles = (
        [layout.roles["out"]]
        if op is None
        else [layout.roles[o.name] if o.present(values) else "group" for o in op.outputs]
    )
    result = []
    for mode in modes:
        outs = [_placement(role, mode, dims) for role in roles]
        ins = [
            _placement(layout.roles[name], mode, dims) if isinstance(v, DTensorSpec) else None
            for name, v in (*zip(_names(overload, len(args)), args, strict=True), *kwargs.items())
        ]
        result.append((outs, ins))
    return result


def _names(overload, count: int) -> list[str]:
    return [a.name for a in overload._schema.arguments[:count]]


def _schema_info(overload):
    """Key the sharding cache on every attribute (``register_sharding`` keys on the int ones only)."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    arguments = overload._schema.arguments
    first = next((i for i, a in enumerate(arguments) if not a.type.isSubtypeOf(_OPTIONAL_TENSOR)), 100)
    kw = [a.name for a in arguments if a.kwarg_only]
    return RuntimeSchemaInfo(first, kw or None, needs_pytree=True)


_OPTIONAL_TENSOR = torch._C.OptionalType(torch._C.TensorType.get())
_registered = False


def register() -> None:
    """Register every operator's rules, and mx_dequantize's, with DTensor (imports
    ``torch.distributed.tensor``); idempotent."""
    global _registered
    if _registered:
        return
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import register_sharding

    propagator = DTensor._op_dispatcher.sharding_propagator
    for op in (*OPERATORS.values(), None):
        overload = getattr(torch.ops.swiglu_ops, "mx_dequantize" if op is None else op.name).default

        def rule(*args, _op=op, _overload=overload, **kwargs):
            return strategies(_op, _overload, args, kwargs)

        register_sharding(overload)(rule)
        propagator.op_to_schema_info[overload] = _schema_info(overload)
    _registered = True


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Runs :func:`register` right after ``torch.distributed.tensor`` has been imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _DTENSOR_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                register()
            except Exception as e:  # noqa: BLE001 - never break the user's import of DTensor
                warnings.warn(f"swiglu_ops: DTensor sharding rules not registered: {e!r}", stacklevel=2)

        spec.loader.exec_module = exec_then_register
        return spec


def register_when_loaded() -> None:
    """Register now if ``torch.distributed.tensor`` is imported, else as soon as it is (called by
    :mod:`.custom_ops` once the ops exist). Nothing where torch has no distributed support."""
    if not torch.distributed.is_available():
        return
    if _DTENSOR_MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
