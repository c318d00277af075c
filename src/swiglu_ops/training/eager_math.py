"""The training layer's plain-torch math, with eager's bits under torch.compile.

The autograd wrappers compute a few things in plain PyTorch rather than by an operator: the exact SwiGLU
forward that :func:`swiglu_ops.swiglu_mx_backward` returns, the bf16 baseline of
:class:`swiglu_ops.MXFP8ExpertMLP` (``quantize=False``: forward, gradient, and the router's gradient, a sum
of ``act16`` terms) and the MXFP8 quantisation of its weights and of ``dh``. Inductor recompiles such math
with its own ``exp``, reorders it and, by default (``torch._inductor.config.emulate_precision_casts =
False``), drops the roundings to bf16 between fused operations, so the compiled results differed from eager:
the fp32 SwiGLU forward by up to 3 ulp, an fp32-master-weight MLP's output by MX steps (the weights
quantised from their fp32 values instead of the bf16 ones), the baseline's router gradient by 0.1 %.

Here each of them is one opaque custom op while torch.compile traces (Inductor calls it as it is, on
materialised inputs) and the plain function in eager mode, so compiled and eager training agree bit for bit.
The math itself lives in :mod:`swiglu_ops.numerics` (the readable spec), unchanged.
"""

from __future__ import annotations

import torch

from ..numerics import glu as glu_math
from ..numerics import mx
from ..numerics.glu import GluParams
from ..ops import validate as V

__all__ = ["forward_rounded", "backward_rounded", "act16_sums", "quantize_e4m3_blocks"]

_E4M3 = mx.E4M3FN
_RCEIL = 1


def _glu(interleaved, activate_left, clipped, alpha, limit, bias, clamp_mode) -> GluParams:
    return GluParams(interleaved, activate_left, clipped, alpha, limit, bias, clamp_mode)


def _fields(glu: GluParams) -> tuple:
    return (glu.interleaved, glu.activate_left, glu.clipped, glu.alpha, glu.limit, glu.bias, glu.clamp_mode)


def _half_shape(x: torch.Tensor) -> tuple[int, ...]:
    return (*x.shape[:-1], x.shape[-1] // 2)


# The schema's GLU fields: (interleaved, activate_left, clipped, alpha, limit, bias, clamp_mode).
_GLU_SCHEMA = (
    "bool interleaved, bool activate_left, bool clipped, float alpha, float limit, float bias, int clamp_mode"
)

torch.library.define(
    "swiglu_ops::_glu_forward_rounded", f"(Tensor x, Tensor? weight, {_GLU_SCHEMA}) -> Tensor"
)
torch.library.define(
    "swiglu_ops::_glu_backward_rounded", f"(Tensor x, Tensor dy, Tensor? weight, {_GLU_SCHEMA}) -> Tensor"
)
torch.library.define("swiglu_ops::_glu_act16_sums", f"(Tensor dy, Tensor x, {_GLU_SCHEMA}) -> Tensor")
torch.library.define("swiglu_ops::_mx_e4m3_blocks", "(Tensor blocks, int dim) -> (Tensor, Tensor)")


@torch.library.impl("swiglu_ops::_glu_forward_rounded", "CompositeExplicitAutograd")
def _forward_impl(x, weight, *glu):  # (results contiguous, as the fake kernels say, whatever x's strides)
    return glu_math.forward_rounded(x, _glu(*glu), weight).contiguous()


@torch.library.impl("swiglu_ops::_glu_backward_rounded", "CompositeExplicitAutograd")
def _backward_impl(x, dy, weight, *glu):
    return glu_math.backward_rounded(x, dy, _glu(*glu), weight).contiguous()


def _act16_sums(dy: torch.Tensor, x: torch.Tensor, glu: GluParams) -> torch.Tensor:
    return glu_math.act16_product(dy, x, glu).sum(-1)


@torch.library.impl("swiglu_ops::_glu_act16_sums", "CompositeExplicitAutograd")
def _act16_impl(dy, x, *glu):
    return _act16_sums(dy, x, _glu(*glu)).contiguous()


def _e4m3_blocks(blocks: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (E4M3FN, RCEIL E8M0 scales) of 32-element ``blocks`` along ``dim``, the element cast done by
    torch: ``(codes float8_e4m3fn, scale codes uint8)``. The scale rule is mx's; the product ``v * 2**(127 -
    E)`` of a 16-bit ``v`` is exact in fp32 wherever it can round to a nonzero E4M3 value, and RCEIL keeps it
    below 464, where torch's round-to-nearest-even cast needs no saturation: the same codes as
    :func:`swiglu_ops.numerics.mx.quantize_blocks` for every finite block (tested). A NaN/inf block gets scale
    0xFF as in mx (its elements differ; they decode to NaN)."""
    amax = mx.amax_bits(blocks, dim)
    codes = mx.scale_codes(amax, _E4M3, _RCEIL)
    recip = mx.scale_reciprocal(codes, amax, _RCEIL).unsqueeze(dim)
    y = (blocks.float() * recip).to(torch.float8_e4m3fn)
    return y, codes.to(torch.uint8)


@torch.library.impl("swiglu_ops::_mx_e4m3_blocks", "CompositeExplicitAutograd")
def _e4m3_blocks_impl(blocks, dim):
    return tuple(t.contiguous() for t in _e4m3_blocks(blocks, dim))


@torch.library.register_fake("swiglu_ops::_glu_forward_rounded")
def _forward_fake(x, weight, *glu):
    return x.new_empty(_half_shape(x))


@torch.library.register_fake("swiglu_ops::_glu_backward_rounded")
def _backward_fake(x, dy, weight, *glu):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("swiglu_ops::_glu_act16_sums")
def _act16_fake(dy, x, *glu):
    return dy.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("swiglu_ops::_mx_e4m3_blocks")
def _e4m3_blocks_fake(blocks, dim):
    scale_shape = list(blocks.shape)
    del scale_shape[dim]
    return (
        blocks.new_empty(blocks.shape, dtype=torch.float8_e4m3fn),
        blocks.new_empty(scale_shape, dtype=torch.uint8),
    )


def _opaque(*tensors) -> bool:
    """Whether to call the opaque op: while torch.compile traces, on tensors that are not DTensors (the ops
    have no sharding rule; on DTensors the plain math runs through DTensor's own rules, as in eager)."""
    return torch.compiler.is_compiling() and not any(V.is_dtensor(t) for t in tensors)


def forward_rounded(x: torch.Tensor, glu: GluParams, weight: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`swiglu_ops.numerics.glu.forward_rounded` (one opaque op under torch.compile)."""
    if _opaque(x, weight):
        return torch.ops.swiglu_ops._glu_forward_rounded(x, weight, *_fields(glu))
    return glu_math.forward_rounded(x, glu, weight)


def backward_rounded(
    x: torch.Tensor, dy: torch.Tensor, glu: GluParams, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`swiglu_ops.numerics.glu.backward_rounded` (one opaque op under torch.compile)."""
    if _opaque(x, dy, weight):
        return torch.ops.swiglu_ops._glu_backward_rounded(x, dy, weight, *_fields(glu))
    return glu_math.backward_rounded(x, dy, glu, weight)


def act16_sums(dy: torch.Tensor, x: torch.Tensor, glu: GluParams) -> torch.Tensor:
    """Per row, the sum over the hidden axis of :func:`swiglu_ops.numerics.glu.act16_product` (dL/dweight
    of the weighted forward; one opaque op under torch.compile)."""
    if _opaque(dy, x):
        return torch.ops.swiglu_ops._glu_act16_sums(dy, x, *_fields(glu))
    return _act16_sums(dy, x, glu)


def quantize_e4m3_blocks(blocks: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_e4m3_blocks` (one opaque op under torch.compile: the 16-bit values are quantised as stored,
    not as the fp32 values a fused cast came from)."""
    if _opaque(blocks):
        return torch.ops.swiglu_ops._mx_e4m3_blocks(blocks, dim)
    return _e4m3_blocks(blocks, dim)
