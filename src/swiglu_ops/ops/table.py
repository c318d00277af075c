"""The operator table: one declaration per operator, everything else is read from it.

A row (:class:`OpDef`) says what an operator is: its public name and CANN's, its parameters in signature
order (inputs and attributes, with the custom-op schema type and default of each), its outputs, its group
convention, the kernel contract its backends implement, and its rules (:attr:`OpDef.plan`: the checks of
:mod:`.validate` it applies, the output shapes and dtypes, and how the validated arguments become the kernel
contract's call). From the rows come:

- the public functions' signatures and docstrings (:mod:`.api`: validate -> registry -> kernel -> outputs);
- the ``torch.ops.swiglu_ops.*`` custom ops: schema, real kernel and fake kernel (:mod:`.custom_ops`);
- ``swiglu-ops verify`` and the benchmark's list of operators.

Adding a parameter to an operator is its :class:`Param` in the row, the row's plan (its check and what the
kernel receives) and the kernels that use it. Adding an operator is a row and its kernels in each backend
(``docs/design.md``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..numerics import mx
from . import validate as V
from .validate import COUNTS, ENDS

__all__ = ["Param", "Output", "Plan", "OpDef", "OPERATORS", "PUBLIC", "REQUIRED", "EXAMPLE_CASES"]

#: A parameter without a default.
REQUIRED = object()

#: The Python values a scalar schema type takes (what ``Param.check`` holds a value to), and how its message
#: names them. The schema itself would coerce (``None`` or ``0.5`` to a bool) or fail inside torch.
_SCALAR_TYPES = {
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "int": (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "an int"),
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a real number"),
    "str": (lambda v: isinstance(v, str), "a str"),
    "ScalarType": (lambda v: isinstance(v, torch.dtype), "a torch.dtype"),
}


@dataclass(frozen=True)
class Param:
    """One parameter: ``schema`` is its type in the custom op's schema (``Tensor``, ``Tensor?``, ``float``,
    ``float?``, ``int``, ``int?``, ``bool``, ``str``, ``ScalarType``); ``to_schema`` converts a Python value
    into what the schema carries (e.g. the MX forward's destination format travels by name, since the E1M2
    sentinel is no ``ScalarType``) and ``from_schema`` back."""

    name: str
    schema: str
    default: Any = REQUIRED
    kw_only: bool = False
    to_schema: Callable | None = None
    from_schema: Callable | None = None
    #: the parameter's own check of a value, where its rule is more than its schema type (``check``)
    rule: Callable | None = None

    @property
    def is_tensor(self) -> bool:
        return self.schema.startswith("Tensor")

    def check(self, value) -> None:
        """A scalar argument's type, as its schema type takes it (``TypeError`` naming it): every call checks
        it before anything else, so that the custom op's path (torch.compile, fake, meta and DTensor inputs)
        refuses what the eager path refuses instead of the schema coercing it. Its value rules are the
        plan's. A parameter with ``to_schema`` is checked by that conversion; a tensor's dtype, shape and
        device by the plan. A number the schema cannot carry (an int past int64 or past the float range) is a
        ``ValueError``."""
        if self.rule is not None:
            self.rule(value)
            return
        if self.to_schema is not None or (value is None and self.schema.endswith("?")):
            return
        if self.is_tensor:
            V.check_tensor(self.name, value, optional=self.schema.endswith("?"))
            return
        kind = self.schema.removesuffix("?")
        accepts, what = _SCALAR_TYPES[kind]
        if not accepts(value):
            raise TypeError(f"{self.name} must be {what}, got {type(value).__name__}")
        if kind == "int" and not -(2**63) <= value < 2**63:
            raise ValueError(f"{self.name} must fit in int64, got {value!r}")
        if kind == "float":
            V.as_float(self.name, value)

    def schema_default(self) -> str:
        value = self.default if self.to_schema is None else self.to_schema(self.default)
        if value is None:
            return "None"
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, str):
            return repr(value)
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        if isinstance(value, float) and math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)


@dataclass(frozen=True)
class Output:
    """One output. An output with ``when`` (a parameter's name) exists only when that argument is given:
    without it the public function returns ``None`` in its place (or, if ``dropped``, leaves it out of the
    result tuple) and the custom op, whose schema cannot return None, an empty ``(0,)`` tensor."""

    name: str
    when: str | None = None
    dropped: bool = False

    def present(self, values: dict) -> bool:
        return self.when is None or values.get(self.when) is not None


@dataclass
class Plan:
    """A validated call: what to allocate and how to call the kernel contract.

    ``outputs``: ``(shape, dtype)`` per :attr:`OpDef.outputs` entry, None for an absent optional output.
    ``inputs``: the tensors the kernel reads (an ``out=`` must not overlap them). ``launch(kernel, outs)``
    calls the backend's kernel with the normalised views; None when there is nothing to compute (zero rows),
    where ``fill(outs)`` writes what an empty call still returns (e.g. mxscale2's zero rows)."""

    device: torch.device
    dtype: torch.dtype
    outputs: tuple
    inputs: dict
    launch: Callable | None
    fill: Callable | None = None


@dataclass(frozen=True)
class OpDef:
    """One operator (see the module docstring)."""

    name: str
    cann: str
    kernel: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    groups: str | None
    plan: Callable[..., Plan]
    doc: str
    #: ``example(generator, dtype, device, case=0) -> arguments``: small calls with groups and awkward
    #: sizes (``EXAMPLE_CASES`` of them), for ``swiglu-ops verify`` and the tests' operator matrix
    example: Callable[..., dict] | None = None
    #: ``out=`` inside torch.compile: copied from the custom op's results (False: refused, for dtypes Inductor
    #: cannot copy: float8_e8m0fnu, float4_e2m1fn_x2)
    compile_out: bool = True
    public: bool = True
    tensor_params: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "tensor_params", tuple(p.name for p in self.params if p.is_tensor))

    @property
    def qualified(self) -> str:
        return f"swiglu_ops::{self.name}"

    def returned(self, values: dict) -> list[Output]:
        """The outputs the public function returns for these arguments (an absent dropped one is left out)."""
        return [o for o in self.outputs if o.present(values) or not o.dropped]

    def out_names(self) -> list[str]:
        if len(self.outputs) == 1:
            return ["out"]
        return [f"out[{i}] ({o.name})" for i, o in enumerate(self.outputs)]


# --------------------------------------------------------------------------------------------- helpers


def _tensor(name: str) -> Param:
    return Param(name, "Tensor")


def _optional(name: str) -> Param:
    return Param(name, "Tensor?", None)


def _flat(t: torch.Tensor | None, *shape):
    """``t`` as the contiguous ``shape`` the kernel contracts take (None stays None)."""
    return None if t is None else t.reshape(*shape).contiguous()


def _mx_outs(outs, batch):
    """The four MX outputs (shapes of :func:`.validate.mx_output_specs`) as the uint8 ``[B, ...]`` views of
    the kernel contract, read from their own shapes; mxscale1's slot pairs flattened to ``[B, M, slots]``."""
    y1, s1, y2, s2 = (t.view(torch.uint8) for t in outs)
    return [
        y1.view(batch, *y1.shape[-2:]),
        s1.view(batch, s1.shape[-3], -1),
        y2.view(batch, *y2.shape[-2:]),
        s2.view(batch, *s2.shape[-3:]),
    ]


def _grad_weight_spec(weight):
    """The grad_weight output (swiglu_group_grad's second, the backward MX operator's fifth): weight's shape,
    fp32 (absent without a weight)."""
    return None if weight is None else (tuple(weight.shape), torch.float32)


def _weight_args(weight, grad_weight, rows: int) -> dict:
    """The kernel contract's routing-weight keywords: ``weight`` [rows] fp32 (and the backward's
    ``grad_weight`` [rows]); none without a weight, so that the unweighted call is today's."""
    if weight is None:
        return {}
    args = dict(weight=_flat(weight, rows))
    if grad_weight is not None:
        args["grad_weight"] = grad_weight.view(rows)
    return args


def _zero_mxscale2(outs) -> None:
    outs[3].view(torch.uint8).zero_()  # M == 0: mxscale2 keeps its rows, zero-filled (contract section 2)


# ------------------------------------------------------------------------------------- example calls


#: How many example calls each row offers (``example(..., case=k)`` for ``k < EXAMPLE_CASES``): the usual
#: shape with groups, a one-element one, and a rank-3 one with the other options (GPT-OSS, FP4, ...).
EXAMPLE_CASES = 3
_GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)


def _randn(gen, shape, dtype, device, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


def _example_group_grad(gen, dtype, device, case=0):
    if case == 1:  # one row, H = 1, nothing optional
        return dict(grad_y=_randn(gen, (1, 1), dtype, device), x=_randn(gen, (1, 2), dtype, device, 3.0))
    lead, hidden = ((70,), 96) if case == 0 else ((2, 5), 33)
    return dict(
        grad_y=_randn(gen, (*lead, hidden), dtype, device),
        x=_randn(gen, (*lead, 2 * hidden), dtype, device, 3.0),
        weight=torch.rand(lead, generator=gen).to(device),
        y_origin=_randn(gen, (*lead, hidden), dtype, device),
        group_index=torch.tensor([40, 0, 25] if case == 0 else [7], device=device),  # counts
        clamp_limit=7.0 if case == 0 else float("inf"),
    )


def _example_bwd_mx(gen, dtype, device, case=0):
    shape, ends, extra = {
        0: ((100, 128), [17, 17, 70, 100], {}),  # an empty group, groups not on 32-row blocks
        1: ((1, 64), None, dict(dst_dtype=torch.float8_e5m2, scale_alg=0, activate_left=False)),
        2: ((2, 33, 192), None, _GPT_OSS),
    }[case]
    return dict(
        x=_randn(gen, shape, dtype, device, 3.0),
        y_grad=_randn(gen, (*shape[:-1], shape[-1] // 2), dtype, device),
        group_index=None if ends is None else torch.tensor(ends, device=device),
        **extra,
        **(_weights(gen, shape[:-1], device) if case == 2 else {}),
    )


def _weights(gen, lead, device):
    """A routing weight per row (spec 7.1) with negatives and zeros."""
    w = torch.randn(lead, generator=gen)
    w.view(-1)[::7] = 0.0
    return dict(weight=w.to(device))


def _example_fwd_mx(gen, dtype, device, case=0):
    shape, ends, extra = {
        0: ((100, 160), [33, 33, 100], {}),  # N = 80: a partial 32-column block and a pad slot
        1: ((1, 2), None, dict(dst_dtype=torch.float8_e5m2)),  # N = 1
        2: ((2, 37, 140), None, dict(_GPT_OSS, dst_dtype=torch.float4_e2m1fn_x2, round_mode="floor")),
    }[case]
    ends = None if ends is None else torch.tensor(ends, device=device)
    weight = _weights(gen, shape[:-1], device) if case == 2 else {}
    return dict(x=_randn(gen, shape, dtype, device, 3.0), group_index=ends, **extra, **weight)


def _example_clipped(gen, dtype, device, case=0, *, grad=False):
    shape, counts, extra = {
        0: ((3, 21, 80), [50, 3], {}),  # counts: 53 of the 63 rows valid
        1: ((2,), None, {}),  # rank 1: one row of one pair
        2: ((5, 4, 6), [3], dict(dim=1, interleaved=False)),  # [pre, cut] = [5, 24], chunked
    }[case]
    if case == 2 and not grad:
        extra = dict(extra, clamp_mode=1)
    args = dict(x=_randn(gen, shape, dtype, device, 5.0), **extra)
    args["group_index"] = None if counts is None else torch.tensor(counts, device=device)
    if grad:
        d = extra.get("dim", -1) % len(shape)
        half = (*shape[:d], shape[d] // 2, *shape[d + 1 :])
        args = dict(grad_y=_randn(gen, half, dtype, device), **args)
    return args


def _example_clipped_grad(gen, dtype, device, case=0):
    return _example_clipped(gen, dtype, device, case, grad=True)


# --------------------------------------------------------------------------------- swiglu_group_grad


def _plan_group_grad(grad_y, x, weight, y_origin, group_index, clamp_limit) -> Plan:
    clamp = V.validate_group_grad(grad_y, x, weight, y_origin, group_index, clamp_limit)
    hidden = grad_y.shape[-1]
    rows = math.prod(grad_y.shape[:-1])

    def launch(kernel, outs):
        grad_x, grad_weight = outs
        kernel(
            _flat(grad_y, rows, hidden),
            _flat(x, rows, 2 * hidden),
            _flat(weight, rows),
            _flat(y_origin, rows, hidden),
            None if group_index is None else V.valid_rows(group_index, rows),
            clamp,
            grad_x.view(rows, 2 * hidden),
            None if grad_weight is None else grad_weight.view(rows),
        )

    outputs = ((tuple(x.shape), grad_y.dtype), _grad_weight_spec(weight))
    inputs = dict(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin, group_index=group_index)
    return Plan(x.device, x.dtype, outputs, inputs, launch if rows else None)


_DOC_GROUP_GRAD = """Backward of ``y = silu(min(g, c)) * clip(u, -c, c) * weight`` with a group row mask.

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

SWIGLU_GROUP_GRAD = OpDef(
    name="swiglu_group_grad",
    cann="SwigluGroupGrad",
    kernel="swiglu_group_grad",
    params=(
        *map(_tensor, ("grad_y", "x")),
        *map(_optional, ("weight", "y_origin", "group_index")),
        Param("clamp_limit", "float", 0.0),
    ),
    outputs=(Output("grad_x"), Output("grad_weight", when="weight")),
    groups=COUNTS,
    plan=_plan_group_grad,
    doc=_DOC_GROUP_GRAD,
    example=_example_group_grad,
)


# --------------------------------------------------------------- the dual-axis MX operators (FP8 / FP4)

#: What both MX rows share: their outputs, group convention and compile rule (Inductor has no kernels for
#: float8_e8m0fnu / float4 copies, so out= is refused inside torch.compile).
_MX_OUTPUTS = (Output("y1"), Output("mxscale1"), Output("y2"), Output("mxscale2"))
_MX_ROW = dict(groups=ENDS, compile_out=False)


def _mx_head(scale_alg_default):
    """The MX operators' parameters after their tensors: group_index, activate_left, round_mode and
    scale_alg, whose default the two operators set differently (CANN's)."""
    return (
        _optional("group_index"),
        Param("activate_left", "bool", True, kw_only=True),
        Param("round_mode", "str", "rint", kw_only=True, rule=mx.check_round_mode),
        Param("scale_alg", "int?", scale_alg_default, kw_only=True),
    )


#: Their last parameters: CANN's reserved max_dtype_value, then the GLU parameters both take beyond CANN
#: (stage 1 = the GPT-OSS clipped SwiGLU) and the token-contiguous y2.
_MX_TAIL = (
    Param("max_dtype_value", "float", 0.0, kw_only=True),
    Param("limit", "float?", None, kw_only=True),
    Param("alpha", "float?", None, kw_only=True),
    Param("bias", "float?", None, kw_only=True),
    Param("interleaved", "bool", False, kw_only=True),
    Param("transpose_y2", "bool", False, kw_only=True),
    # the router's probability of every row, multiplied into stage 1 (spec 7.1; a library extension)
    Param("weight", "Tensor?", None, kw_only=True),
)


def _plan_bwd_mx(
    x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value, limit, alpha,
    bias, interleaved, transpose_y2, weight,
) -> Plan:  # fmt: skip
    fmt, scale_alg, glu = V.validate_mx_backward(
        x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value, limit,
        alpha, bias, interleaved,
    )  # fmt: skip
    V.check_transpose_y2(transpose_y2, fmt)
    *lead, m, c = x.shape
    batch = math.prod(lead)
    V.check_weight(weight, x, batch * m)
    outputs = (*V.mx_output_specs(x.shape, group_index, fmt, transpose_y2), _grad_weight_spec(weight))

    def launch(kernel, outs):
        kernel(
            _flat(x, batch, m, c),
            _flat(y_grad, batch, m, c // 2),
            None if group_index is None else group_index.to(torch.int64).contiguous(),
            glu,
            scale_alg,
            fmt,
            *_mx_outs(outs[:4], batch),
            transpose_y2=transpose_y2,
            **_weight_args(weight, outs[4], batch * m),
        )

    inputs = dict(x=x, y_grad=y_grad, group_index=group_index, weight=weight)
    return Plan(x.device, x.dtype, outputs, inputs, launch if batch * m else None, _zero_mxscale2)


_DOC_BWD_MX = """SwiGLU backward, rounded to x's dtype, then MX-quantised along both axes in one pass.

    Args:
        x: ``[..., M, 2N]`` (rank 2..6) bf16/fp16/fp32, ``2N % 64 == 0``; A = left half if ``activate_left``.
        y_grad: ``[..., M, N]``, same dtype.
        group_index: 1-D int64/int32 cumulative row **ends** (2-D x only); token-axis blocks restart at
            every group start.
        scale_alg: 1 = RCEIL ("cuBLAS", default; None means 1), 0 = OCP floor.
        dst_dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
        round_mode / max_dtype_value: must be "rint" / 0.0 (Ascend's only accepted values).
        limit, alpha, bias: the GPT-OSS clipped SwiGLU (e.g. 7.0, 1.702, 1.0), all three or none (default:
            CANN's plain SwiGLU). With them stage 1 is exactly :func:`clipped_swiglu_grad` (clamp_mode 0,
            closed masks), rounded to x's dtype, then quantised as before.
        interleaved: A/B are the even/odd columns (GPT-OSS's layout) instead of the two halves
            (``activate_left=False`` swaps them); the gradient columns always follow x's columns.
        transpose_y2: write y2 token-contiguous, ``[..., 2N, M]`` (the K-major operand of a wgrad GEMM,
            ``y2[:, group]``), instead of CANN's ``[..., M, 2N]``; mxscale2 is unchanged. FP8 only.
        backend: "auto", "reference", "cpu" or "triton".
        out: optional preallocated ``(y1, mxscale1, y2, mxscale2)`` (exact shapes/dtypes, contiguous, on x's
            device, not overlapping an input or each other), written completely and returned. Eager only:
            inside torch.compile it is a ValueError (Inductor has no float8_e8m0fnu copy kernels).

    Returns:
        ``(y1, mxscale1, y2, mxscale2)``: y1/y2 like x in dst_dtype (y2 ``[..., 2N, M]`` with
        ``transpose_y2``); mxscale1 ``[..., M, 2N/64, 2]`` and mxscale2 ``[..., R, 2N, 2]``
        (``R = M//64 + G`` with groups, else ``ceil(M/64)``) as ``torch.float8_e8m0fnu``
        (``.view(torch.uint8)`` gives the raw E8M0 codes). Inputs may require grad; the results do not
        (the operator is not differentiable itself; :func:`swiglu_ops.swiglu_mx_backward` is).
    """

SWIGLU_BACKWARD_MX_QUANT_DUAL_AXIS = OpDef(
    name="swiglu_backward_mx_quant_dual_axis",
    cann="SwigluBackwardMxQuantWithDualAxis",
    kernel="swiglu_bwd_mx_quant",
    params=(
        *map(_tensor, ("x", "y_grad")),
        *_mx_head(1),
        Param("dst_dtype", "ScalarType", torch.float8_e4m3fn, kw_only=True),
        *_MX_TAIL,
    ),
    outputs=(*_MX_OUTPUTS, Output("grad_weight", when="weight", dropped=True)),
    plan=_plan_bwd_mx,
    doc=_DOC_BWD_MX,
    example=_example_bwd_mx,
    **_MX_ROW,
)


def _plan_fwd_mx(
    x, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value, limit, alpha, bias,
    interleaved, transpose_y2, weight,
) -> Plan:  # fmt: skip
    fmt, scale_alg, mode, glu = V.validate_mx_forward(
        x, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value, limit, alpha, bias,
        interleaved,
    )  # fmt: skip
    V.check_transpose_y2(transpose_y2, fmt)
    *lead, m, c = x.shape
    batch = math.prod(lead)
    V.check_weight(weight, x, batch * m)
    outputs = tuple(V.mx_forward_output_specs(x, group_index, fmt, transpose_y2))

    def launch(kernel, outs):
        kernel(
            _flat(x, batch, m, c),
            None if group_index is None else group_index.to(torch.int64).contiguous(),
            glu,
            scale_alg,
            fmt,
            mode,
            *_mx_outs(outs, batch),
            transpose_y2=transpose_y2,
            **_weight_args(weight, None, batch * m),
        )

    inputs = dict(x=x, group_index=group_index, weight=weight)
    return Plan(x.device, x.dtype, outputs, inputs, launch if batch * m else None, _zero_mxscale2)


_DOC_FWD_MX = """SwiGLU forward, rounded to x's dtype, then MX-quantised along both axes in one pass (CANN
    ``SwigluMxQuantWithDualAxis``, ``docs/operators.md`` section 4).

    Args:
        x: ``[..., M, 2N]`` bf16/fp16/fp32, rank >= 2 (leading dims: independent slices, no groups then),
            ``2N`` even (FP4: a multiple of 4). ``act = silu(A) * B`` in CANN's order
            ``(A / (exp(A * -1) + 1)) * B``, A the left half if ``activate_left`` (else the right half).
        group_index: 1-D int64/int32 cumulative row **ends** (2-D x only): token-axis blocks restart at every
            group start. On a CPU tensor the values must be non-decreasing, >= 0 and end at M; on a device
            tensor each end is clamped into [previous end, M] and rows past the last end come out as zeros.
        round_mode: "rint" (FP8: the only mode); FP4 also "round" (ties away from zero) and "floor".
        scale_alg: None (default) = 1 (RCEIL) for FP8 and 0 (OCP) for FP4; 0 or 1 for FP8, 0 for FP4.
        dst_dtype: ``torch.float8_e4m3fn`` (default), ``torch.float8_e5m2``, ``torch.float4_e2m1fn_x2`` or
            ``swiglu_ops.float4_e1m2fn_x2`` (E1M2; results as uint8).
        max_dtype_value: reserved, must be 0.0.
        limit, alpha, bias: the GPT-OSS clipped SwiGLU (e.g. 7.0, 1.702, 1.0), all three or none (default:
            CANN's plain SwiGLU). With them stage 1 is exactly :func:`clipped_swiglu` (clamp_mode 0).
        interleaved: A/B are the even/odd elements of each row (GPT-OSS's layout) instead of its two halves
            (``activate_left=False`` swaps them).
        transpose_y2: write y2 token-contiguous, ``[..., N, M]`` (the K-major operand of a wgrad GEMM),
            instead of CANN's ``[..., M, N]``; mxscale2 is unchanged. FP8 only (a ValueError for FP4).
        backend: "auto", "reference", "cpu" or "triton".
        out: optional preallocated ``(y1, mxscale1, y2, mxscale2)`` (exact shapes/dtypes, contiguous, on x's
            device, not overlapping x or each other), written completely (pad slots and unused mxscale2 rows
            as 0) and returned. Eager only: inside torch.compile it is a ValueError (Inductor has no
            float8_e8m0fnu / float4 copy kernels).

    Returns:
        ``(y1, mxscale1, y2, mxscale2)``: y1/y2 ``[..., M, N]`` in dst_dtype (FP8) or ``[..., M, N/2]`` packed
        bytes (``float4_e2m1fn_x2``, or uint8 for E1M2; element 2j in bits 3:0); mxscale1
        ``[..., M, ceil(N/64), 2]`` and mxscale2 ``[..., R, N, 2]`` (``R = M//64 + G`` with groups, else
        ``ceil(M/64)``) as ``torch.float8_e8m0fnu``. :func:`swiglu_ops.mx_dequantize` inverts them.
    """

SWIGLU_MX_QUANT_DUAL_AXIS = OpDef(
    name="swiglu_mx_quant_dual_axis",
    cann="SwigluMxQuantWithDualAxis",
    kernel="swiglu_mx_quant",
    params=(
        _tensor("x"),
        *_mx_head(None),
        # The destination format travels by name in the schema: the E1M2 sentinel is a string, not a
        # ScalarType ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "float4_e1m2fn_x2").
        Param(
            "dst_dtype",
            "str",
            torch.float8_e4m3fn,
            kw_only=True,
            to_schema=mx.dst_name,
            from_schema=mx.dst_from_name,
        ),  # fmt: skip
        *_MX_TAIL,
    ),
    outputs=_MX_OUTPUTS,
    plan=_plan_fwd_mx,
    doc=_DOC_FWD_MX,
    example=_example_fwd_mx,
    **_MX_ROW,
)


# ------------------------------------------------------------------------ clipped SwiGLU (GPT-OSS)

_CLIPPED_ATTRS = (
    Param("dim", "int", -1, kw_only=True),
    Param("alpha", "float", 1.702, kw_only=True),
    Param("limit", "float", 7.0, kw_only=True),
    Param("bias", "float", 1.0, kw_only=True),
    Param("interleaved", "bool", True, kw_only=True),
)


def _plan_clipped(x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode) -> Plan:
    d, glu = V.validate_clipped_swiglu(
        x, group_index, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved,
        clamp_mode=clamp_mode,
    )  # fmt: skip
    pre, cut = V.clipped_view(x.shape, d)

    def launch(kernel, outs):
        valid = None if group_index is None else V.valid_rows(group_index, pre)
        kernel(_flat(x, pre, cut), valid, glu, outs[0].view(pre, cut // 2))

    outputs = ((V.clipped_half_shape(x.shape, d), x.dtype),)
    return Plan(x.device, x.dtype, outputs, dict(x=x, group_index=group_index), launch if pre * cut else None)


_DOC_CLIPPED = """GPT-OSS's clipped SwiGLU (CANN ``ClippedSwiglu`` V2), fp32 math rounded once to x's dtype.

    x is viewed as ``[pre, cut]`` with ``pre = prod(x.shape[:dim])`` (merge-axes rule); each row splits into
    the activated half A and the linear half B: even / odd elements of the flattened row
    (``interleaved=True``, GPT-OSS's ``[..., ::2]`` / ``[..., 1::2]``, also when ``dim != -1``) or its first
    and second halves (``interleaved=False``). With ``L = limit``:

    - ``clamp_mode=0`` (GPT-OSS): ``A~ = min(A, L)``,
      ``y = (A~ / (exp(A~ * -alpha) + 1)) * (clip(B, -L, L) + bias)``
    - ``clamp_mode=1`` (clamp after the activation): ``y = min(A / (exp(-A) + 1), L) * clip(B, -L, L)``;
      alpha and bias are ignored.

    Args:
        x: bf16/fp16/fp32, rank 1..8, ``x.shape[dim]`` even. Non-contiguous and empty tensors are accepted.
        group_index: 1-D int64/int32 group **counts** (1..8192 entries): rows ``>= clamp(sum, 0, pre)`` of the
            ``[pre, cut]`` view are +0.0. Values are not checked (no host synchronisation).
        dim: the axis that is halved; also fixes ``pre``/``cut``.
        alpha, bias: any real numbers (used as fp32). limit: ``> 0`` in fp32 (``inf`` disables the clamp).
        clamp_mode: 0 or 1.
        backend: "auto", "reference", "cpu" or "triton".
        out: optional preallocated result (exactly y's shape, dtype and device, contiguous, not overlapping an
            input); it is fully written and returned.

    Returns:
        y: x's shape with ``shape[dim]`` halved, x's dtype. Differentiable when x requires grad (backward
        :func:`clipped_swiglu_grad`; for clamp_mode 1 the library's extension, see
        :class:`swiglu_ops.training.nn.ClippedSwigluFunction`); ``out=`` is then not allowed.
    """

CLIPPED_SWIGLU = OpDef(
    name="clipped_swiglu",
    cann="ClippedSwiglu",
    kernel="clipped_swiglu",
    params=(
        _tensor("x"),
        _optional("group_index"),
        *_CLIPPED_ATTRS,
        Param("clamp_mode", "int", 0, kw_only=True),
    ),
    outputs=(Output("y"),),
    groups=COUNTS,
    plan=_plan_clipped,
    doc=_DOC_CLIPPED,
    example=_example_clipped,
)


def _plan_clipped_grad(grad_y, x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode=0) -> Plan:
    d, glu = V.validate_clipped_swiglu(
        x, group_index, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved,
        clamp_mode=clamp_mode, grad_y=grad_y, backward=True,
    )  # fmt: skip
    pre, cut = V.clipped_view(x.shape, d)

    def launch(kernel, outs):
        valid = None if group_index is None else V.valid_rows(group_index, pre)
        kernel(_flat(grad_y, pre, cut // 2), _flat(x, pre, cut), valid, glu, outs[0].view(pre, cut))

    inputs = dict(grad_y=grad_y, x=x, group_index=group_index)
    return Plan(x.device, x.dtype, ((tuple(x.shape), x.dtype),), inputs, launch if pre * cut else None)


_DOC_CLIPPED_GRAD = """CANN ``ClippedSwigluGrad``: the gradient of :func:`clipped_swiglu` with
    ``clamp_mode=0`` (there is no clamp_mode; never use it for a clamp_mode-1 forward).

    fp32, kernel operation order, rounded once to x's dtype. With ``A~ = min(A, L)``,
    ``s = 1 / (exp(A~ * -alpha) + 1)`` and ``B' = clip(B, -L, L) + bias``::

        dB = (dy * A~) * s                                  -> +0.0 unless -L <= B <= L
        dA = ((((((1 - s) * A~) * alpha) + 1) * s) * B') * dy -> +0.0 unless A <= L

    The masks are **closed** intervals on the raw inputs applied by a select (a masked position is exactly
    +0.0, even where the formula gives NaN), as torch autograd of ``clamp`` does. Rows ``>= valid`` are +0.0.

    Args:
        grad_y: dL/dy, x's shape with ``shape[dim]`` halved, x's dtype.
        x, group_index, dim, alpha, limit, bias, interleaved, backend: as in :func:`clipped_swiglu`.
        out: optional preallocated grad_x (x's shape and dtype, contiguous, not overlapping an input).

    Returns:
        grad_x: x's shape and dtype, the gradient of x at the same positions (A and B interleaved or halves).
    """

CLIPPED_SWIGLU_GRAD = OpDef(
    name="clipped_swiglu_grad",
    cann="ClippedSwigluGrad",
    kernel="clipped_swiglu_grad",
    params=(*map(_tensor, ("grad_y", "x")), _optional("group_index"), *_CLIPPED_ATTRS),
    outputs=(Output("grad_x"),),
    groups=COUNTS,
    plan=_plan_clipped_grad,
    doc=_DOC_CLIPPED_GRAD,
    example=_example_clipped_grad,
)


def _plan_clipped_grad_mode1(grad_y, x, group_index, dim, limit, interleaved) -> Plan:
    return _plan_clipped_grad(grad_y, x, group_index, dim, 1.0, limit, 0.0, interleaved, clamp_mode=1)


_DOC_CLIPPED_GRAD_MODE1 = """**Library extension** (not a CANN operator): the exact derivative of
    ``clipped_swiglu(..., clamp_mode=1)``, with closed masks applied by a select as in CANN. With
    ``den = exp(-A) + 1``, ``silu = A / den``, ``s = 1 / den``::

        dB = dy * min(silu, L)                                -> +0.0 unless -L <= B <= L
        dA = ((((1 - s) * A + 1) * s) * clip(B, -L, L)) * dy    -> +0.0 unless silu <= L

    Used by the autograd module's backward; alpha and bias do not exist in this mode."""

#: Not a CANN operator: the library's backward of ``clipped_swiglu(..., clamp_mode=1)`` (the exact
#: derivative, closed masks), used by the autograd module; a private custom op.
CLIPPED_SWIGLU_GRAD_MODE1 = OpDef(
    name="_clipped_swiglu_grad_mode1",
    cann="(none: library extension of ClippedSwigluGrad)",
    kernel="clipped_swiglu_grad",
    params=(
        *map(_tensor, ("grad_y", "x")),
        _optional("group_index"),
        Param("dim", "int", -1, kw_only=True),
        Param("limit", "float", 7.0, kw_only=True),
        Param("interleaved", "bool", True, kw_only=True),
    ),
    outputs=(Output("grad_x"),),
    groups=COUNTS,
    plan=_plan_clipped_grad_mode1,
    doc=_DOC_CLIPPED_GRAD_MODE1,
    public=False,
)


#: Every operator, by name, in the order the docs list them.
OPERATORS: dict[str, OpDef] = {
    op.name: op
    for op in (
        SWIGLU_GROUP_GRAD,
        SWIGLU_BACKWARD_MX_QUANT_DUAL_AXIS,
        CLIPPED_SWIGLU,
        CLIPPED_SWIGLU_GRAD,
        SWIGLU_MX_QUANT_DUAL_AXIS,
        CLIPPED_SWIGLU_GRAD_MODE1,
    )
}
#: The operators users call (the five CANN operators).
PUBLIC: tuple[OpDef, ...] = tuple(op for op in OPERATORS.values() if op.public)
