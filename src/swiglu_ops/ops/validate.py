"""The operators' argument checks, written once, and the one gate to the kernels.

Every rule a user's argument must satisfy is here, named by the argument: a ``TypeError`` for a wrong type or
dtype, a ``ValueError`` for a wrong value or shape, never a crash or a silently wrong result. The operator
table (:mod:`.table`) names, per operator, which of these rules its arguments follow; the public functions
(:mod:`.api`) and the custom ops' fake kernels (:mod:`.custom_ops`) run them through the table.

**The gate** (:func:`needs_dispatch`, :func:`kernel_ready`): only plain dense tensors with storage reach a
backend's kernel. A fake tensor (``FakeTensorMode``, ``torch.compile``), a meta tensor, a tensor subclass
(DTensor, torch's ``TwoTensor``, any wrapper subclass) goes through the registered custom op instead, where
torch dispatches it (fake kernels, DTensor rules, the subclass's own ``__torch_dispatch__``); an ``out=`` that
is not a plain dense tensor, or a sparse/mkldnn/nested tensor anywhere, is a ``TypeError`` naming the
argument. Negative and conjugate views are resolved into plain values before a pointer is taken (an input) or
refused (an ``out=``, whose writes would not show through the view). Overlap between an ``out=`` and an input
is judged on address ranges, not storage objects.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, fake_tensor_tls, is_fake, maybe_get_fake_mode

from ..numerics import mx
from ..numerics.glu import GluParams, fp32_value

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int64, torch.int32)


# ----------------------------------------------------------------------------------------------- the gate


def is_plain(t: torch.Tensor) -> bool:
    """A dense tensor with storage that a kernel may read through its pointer: exactly ``torch.Tensor`` (or an
    ``nn.Parameter``), strided, not fake, not meta."""
    return (
        (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.layout == torch.strided
        and t.device.type != "meta"
        and not is_fake(t)
    )


def dispatch_mode_active() -> bool:
    """Whether a ``TorchDispatchMode`` (e.g. ``FakeTensorMode``) is active: tensors the operator allocated
    would then be the mode's, not memory a kernel may write."""
    return torch._C._len_torch_dispatch_stack() > 0


def check_untransformed(tensors: dict) -> None:
    """TypeError for a tensor inside a torch.func transform (vmap, grad, jvp): the operators have no batching
    or forward-mode rules, and the autograd wrappers (old-style ``autograd.Function``s, like torch's own
    custom ones) none for functorch. Not while torch.compile traces (Dynamo cannot call the test; a
    transform there is Dynamo's to refuse)."""
    if torch.compiler.is_compiling():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(t):
            raise TypeError(
                f"{name} is a tensor inside a torch.func transform (vmap, grad, jvp): the operators have no "
                "batching or forward-mode rules; pass the batch as leading dimensions and use autograd"
            )


def needs_dispatch(tensors: dict) -> bool:
    """Whether a call must go through the custom op (torch's dispatcher) instead of straight to a kernel:
    an input that is not plain (fake, meta, a subclass) or an active dispatch mode. Raises the ``TypeError``
    for tensors no dispatch can take (sparse, mkldnn, nested layouts; fake tensors beside real ones)."""
    routed = dispatch_mode_active()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            continue
        if t.layout != torch.strided or t.is_nested:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
        check_untransformed({name: t})
        routed = routed or not is_plain(t)
    if routed:
        check_fake_mix(tensors)
        check_dtensor_mix(tensors)
    return routed


def dtensor_module():
    """``torch.distributed.tensor`` if it is imported, else None: a DTensor cannot exist before, and importing
    it costs more than a call (so nothing here imports it)."""
    return sys.modules.get("torch.distributed.tensor")


def is_dtensor(t) -> bool:
    dtensor = dtensor_module()
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def check_dtensor_mix(tensors: dict) -> None:
    """A DTensor beside a plain tensor argument of more than one element: DTensor cannot know how the plain
    one is placed (the same values on every rank, or this rank's part?), and answers with a RuntimeError
    from its dispatcher; here it is a ``TypeError`` naming the argument. One-element plain tensors, and any
    inside DTensor's ``implicit_replication()``, are taken as replicated, as DTensor takes them."""
    present = {n: t for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    distributed = [n for n, t in present.items() if is_dtensor(t)]
    if not distributed or getattr(
        dtensor_module().DTensor._op_dispatcher, "_allow_implicit_replication", False
    ):
        return
    for name, t in present.items():
        if not is_dtensor(t) and not (t.numel() == 1 and t.dim() <= 1):
            raise TypeError(
                f"{name} is a plain tensor while {distributed[0]} is a DTensor: pass {name} as a DTensor "
                f"too (DTensor.from_local({name}, mesh, [Replicate()]) where every rank holds the same "
                "values), or every argument as a plain tensor"
            )


def _active_fake_mode():
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    return mode if isinstance(mode, FakeTensorMode) else None


def check_fake_mix(tensors: dict) -> None:
    """Fake tensors and real ones (or fake tensors of two fake modes) cannot meet in one call: a
    ``FakeTensorMode`` that does not allow non-fake inputs (the default) answers that with an
    ``AssertionError`` from inside torch; here it is a ``TypeError`` naming the arguments."""
    present = {n: t for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    modes = {id(m): m for m in map(maybe_get_fake_mode, present.values()) if m is not None}
    active = _active_fake_mode()
    if active is not None:
        modes.setdefault(id(active), active)
    if not modes:
        return
    fake = [n for n, t in present.items() if is_fake(t)]
    if len(modes) > 1:
        raise TypeError(
            f"{', '.join(fake)} must be fake tensors of one FakeTensorMode"
            + (" (the active one)" if active is not None else "")
            + ": fake tensors of different modes cannot be mixed"
        )
    (mode,) = modes.values()
    override = fake_tensor_tls.allow_non_fake_inputs_override
    if mode.allow_non_fake_inputs if override is None else override:
        return
    real = [n for n in present if n not in fake]
    if real:
        why = (
            f"{', '.join(fake)} {'is a fake tensor' if len(fake) == 1 else 'are fake tensors'}"
            if fake
            else "a FakeTensorMode is active"
        )
        must = "a fake tensor" if len(real) == 1 else "fake tensors"
        raise TypeError(
            f"{', '.join(real)} must be {must} too ({why}, and the mode does not allow non-fake inputs): "
            "convert every tensor argument with FakeTensorMode.from_tensor, or none of them"
        )


def kernel_ready(t):
    """An input as a kernel may read it: :func:`detached`, negative and conjugate bits resolved into values
    (a negated view read through its pointer would give the un-negated numbers), a ZeroTensor (autograd's
    storage-less zeros) as real zeros. None stays None."""
    if not isinstance(t, torch.Tensor):
        return t
    t = detached(t)
    if t.is_neg() or t.is_conj():
        t = t.resolve_conj().resolve_neg()
    if t._is_zerotensor():  # autograd's efficient zeros: no storage behind the pointer
        t = torch.zeros(t.shape, dtype=t.dtype, device=t.device)
    return t


def check_out_plain(name: str, t) -> None:
    """An ``out=`` tensor is written through its pointer: a plain dense tensor without view bits."""
    if not isinstance(t, torch.Tensor):
        return
    if not is_plain(t):
        raise TypeError(
            f"{name} must be a plain dense tensor with storage (got {type(t).__name__} on {t.device}"
            f"{', a fake tensor' if is_fake(t) else ''}); tensor subclasses, fake and meta tensors take the "
            "operator's results without out="
        )
    if t.is_neg() or t.is_conj():
        raise ValueError(
            f"{name} must not be a negative or conjugate view (writes would not show through it)"
        )
    if t._is_zerotensor():
        raise ValueError(f"{name} must have storage, got a ZeroTensor (autograd's read-only zeros)")


# ------------------------------------------------------------------------------------------------ checks


def check_tensor(name: str, t, *, optional: bool = False) -> None:
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        what = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise TypeError(f"{name} must be {what}, got {type(t).__name__}")


def check_weight(weight, x: torch.Tensor, rows: int, name: str = "weight") -> None:
    """A routing weight of the MX operators (spec 7.1): float32, ``numel == rows`` (any shape), on x's
    device; None passes. A weight that requires grad is accepted (the operators read its values)."""
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor):
        raise TypeError(
            f"{name} must be a float32 torch.Tensor (one per row) or None, got {type(weight).__name__}"
        )
    if weight.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {weight.dtype}")
    if weight.numel() != rows:
        raise ValueError(
            f"{name} must have numel == rows = {rows} (one per row of x's flattened leading dims), "
            f"got shape {tuple(weight.shape)}"
        )
    check_device(x, **{name: weight})


def check_data_pair(first: str, a, second: str, b) -> None:
    """Two data tensors: ``a`` bf16, fp16 or fp32, ``b`` of a's dtype."""
    check_tensor(first, a)
    check_tensor(second, b)
    if a.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{first} must be bfloat16, float16 or float32, got {a.dtype}")
    if b.dtype != a.dtype:
        raise TypeError(f"{second} must have the dtype of {first} ({a.dtype}), got {b.dtype}")


def check_device(ref: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} must be on the same device as the data ({ref.device}), got {t.device}")


def check_out(name: str, t, shape, dtype, device) -> torch.Tensor:
    check_tensor(name, t)
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{name} requires grad: functions with out= arguments do not support automatic "
            "differentiation (torch refuses this too); pass a tensor that does not require grad, or call "
            "under torch.no_grad()"
        )
    return t


#: The two group conventions (spec README 6.3), named in every message about a group_index.
COUNTS = "group counts"


ENDS = "cumulative row ends"


class GroupConventionWarning(UserWarning):
    """A ``group_index`` whose values look like the other group convention (counts vs cumulative ends)."""


def check_group_index(group_index, convention: str) -> None:
    check_tensor(f"group_index ({convention})", group_index)
    if group_index.dtype not in INDEX_DTYPES:
        raise TypeError(f"group_index ({convention}) must be int64 or int32, got {group_index.dtype}")
    if group_index.dim() != 1 or group_index.numel() < 1:
        raise ValueError(
            f"group_index ({convention}) must be 1-D and non-empty, got shape {tuple(group_index.shape)}"
        )


def readable(t: torch.Tensor) -> bool:
    """Whether a tensor's values can be read without a device synchronisation: a plain CPU tensor (not a
    fake or meta tensor, not a subclass such as DTensor or TwoTensor, whose ``tolist()`` torch refuses, and
    not while torch.compile traces; the custom op's real kernel reads them)."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling() and is_plain(t)


def warn_if_ends_as_counts(group_index: torch.Tensor, rows: int) -> None:
    """Counts convention: a non-decreasing sequence (G >= 2) whose sum exceeds the rows while its last value
    does not is almost surely cumulative row ends (PyTorch's ``offs``): read as counts, the padding rows
    would silently stop being masked. Checked on CPU tensors only (no device synchronisation)."""
    if group_index.numel() < 2 or not readable(group_index):
        return
    v = group_index.to(torch.int64)
    total, last = int(v.sum()), int(v[-1])
    if total > rows >= last and bool((v[1:] >= v[:-1]).all()):
        effect = (
            f"read as counts, rows {last}..{rows - 1} are not masked"
            if last < rows
            else "here both readings make every row valid"
        )
        warnings.warn(
            f"group_index holds group counts (valid rows = clamp(sum, 0, rows)), but {v.tolist()} is "
            f"non-decreasing and sums to {total} > rows = {rows}: it looks like cumulative row ends "
            f"(PyTorch's offs; {effect}). Convert ends with swiglu_ops.ends_to_counts(offs).",
            GroupConventionWarning,
            stacklevel=caller_stacklevel(),
        )


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def caller_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` (for the function that calls this) of the first frame outside
    this package and torch: the user's call, however deep the library's path to the warning (a public
    function, a module's forward through ``nn.Module.__call__`` and ``autograd.Function.apply``)."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith((_PACKAGE, _TORCH, "<swiglu_ops"))):
            break
        frame, level = frame.f_back, level + 1
    return level


def check_real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return as_float(name, value)


def as_float(name: str, value) -> float:
    """``float(value)``, with the ``ValueError`` naming the argument where it does not fit (an int past
    the float range)."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must fit in a float, got {value!r}") from None


def glu_params(
    *, activate_left=True, interleaved=False, clipped=False, alpha=1.0, limit=math.inf, bias=0.0, clamp_mode=0
) -> GluParams:
    """Validated :class:`GluParams` (the GLU family member an operator computes), attributes as fp32 values.

    ``limit`` must be > 0 in fp32 (NaN and values that round to 0 rejected; ``inf`` accepted), ``alpha``
    and ``bias`` any real number (rounded to fp32, as CANN's float attributes), ``clamp_mode`` 0 or 1.
    """
    for name, flag in (("activate_left", activate_left), ("interleaved", interleaved)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if not clipped:
        return GluParams(interleaved=interleaved, activate_left=activate_left)
    alpha, bias = fp32_value(check_real("alpha", alpha)), fp32_value(check_real("bias", bias))
    limit = fp32_value(check_real("limit", limit))
    if not limit > 0.0:
        raise ValueError(f"limit must be > 0 in fp32 (inf disables the clamp; NaN is rejected), got {limit}")
    if isinstance(clamp_mode, bool) or not isinstance(clamp_mode, numbers.Integral):
        raise TypeError(f"clamp_mode must be an int, got {type(clamp_mode).__name__}")
    if clamp_mode not in (0, 1):
        raise ValueError(f"clamp_mode must be 0 (clamp before the activation) or 1 (after), got {clamp_mode}")
    return GluParams(interleaved, activate_left, True, alpha, limit, bias, int(clamp_mode))


def mx_glu_params(activate_left, interleaved, limit, alpha, bias) -> GluParams:
    """Stage 1 of the dual-axis MX operators: CANN's plain SwiGLU when ``limit``, ``alpha`` and ``bias`` are
    all None (the default), the clipped SwiGLU of GPT-OSS (clamp_mode 0) when all three are given."""
    given = [v is not None for v in (limit, alpha, bias)]
    if any(given) and not all(given):
        raise ValueError(
            "limit, alpha and bias (the GPT-OSS clipped SwiGLU, e.g. limit=7.0, alpha=1.702, bias=1.0) must "
            "be given together, or none of them for CANN's plain SwiGLU"
        )
    if not all(given):
        return glu_params(activate_left=activate_left, interleaved=interleaved)
    glu = dict(clipped=True, alpha=alpha, limit=limit, bias=bias)
    return glu_params(activate_left=activate_left, interleaved=interleaved, **glu)


def valid_rows(group_index: torch.Tensor, rows: int) -> torch.Tensor:
    """Count-mode row mask bound: clamp(int64 sum with wraparound, 0, rows), as a 0-d device tensor."""
    return group_index.to(torch.int64).sum().clamp(0, rows)


def check_clamp_limit(clamp_limit) -> float:
    """swiglu_group_grad's ``clamp_limit``, as the fp32 value the kernels use: >= 0 (0 disables the clamp,
    inf accepted), cast to fp32 after that check as CANN does (spec 2.4: 1e-50 becomes 0 and disables the
    clamp, 1e39 becomes inf)."""
    if isinstance(clamp_limit, bool) or not isinstance(clamp_limit, numbers.Real):
        raise TypeError(f"clamp_limit must be a real number, got {type(clamp_limit).__name__}")
    if not clamp_limit >= 0.0:
        raise ValueError(f"clamp_limit must be >= 0 (0 disables the clamp), got {clamp_limit}")
    return fp32_value(as_float("clamp_limit", clamp_limit))


def validate_group_grad(grad_y, x, weight, y_origin, group_index, clamp_limit):
    """Every rejection of swiglu_group_grad.md section 2 plus the contract; returns the clamp as fp32."""
    check_data_pair("grad_y", grad_y, "x", x)
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
    clamp = check_clamp_limit(clamp_limit)
    check_tensor("y_origin", y_origin, optional=True)
    rows = math.prod(grad_y.shape[:-1])
    check_weight(weight, grad_y, rows)  # the one routing-weight rule, as in the MX operators
    if (weight is None) != (y_origin is None):
        raise ValueError("weight and y_origin must be provided together (both or neither)")
    if weight is not None:
        if y_origin.dtype != grad_y.dtype:
            raise TypeError(f"y_origin must have the dtype of grad_y ({grad_y.dtype}), got {y_origin.dtype}")
        if y_origin.shape != grad_y.shape:
            raise ValueError(f"y_origin must have shape {tuple(grad_y.shape)}, got {tuple(y_origin.shape)}")
    if group_index is not None:
        check_group_index(group_index, COUNTS)
    check_device(grad_y, x=x, weight=weight, y_origin=y_origin, group_index=group_index)
    if group_index is not None:
        warn_if_ends_as_counts(group_index, rows)
    return clamp


def validate_mx_backward(
    x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value, limit, alpha,
    bias, interleaved,
):  # fmt: skip
    """Every rule of the backward MX operator (swiglu_backward_mx_quant.md section 1.5, the contract, the GLU
    parameters). Returns ``(fmt, scale_alg, glu)`` resolved: the FP8Format, 0 or 1 (None means 1) and the
    :class:`swiglu_ops.numerics.glu.GluParams` of stage 1."""
    scale_alg = bwd_mx_scale_alg(scale_alg)
    fmt = validate_mx_quant(
        x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value
    )
    glu = mx_glu_params(activate_left, interleaved, limit, alpha, bias)
    return fmt, int(scale_alg), glu


def validate_mx_quant(
    x, y_grad, group_index, activate_left, round_mode, scale_alg, dst_dtype, max_dtype_value
):
    """The tensor and format rules of the backward MX operator (swiglu_backward_mx_quant.md section 1.5 plus
    the contract); returns the FP8Format. ``activate_left`` and the GLU parameters are checked by
    :func:`mx_glu_params`: call :func:`validate_mx_backward`, which runs both."""
    check_data_pair("x", x, "y_grad", y_grad)
    if not isinstance(dst_dtype, torch.dtype):
        raise TypeError(f"dst_dtype must be a torch.dtype, got {type(dst_dtype).__name__}")
    fmt = mx.fp8_format(dst_dtype)  # activate_left: glu_params checks it (validate_mx_backward)
    if round_mode != "rint":
        raise ValueError(f"round_mode must be 'rint' (the only mode for FP8 outputs), got {round_mode!r}")
    check_scale_alg(scale_alg)
    check_max_dtype_value(max_dtype_value)
    if not 2 <= x.dim() <= 6:
        raise ValueError(f"x must have rank 2..6, got shape {tuple(x.shape)}")
    c = x.shape[-1]
    if c <= 0 or c % 64 != 0:
        raise ValueError(f"x last dim (2N) must be a positive multiple of 64, got {c}")
    expected = (*x.shape[:-1], c // 2)
    if tuple(y_grad.shape) != expected:
        raise ValueError(f"y_grad must have shape {expected}, got {tuple(y_grad.shape)}")
    check_mx_group_index(x, group_index)
    check_device(x, y_grad=y_grad)
    return fmt


def check_scale_alg(scale_alg) -> None:
    if isinstance(scale_alg, bool) or not isinstance(scale_alg, numbers.Integral):
        raise TypeError(f"scale_alg must be an int, got {type(scale_alg).__name__}")
    if scale_alg not in (0, 1):
        raise ValueError(f"scale_alg must be 0 (OCP floor) or 1 (RCEIL / cuBLAS), got {scale_alg}")


def check_max_dtype_value(max_dtype_value) -> None:
    if isinstance(max_dtype_value, bool) or not isinstance(max_dtype_value, numbers.Real):
        raise TypeError(f"max_dtype_value must be a number, got {type(max_dtype_value).__name__}")
    if max_dtype_value != 0.0:
        raise ValueError(f"max_dtype_value is reserved and must be 0.0, got {max_dtype_value}")


def check_mx_group_index(x: torch.Tensor, group_index) -> None:
    """The MX operators' group_index: cumulative row ends, 2-D x only; values checked on CPU tensors."""
    if group_index is None:
        return
    check_group_index(group_index, ENDS)
    if x.dim() != 2:
        raise ValueError(f"group_index ({ENDS}) is only supported with 2-D x / data, got rank {x.dim()}")
    check_device(x, group_index=group_index)
    check_group_ends(group_index, x.shape[0])


def check_group_ends(group_index: torch.Tensor, m: int, name: str = "group_index") -> None:
    """Cumulative row ends must be non-decreasing, >= 0 and end at ``m``. Checked wherever the values can be
    read without a device synchronisation (CPU tensors, also inside torch.compile: the custom op's real
    kernel checks them); device tensors are clamped by the kernels instead (contract section 2). The
    message says when the values look like counts, naming the argument ``name``."""
    if not readable(group_index):
        return
    ends = group_index.to(torch.int64)
    values = ends.tolist()
    hint = (
        f"; its sum is {sum(values)} = M: these look like group counts (tokens per group), convert them "
        "with swiglu_ops.counts_to_ends(counts)"
        if sum(values) == m and len(values) > 1
        else ""
    )
    if bool((ends < 0).any()):
        raise ValueError(f"{name} ({ENDS}) must be >= 0, got {values}{hint}")
    if ends.numel() > 1 and bool((ends[1:] < ends[:-1]).any()):
        raise ValueError(f"{name} ({ENDS}) must be non-decreasing, got {values}{hint}")
    if values[-1] != m:
        raise ValueError(
            f"{name} ({ENDS}) last value must equal the number of rows M = {m}, got {values}{hint}"
        )


def bwd_mx_scale_alg(scale_alg):
    """The backward MX operator's ``scale_alg``: None means 1 (RCEIL), spec README 6.1."""
    return 1 if scale_alg is None else scale_alg


#: clipped_swiglu.md 2.3 / README 6.1: group_index has 1..8192 entries in both operators.
CLIPPED_MAX_GROUPS = 8192


def clipped_dim(dim, rank: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -rank <= dim < rank:
        raise ValueError(f"dim must be in [{-rank}, {rank - 1}] for x of rank {rank}, got {dim}")
    return int(dim) % rank


def clipped_view(shape, d: int) -> tuple[int, int]:
    """``(pre, cut)``: the 2-D view ``[prod(shape[:d]), prod(shape[d:])]`` (merge-axes rule, spec 1.3)."""
    return math.prod(shape[:d]), math.prod(shape[d:])


def clipped_half_shape(shape, d: int) -> tuple[int, ...]:
    """The shape of y / grad_y: x's shape with ``shape[d]`` halved."""
    return (*shape[:d], shape[d] // 2, *shape[d + 1 :])


def validate_clipped_swiglu(
    x, group_index, *, dim, alpha, limit, bias, interleaved, clamp_mode, grad_y=None, backward=False
) -> tuple[int, GluParams]:
    """Every rejection of clipped_swiglu.md 2.3 (and README 6.1) for the forward, or with ``backward`` the
    backward (``grad_y`` then checked against x). Returns the normalised dim and the :class:`GluParams`."""
    if backward:
        check_tensor("grad_y", grad_y)
    check_tensor("x", x)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if not 1 <= x.dim() <= 8:
        raise ValueError(f"x must have rank 1..8, got shape {tuple(x.shape)}")
    d = clipped_dim(dim, x.dim())
    if x.shape[d] % 2 != 0:
        raise ValueError(f"x.shape[dim] must be even (two halves), got {x.shape[d]} (dim={dim})")
    if backward:
        if grad_y.dtype != x.dtype:
            raise TypeError(f"grad_y must have the dtype of x ({x.dtype}), got {grad_y.dtype}")
        expected = clipped_half_shape(x.shape, d)
        if tuple(grad_y.shape) != expected:
            raise ValueError(
                f"grad_y must have shape {expected} (x's shape with dim {dim} halved), "
                f"got {tuple(grad_y.shape)}"
            )
    glu = glu_params(
        interleaved=interleaved, clipped=True, alpha=alpha, limit=limit, bias=bias, clamp_mode=clamp_mode
    )
    if group_index is not None:
        check_group_index(group_index, COUNTS)
        if group_index.numel() > CLIPPED_MAX_GROUPS:
            raise ValueError(
                f"group_index ({COUNTS}) must have at most {CLIPPED_MAX_GROUPS} entries, "
                f"got {group_index.numel()}"
            )
    check_device(x, grad_y=grad_y, group_index=group_index)
    if group_index is not None:
        warn_if_ends_as_counts(group_index, clipped_view(x.shape, d)[0])
    return d, glu


def _address_range(t: torch.Tensor) -> tuple[int, int]:
    """``[first byte, last byte + 1)`` that ``t``'s elements occupy (any strides; negative ones included)."""
    low = high = 0
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride < 0:
            low += (size - 1) * stride
        else:
            high += (size - 1) * stride
    start = t.data_ptr() + low * t.element_size()
    return start, t.data_ptr() + (high + 1) * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two tensors on one device may intersect: their address ranges are compared,
    whatever storage objects hold them (two NumPy or DLPack views of one buffer are two storages over the
    same bytes). Conservative for interleaved strides (an out= is contiguous, so only an input's gaps can
    make it pessimistic)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _address_range(a), _address_range(b)
    return a0 < b1 and b0 < a1


def check_no_overlap(name: str, out: torch.Tensor, **inputs) -> None:
    for arg, t in inputs.items():
        if t is not None and overlaps(out, t):
            raise ValueError(f"{name} must not overlap {arg} (an input that is read while {name} is written)")


def check_outs_distinct(outs) -> None:
    """``outs``: ``(name, tensor)`` pairs of one call's out= tensors; no two may share memory (one tensor
    passed twice would get two results written over each other)."""
    outs = [(n, t) for n, t in outs if t is not None]
    for i, (name, t) in enumerate(outs):
        for other, u in outs[i + 1 :]:
            if t is u or overlaps(t, u):
                raise ValueError(f"{name} and {other} must be distinct tensors that do not overlap")


def detached(t):
    """Inputs that require grad are accepted: the operators are not differentiable themselves (the autograd
    functions in :mod:`swiglu_ops.training.nn` are), so every backend reads plain tensors."""
    return t.detach() if isinstance(t, torch.Tensor) and t.requires_grad else t


def check_transpose_y2(transpose_y2, fmt: mx.ElementFormat) -> None:
    if not isinstance(transpose_y2, bool):
        raise TypeError(f"transpose_y2 must be a bool, got {type(transpose_y2).__name__}")
    if transpose_y2 and fmt.packed:
        raise ValueError(
            f"transpose_y2=True is FP8 only, got dst_dtype {fmt.name}: FP4 packs two elements per byte along "
            "y2's last axis, and token-contiguous FP4 would pack two tokens into one byte, across the group "
            "boundaries where token blocks restart (groups may have odd sizes)"
        )


def validate_mx_forward(
    x,
    group_index,
    activate_left,
    round_mode,
    scale_alg,
    dst_dtype,
    max_dtype_value,
    limit,
    alpha,
    bias,
    interleaved,
):
    """Every rejection of swiglu_mx_quant.md sections 0 and 1.5 plus the contract (README 6.1 / 6.2).

    Returns ``(fmt, scale_alg, round_mode, glu)`` resolved: the
    :class:`swiglu_ops.numerics.mx.ElementFormat`, 0 or 1 (``None`` means 1 for FP8 and 0 for FP4), the round
    mode's name and the :class:`swiglu_ops.numerics.glu.GluParams` of stage 1.
    """
    check_tensor("x", x)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    fmt = mx.element_format(dst_dtype)
    mode = mx.check_round_mode(round_mode)
    if not fmt.packed and mode != "rint":
        raise ValueError(f"round_mode must be 'rint' for FP8 outputs ({dst_dtype}), got {round_mode!r}")
    if scale_alg is None:
        scale_alg = 0 if fmt.packed else 1
    check_scale_alg(scale_alg)
    if fmt.packed and scale_alg != 0:
        raise ValueError(
            f"scale_alg must be 0 (OCP) or None for FP4 outputs ({dst_dtype}): RCEIL (1) is FP8 only"
        )
    check_max_dtype_value(max_dtype_value)
    glu = mx_glu_params(activate_left, interleaved, limit, alpha, bias)
    if x.dim() < 2:
        raise ValueError(f"x must have rank >= 2, got shape {tuple(x.shape)}")
    c = x.shape[-1]
    if c <= 0 or c % 2 != 0:
        raise ValueError(f"x last dim (2N) must be positive and even (N >= 1), got {c}")
    if fmt.packed and c % 4 != 0:
        raise ValueError(
            f"x last dim (2N) must be a multiple of 4 for FP4 outputs (N even, two per byte), got {c}"
        )
    check_mx_group_index(x, group_index)
    return fmt, int(scale_alg), mode, glu


def mx_output_specs(shape, group_index, fmt: mx.ElementFormat, transpose_y2=False):
    """(shape, dtype) of y1, mxscale1, y2, mxscale2 of both MX operators for quantised values ``shape =
    [..., M, C]`` (the forward's activation ``[..., M, N]``, the backward's gradient ``[..., M, 2N]``;
    swiglu_mx_quant.md 0 / 1.2, swiglu_backward_mx_quant.md 1.2); the fake kernels use it too. y1/y2 are
    ``[..., M, C]`` in ``fmt``'s dtype (packed FP4: ``[..., M, C/2]`` bytes), with ``transpose_y2`` (FP8) y2
    is ``[..., C, M]``; mxscale1 ``[..., M, ceil(C/64), 2]``, mxscale2 ``[..., R, C, 2]``."""
    *lead, m, c = shape
    y = ((*lead, m, c // 2 if fmt.packed else c), fmt.torch_dtype)
    y2 = ((*lead, c, m), fmt.torch_dtype) if transpose_y2 else y
    r = mx.mxscale2_rows(m, None if group_index is None else group_index.numel())
    e8m0 = torch.float8_e8m0fnu
    return [y, (mx.mxscale1_shape((*lead, m, c)), e8m0), y2, ((*lead, r, c, 2), e8m0)]


def mx_forward_output_specs(x, group_index, fmt, transpose_y2=False):
    """:func:`mx_output_specs` of the forward operator for its input ``x [..., M, 2N]``."""
    *lead, m, c = x.shape
    return mx_output_specs((*lead, m, c // 2), group_index, fmt, transpose_y2)


DEQUANTIZE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def check_dequantize_dtype(dtype) -> None:
    """:func:`swiglu_ops.mx_dequantize`'s result dtype: a floating dtype that holds every MX value's sign."""
    if not isinstance(dtype, torch.dtype) or dtype not in DEQUANTIZE_DTYPES:
        raise TypeError(f"dtype must be one of {DEQUANTIZE_DTYPES} (the result's dtype), got {dtype!r}")


def check_dequantize_args(data, scale, axis, group_index, dtype) -> None:
    """The argument types of :func:`swiglu_ops.mx_dequantize`, before anything (the custom op's schema would
    turn them into its own errors)."""
    check_tensor("data", data)
    check_tensor("scale", scale)
    check_tensor("group_index", group_index, optional=True)
    check_dequantize_dtype(dtype)
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, -1 (mxscale1) or -2 (mxscale2), got {type(axis).__name__}")
    if axis not in (-1, -2):
        raise ValueError(f"axis must be -1 (mxscale1) or -2 (mxscale2), got {axis!r}")


def dequantize_spec(data, scale, axis, group_index, dst_dtype, dtype):
    """Every rule of :func:`swiglu_ops.mx_dequantize` (also its fake kernel's): ``(format, result shape)``.

    ``group_index`` (axis -2) follows the MX operators' rules for cumulative row ends (int64/int32, 1-D,
    non-empty, on data's device; on a CPU tensor non-decreasing, >= 0 and ending at M): counts, decreasing
    or float ends are errors, never other numbers."""
    check_dequantize_args(data, scale, axis, group_index, dtype)
    if dst_dtype is None:
        fmt = mx.format_of_dtype(data.dtype)
        if fmt is None:
            raise TypeError(
                "data must be float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2 (y1 / y2), or uint8 codes with "
                f"dst_dtype= naming their format, got {data.dtype}"
            )
    else:
        fmt = mx.element_format(dst_dtype)
        if data.dtype not in (fmt.torch_dtype, torch.uint8):
            raise TypeError(
                f"data must be {fmt.torch_dtype} or uint8 codes for dst_dtype {dst_dtype}, got {data.dtype}"
            )
    if scale.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise TypeError(f"scale must be float8_e8m0fnu or uint8 codes, got {scale.dtype}")
    check_device(data, scale=scale)
    if data.dim() < 2:
        raise ValueError(f"data must have rank >= 2, got shape {tuple(data.shape)}")
    *lead, m, w = data.shape
    shape = (*lead, m, 2 * w if fmt.packed else w)
    check_mx_group_index(data, group_index)  # the ends that produced the outputs, as the operators check them
    if axis == -1:  # row-wise blocks do not depend on the groups
        if tuple(scale.shape) != mx.mxscale1_shape(shape):
            raise ValueError(f"scale must have shape {mx.mxscale1_shape(shape)}, got {tuple(scale.shape)}")
        return fmt, shape
    n = shape[-1]
    g = None if group_index is None else group_index.numel()
    rows = mx.mxscale2_rows(m, g)
    if tuple(scale.shape) != (*lead, rows, n, 2):
        hint = ""
        if g is None and data.dim() == 2 and scale.dim() == 3 and scale.shape[-2:] == (n, 2):
            hint = (
                f": group_index is missing (scales of grouped outputs have M//64 + G = {m // 64} + G rows, "
                "pass the cumulative row ends that produced them)"
            )
        raise ValueError(f"scale must have shape {(*lead, rows, n, 2)}, got {tuple(scale.shape)}{hint}")
    return fmt, shape
