"""Autograd functions and modules built on the two operators.

- :func:`clamped_swiglu` / :class:`ClampedSwiGLU`: the MoE expert activation
  ``y = silu(min(g, c)) * clip(u, -c, c) * w`` with a row mask, whose backward is the fused
  ``swiglu_group_grad`` operator.
- :class:`ClippedSwiGLU` / :class:`ClippedSwigluFunction`: GPT-OSS's clipped SwiGLU
  ``A~ * sigmoid(alpha * A~) * (clip(B, -L, L) + bias)`` (``clipped_swiglu`` forward, ``clipped_swiglu_grad``
  backward); :func:`swiglu_ops.clipped_swiglu` itself is differentiable through it.
- :func:`swiglu_mx_backward`: SwiGLU ``y = silu(A) * B`` (or the GPT-OSS clipped SwiGLU) whose backward is
  the fused SwiGLU backward + dual-axis MXFP8 quantisation (``swiglu_backward_mx_quant_dual_axis``); autograd
  receives the dequantised gradient and :class:`MXGradient` keeps the quantised tensors for FP8 GEMMs.
- :class:`MXFP8ExpertMLP` / :func:`mxfp8_expert_mlp` (defined in :mod:`swiglu_ops.training.expert_mlp`): an
MoE expert
  MLP whose SwiGLU runs on both dual-axis MX operators (forward and backward) and whose GEMMs read MXFP8.

The backwards (and the clipped forward) call the public operator functions: the kernels directly in eager
mode, the registered custom ops (``torch.ops.swiglu_ops.*``) under ``torch.compile`` and for fake, meta and
subclass inputs, so they trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ops import api
from ..ops import validate as V
from ..ops.registry import check_backend_for, check_backend_name
from ..ops.table import CLIPPED_SWIGLU
from . import eager_math
from .autograd import no_double_backward
from .expert_mlp import MXFP8ExpertMLP, mxfp8_expert_mlp

mx_dequantize = api.mx_dequantize

__all__ = [
    "clipped_swiglu",
    "clamped_swiglu",
    "ClampedSwiGLU",
    "ClippedSwigluFunction",
    "ClippedSwiGLU",
    "MXGradient",
    "swiglu_mx_backward",
    "MXFP8ExpertMLP",
    "mxfp8_expert_mlp",
]


# ------------------------------------------------------------------------------------- clamped SwiGLU


def _unweighted_forward(x: torch.Tensor, group_index: torch.Tensor | None, clamp: float) -> torch.Tensor:
    """fp32 ``silu(min(g, c)) * clip(u, -c, c)``, exactly 0 on the rows the group mask drops."""
    hidden = x.shape[-1] // 2
    g, u = x[..., :hidden].float(), x[..., hidden:].float()
    if clamp > 0:
        g = torch.clamp(g, max=clamp)  # NaN propagates, as in the backward operator
        u = torch.clamp(u, -clamp, clamp)
    y = F.silu(g) * u
    if group_index is not None:
        y = torch.where(_row_mask(group_index, x).reshape(*x.shape[:-1], 1), y, 0.0)
    return y


def _row_mask(group_index: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``row < clamp(sum(group_index), 0, rows)`` over x's flattened rows, as a tensor that combines with
    x: for a DTensor x a replicated DTensor on x's mesh (a DTensor ``group_index``, a few counts, read whole
    on every rank)."""
    if V.is_dtensor(group_index):
        group_index = group_index.full_tensor()
    rows = math.prod(x.shape[:-1])
    valid = torch.arange(rows, device=group_index.device) < V.valid_rows(group_index, rows)
    if V.is_dtensor(x):
        dtensor, mesh = V.dtensor_module(), x.device_mesh
        valid = dtensor.DTensor.from_local(valid, mesh, [dtensor.Replicate()] * mesh.ndim, run_check=False)
    return valid


def _half(x) -> torch.Tensor:
    """``x[..., :H]``: stands in for grad_y / y_origin when the backward's validation runs at forward time
    (so x's own rules are checked first, naming x)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must have rank >= 2, got shape {tuple(x.shape)}")
    if x.dtype not in V.FLOAT_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if x.shape[-1] % 2 != 0 or x.shape[-1] == 0:
        raise ValueError(f"x last dim must be even and > 0 (two halves of H > 0), got {x.shape[-1]}")
    return x[..., : x.shape[-1] // 2]


def _validate_forward(x, weight, group_index, clamp_limit, backend) -> float:
    """The backward operator's validation, run at forward time so that errors point at the forward call."""
    half = _half(x)
    check_backend_for(backend, x)
    V.check_dtensor_mix(dict(x=x, weight=weight, group_index=group_index))  # as the backward's gate will
    return V.validate_group_grad(half, x, weight, None if weight is None else half, group_index, clamp_limit)


class _ClampedSwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, group_index, clamp_limit, backend):
        clamp = _validate_forward(x, weight, group_index, clamp_limit, backend)
        y = _unweighted_forward(x, group_index, clamp)
        if weight is not None:
            y = y * weight.reshape(*x.shape[:-1], 1)
        ctx.save_for_backward(x, weight, group_index)
        ctx.clamp, ctx.backend = clamp, backend
        return y.to(x.dtype)

    @staticmethod
    @no_double_backward
    def backward(ctx, grad_y):
        x, weight, group_index = ctx.saved_tensors
        # y_origin must be the UNWEIGHTED output (recomputed here instead of stored): the operator returns
        # sum(dy * y_origin), which is w times the true dL/dw if y_origin includes the weight. Masked rows
        # have y_origin == 0, so their weight gradient is the true 0 although the operator never masks it.
        y_origin = None if weight is None else _unweighted_forward(x, group_index, ctx.clamp).to(x.dtype)
        grad_x, grad_weight = api.swiglu_group_grad(
            grad_y.to(x.dtype), x, weight, y_origin, group_index, ctx.clamp, backend=ctx.backend
        )
        return grad_x, grad_weight, None, None, None


def clamped_swiglu(x, weight=None, group_index=None, clamp_limit=0.0, *, backend="auto"):
    """``y = silu(min(g, c)) * clip(u, -c, c) * w`` with a group row mask; backward by ``swiglu_group_grad``.

    Args:
        x: ``[..., 2H]`` bf16/fp16/fp32; gate ``g = x[..., :H]``, up ``u = x[..., H:]``.
        weight: fp32 per-row routing weight (``numel == rows``, any shape) or None.
        group_index: 1-D int64/int32 group **counts**. Rows ``>= clamp(sum, 0, rows)`` of the flattened
            leading dims output 0 and get zero gradient (x and weight).
        clamp_limit: ``c``; 0 disables the clamp.
        backend: backend of the backward operator.

    Returns:
        ``[..., H]`` in x's dtype, computed in fp32 (``(silu * clip) * w``) and rounded once.

    Gradient conventions (those of the operator): the clamp masks are open intervals, so at ``g == c`` the
    gate gradient is 0 and at ``u == +-c`` the up gradient is 0 (the up gradient at ``g == c`` is
    ``dy * silu(c) * w``). ``weight.grad`` is the true ``sum_h dy * silu(g~) * u~`` (see ``backward``).
    """
    V.check_untransformed({"x": x, "weight": weight})
    return _ClampedSwiGLUFunction.apply(x, weight, group_index, clamp_limit, backend)


class ClampedSwiGLU(torch.nn.Module):
    """The MoE expert activation with a clamp, a per-token routing weight and a group row mask, whose
    backward is the fused CANN ``SwigluGroupGrad`` operator (:func:`swiglu_ops.swiglu_group_grad`).

    ``ClampedSwiGLU(clamp_limit)(x, weight=None, group_index=None)`` computes, for ``x = [g | u]``
    (``[..., 2H]``, bf16/fp16/fp32)::

        y = silu(min(g, c)) * clip(u, -c, c) * weight        (c = clamp_limit; 0 disables the clamp)

    in fp32, rounded once to x's dtype (:func:`clamped_swiglu`).

    Args:
        clamp_limit: ``c >= 0`` (``inf`` accepted); the backward's clamp masks are open intervals (at
            ``g == c`` the gate gradient is 0), as in the operator.
        backend: backend of the backward operator ("auto", "reference", "cpu", "triton").

    ``forward(x, weight=None, group_index=None)``:

    - ``weight``: fp32 routing weight, one per row (``numel == rows``, any shape), or None. Its gradient is
      the true ``dL/dweight`` (the backward passes the unweighted output as the operator's ``y_origin``).
    - ``group_index``: 1-D int64/int32 group **counts** (CANN's convention for this operator, not PyTorch's
      cumulative ``offs``: convert those with :func:`swiglu_ops.ends_to_counts`). Rows
      ``>= clamp(sum, 0, rows)`` of the flattened leading dims output 0 and get zero gradient.

    Returns ``[..., H]`` in x's dtype. Works under ``torch.compile`` (also ``fullgraph=True`` and
    ``dynamic=True``; the backward is one opaque custom op).
    """

    def __init__(self, clamp_limit: float = 0.0, *, backend: str = "auto"):
        super().__init__()
        V.check_clamp_limit(clamp_limit)  # errors at construction, naming the argument
        check_backend_name(backend)
        self.clamp_limit = clamp_limit
        self.backend = backend

    def forward(self, x, weight=None, group_index=None):
        return clamped_swiglu(x, weight, group_index, self.clamp_limit, backend=self.backend)

    def extra_repr(self) -> str:
        return f"clamp_limit={self.clamp_limit}, backend={self.backend!r}"


# ---------------------------------------------------------------------------- clipped SwiGLU (GPT-OSS)


class ClippedSwigluFunction(torch.autograd.Function):
    """Autograd of :func:`swiglu_ops.clipped_swiglu` (clipped_swiglu.md section 10).

    ``ClippedSwigluFunction.apply(x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode, backend)``
    runs the ``clipped_swiglu`` operator and saves only x (and group_index): the backward recomputes from x,
    as CANN's grad does. Backward:

    - ``clamp_mode=0``: ``clipped_swiglu_grad`` with the same attributes (exactly CANN ClippedSwigluGrad;
      at the clamp boundaries it equals torch autograd of the GPT-OSS formula: closed intervals).
    - ``clamp_mode=1``: CANN has no backward; the library's extension, the exact derivative of the
      clamp_mode-1 forward with closed masks applied by a select (a masked position is +0.0).

    Rows past the valid count get +0.0. No gradient for group_index; no double backward.
    """

    # The operators are called through the public layer (swiglu_ops.ops.api), which in eager mode skips the
    # custom-op dispatcher (tens of microseconds per call) and while torch.compile traces emits the custom
    # ops (one opaque node).

    @staticmethod
    def forward(ctx, x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode, backend):
        y = api.clipped_swiglu(
            x, group_index, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved,
            clamp_mode=clamp_mode, backend=backend,
        )  # fmt: skip
        ctx.save_for_backward(x, group_index)
        ctx.attrs = dict(
            dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved, backend=backend
        )
        ctx.clamp_mode = clamp_mode
        return y

    @staticmethod
    @no_double_backward
    def backward(ctx, grad_y):
        x, group_index = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_y = grad_y.to(x.dtype)
            if ctx.clamp_mode == 0:
                grad_x = api.clipped_swiglu_grad(grad_y, x, group_index, **ctx.attrs)
            else:
                a = ctx.attrs
                grad_x = api.clipped_swiglu_grad_mode1(
                    grad_y, x, group_index, dim=a["dim"], limit=a["limit"], interleaved=a["interleaved"],
                    backend=a["backend"],
                )  # fmt: skip
        return grad_x, None, None, None, None, None, None, None, None


class ClippedSwiGLU(torch.nn.Module):
    """GPT-OSS's clipped SwiGLU activation as a module, fused forward and backward.

    ``ClippedSwiGLU()(x)`` computes, for ``A = x[..., ::2]`` (gate) and ``B = x[..., 1::2]`` (up)::

        A~ = min(A, limit);  y = A~ * sigmoid(alpha * A~) * (clip(B, -limit, limit) + bias)

    in fp32, rounded once to x's dtype (CANN ClippedSwiglu, the operator :func:`swiglu_ops.clipped_swiglu`);
    the backward is CANN ClippedSwigluGrad (:func:`swiglu_ops.clipped_swiglu_grad`), recomputed from x. The
    defaults are the GPT-OSS preset (openai ``swiglu``, Hugging Face ``GptOssExperts``): ``alpha=1.702``,
    ``limit=7.0``, ``bias=1.0``, interleaved gate/up.

    Args:
        dim: the axis whose size is halved (x is viewed as ``[prod(shape[:dim]), prod(shape[dim:])]``;
            interleaved pairs are consecutive elements of that flattened row, also when ``dim != -1``).
        alpha, limit, bias: see above (fp32 values; ``limit > 0``, ``inf`` disables the clamp).
        interleaved: gate/up are the even/odd elements (True) or the two halves (False).
        clamp_mode: 0 (GPT-OSS: clamp the gate, then the activation) or 1 (clamp the activation's output,
            ``y = min(silu(A), limit) * clip(B)``; alpha and bias unused; the backward is a swiglu_ops
            extension, see :class:`ClippedSwigluFunction`).
        backend: "auto", "reference", "cpu" or "triton".

    ``forward(x, group_index=None)``: ``group_index`` holds group **counts** (1-D int64/int32): rows
    ``>= clamp(sum, 0, rows)`` of the ``[pre, cut]`` view output +0.0 and get a +0.0 gradient.
    """

    def __init__(
        self,
        dim: int = -1,
        alpha: float = 1.702,
        limit: float = 7.0,
        bias: float = 1.0,
        interleaved: bool = True,
        clamp_mode: int = 0,
        *,
        backend: str = "auto",
    ):
        super().__init__()
        V.glu_params(
            interleaved=interleaved, clipped=True, alpha=alpha, limit=limit, bias=bias, clamp_mode=clamp_mode
        )  # errors at construction, naming the argument
        check_backend_name(backend)
        self.dim, self.alpha, self.limit, self.bias = dim, alpha, limit, bias
        self.interleaved, self.clamp_mode, self.backend = interleaved, clamp_mode, backend

    def forward(self, x: torch.Tensor, group_index: torch.Tensor | None = None) -> torch.Tensor:
        V.check_untransformed({"x": x})
        return ClippedSwigluFunction.apply(
            x, group_index, self.dim, self.alpha, self.limit, self.bias, self.interleaved, self.clamp_mode,
            self.backend,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, alpha={self.alpha}, limit={self.limit}, bias={self.bias}, "
            f"interleaved={self.interleaved}, clamp_mode={self.clamp_mode}, backend={self.backend!r}"
        )


_CLIPPED = {p.name: p.default for p in CLIPPED_SWIGLU.params}


def clipped_swiglu(
    x,
    group_index=None,
    *,
    dim=_CLIPPED["dim"],
    alpha=_CLIPPED["alpha"],
    limit=_CLIPPED["limit"],
    bias=_CLIPPED["bias"],
    interleaved=_CLIPPED["interleaved"],
    clamp_mode=_CLIPPED["clamp_mode"],
    backend="auto",
    out=None,
):
    V.check_untransformed({"x": x})
    if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
        if out is not None:
            raise ValueError("out= cannot be used when x requires grad (autograd does not record it)")
        return ClippedSwigluFunction.apply(
            x, group_index, dim, alpha, limit, bias, interleaved, clamp_mode, backend
        )
    return api.clipped_swiglu(
        x, group_index, dim=dim, alpha=alpha, limit=limit, bias=bias, interleaved=interleaved,
        clamp_mode=clamp_mode, backend=backend, out=out,
    )  # fmt: skip


clipped_swiglu.__doc__ = CLIPPED_SWIGLU.doc


# ----------------------------------------------------------------------------------- MX-quantised backward


@dataclass
class MXGradient:
    """The MX-quantised gradient of x, filled in by the backward of :func:`swiglu_mx_backward`.

    ``y1``/``mxscale1``: row-wise blocks (32 columns; operand of the dgrad GEMM). ``y2``/``mxscale2``:
    column-wise blocks (32 tokens, restarting at every group; operand of the wgrad GEMM). Scales are in
    Ascend's paired layout; :mod:`swiglu_ops.layouts` converts them to plain or cuBLAS blocked layouts.
    """

    y1: torch.Tensor | None = None
    mxscale1: torch.Tensor | None = None
    y2: torch.Tensor | None = None
    mxscale2: torch.Tensor | None = None
    group_index: torch.Tensor | None = None


class _SwiGLUMXFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group_index, activate_left, scale_alg, dst_dtype, backend, capture, gpt_oss):
        limit, alpha, bias, interleaved = gpt_oss
        check_backend_for(backend, x)  # here, not first in the backward
        if capture is not None and not isinstance(capture, MXGradient):
            raise TypeError(f"capture must be an MXGradient or None, got {type(capture).__name__}")
        _, scale_alg, glu = V.validate_mx_backward(
            x,
            _half(x),
            group_index,
            activate_left,
            "rint",
            scale_alg,
            dst_dtype,
            0.0,
            limit,
            alpha,
            bias,
            interleaved,
        )
        ctx.save_for_backward(x, group_index)
        glu_args = dict(limit=limit, alpha=alpha, bias=bias, interleaved=interleaved)
        ctx.options = dict(activate_left=activate_left, scale_alg=scale_alg, dst_dtype=dst_dtype, **glu_args)
        ctx.options["backend"] = backend
        ctx.capture = capture
        # The activation whose gradient the operator's stage 1 computes, in fp32, rounded once.
        return eager_math.forward_rounded(x, glu)

    @staticmethod
    @no_double_backward
    def backward(ctx, grad_y):
        x, group_index = ctx.saved_tensors
        y1, s1, y2, s2 = api.swiglu_backward_mx_quant_dual_axis(
            x, grad_y.to(x.dtype), group_index, **ctx.options
        )
        if ctx.capture is not None:
            ctx.capture.y1, ctx.capture.mxscale1, ctx.capture.y2, ctx.capture.mxscale2 = y1, s1, y2, s2
            ctx.capture.group_index = group_index
        return mx_dequantize(y1, s1, axis=-1, dtype=x.dtype), None, None, None, None, None, None, None


def swiglu_mx_backward(
    x,
    group_index=None,
    *,
    activate_left=True,
    scale_alg=1,
    dst_dtype=torch.float8_e4m3fn,
    backend="auto",
    capture: MXGradient | None = None,
    limit=None,
    alpha=None,
    bias=None,
    interleaved=False,
):
    """SwiGLU ``y = silu(A) * B`` (or GPT-OSS's clipped SwiGLU) whose gradient is MX-quantised by the fused
    operator.

    The forward is exact (fp32 math rounded to x's dtype): plain ``(A / (exp(-A) + 1)) * B``, or with
    ``limit``/``alpha``/``bias`` the clipped SwiGLU of :func:`swiglu_ops.clipped_swiglu` (clamp_mode 0).
    The backward runs ``swiglu_backward_mx_quant_dual_axis`` with the same arguments (its stage 1 is that
    activation's gradient; no routing weight) and
    returns the **row-wise** dequantised gradient ``fp8(y1) * 2**(mxscale1 - 127)`` in x's dtype to autograd,
    i.e. the gradient a dgrad GEMM on ``(y1, mxscale1)`` sees. Pass an :class:`MXGradient` as ``capture`` to
    also receive the quantised tensors (``y1``, ``mxscale1``, ``y2``, ``mxscale2``) for FP8 GEMMs (eager
    mode only: ``torch.compile`` rejects the backward's write to an outside object; compile without it).

    Args:
        x: ``[..., M, 2N]`` bf16/fp16/fp32 with ``2N % 64 == 0``; A is the left half if ``activate_left``.
        group_index: 1-D int64/int32 cumulative row **ends** (2-D x only); token-axis blocks restart at every
            group start. Must end at M.
        scale_alg, dst_dtype, backend: as in :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis`.
        limit, alpha, bias: the GPT-OSS clipped SwiGLU (e.g. 7.0, 1.702, 1.0), all three or none.
        interleaved: A/B are the even/odd columns of x (GPT-OSS's layout) instead of its halves.
    """
    if capture is not None and torch.compiler.is_compiling():
        torch._dynamo.graph_break(
            msg="swiglu_mx_backward(capture=...) writes the quantised gradient to a Python object in the "
            "backward, which torch.compile cannot trace: the call runs eagerly (with fullgraph=True it is an "
            "error). Compile without capture, or keep the FP8 operands in the graph with "
            "swiglu_ops.MXFP8ExpertMLP"
        )
    V.check_untransformed({"x": x})
    gpt_oss = (limit, alpha, bias, interleaved)
    return _SwiGLUMXFunction.apply(
        x, group_index, activate_left, scale_alg, dst_dtype, backend, capture, gpt_oss
    )
