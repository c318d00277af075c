"""swiglu_ops: Ascend's fused SwiGLU-backward MoE operators for PyTorch on CPU and NVIDIA GPUs.

- :func:`swiglu_group_grad`: clamped SwiGLU backward with a per-token routing weight, a row mask from
  ``group_index`` (counts) and the routing-weight gradient (CANN ``SwigluGroupGrad``).
- :func:`swiglu_backward_mx_quant_dual_axis`: SwiGLU backward fused with dual-axis MX (FP8 + E8M0) block
  quantisation, token-axis blocks restarting at every expert group (CANN
  ``SwigluBackwardMxQuantWithDualAxis``).
- :func:`clipped_swiglu` / :func:`clipped_swiglu_grad`: GPT-OSS's clipped SwiGLU (alpha, limit, bias,
  interleaved gate/up, clamp_mode) and its gradient (CANN ``ClippedSwiglu`` / ``ClippedSwigluGrad``);
  :class:`ClippedSwiGLU` is the module, :func:`swiglu_ops.integrations.patch_gpt_oss` puts it into a Hugging
  Face GPT-OSS model.
- :func:`swiglu_mx_quant_dual_axis`: SwiGLU forward fused with dual-axis MX block quantisation to FP8
  (E4M3FN, E5M2) or FP4 (E2M1, E1M2 = the sentinel :data:`float4_e1m2fn_x2`), E8M0 scales (CANN
  ``SwigluMxQuantWithDualAxis``).
- :func:`mx_dequantize`: the inverse of the quantisation; :mod:`swiglu_ops.layouts`: the scales in the
  layouts MX GEMMs read.
- :func:`counts_to_ends` / :func:`ends_to_counts`: between the two group conventions (counts for
  ``swiglu_group_grad`` and the clipped SwiGLU, cumulative row ends = PyTorch's ``offs`` for the MX
  operators).
- :class:`MXFP8ExpertMLP` / :func:`mxfp8_expert_mlp`: an MoE expert MLP (ragged expert groups) whose SwiGLU
  runs on the two dual-axis MX operators and whose GEMMs read MXFP8 (:mod:`swiglu_ops.training.expert_mlp`).
- :class:`ExpertParallelMLP` / :func:`dispatch_tokens` / :func:`combine_tokens`: expert parallelism for it on
  plain ``torch.distributed`` (``all_to_all_single``; ``docs/distributed.md``), bitwise equal to one process
  in the order that :func:`single_process_order` gives.

The operators take ``backend=`` ("auto", "reference", "cpu", "triton") and ``out=``; every public function
works inside ``torch.compile`` (``docs/integration.md``).
"""

from __future__ import annotations

import sys as _sys

from . import integrations
from .numerics import mx
from .numerics.mx import FLOAT4_E1M2FN_X2 as float4_e1m2fn_x2
from .ops import custom_ops  # noqa: F401  (registers torch.ops.swiglu_ops.*)
from .ops.api import (
    available_backends,
    clipped_swiglu_grad,
    mx_dequantize,
    swiglu_backward_mx_quant_dual_axis,
    swiglu_group_grad,
    swiglu_mx_quant_dual_axis,
)
from .ops.groups import counts_to_ends, ends_to_counts
from .ops.validate import GroupConventionWarning
from .training import layouts
from .training.expert_parallel import ExpertParallelMLP, combine_tokens, dispatch_tokens, single_process_order
from .training.nn import (
    ClampedSwiGLU,
    ClippedSwiGLU,
    MXFP8ExpertMLP,
    MXGradient,
    clamped_swiglu,
    clipped_swiglu,
    mxfp8_expert_mlp,
    swiglu_mx_backward,
)

__version__ = "0.1.0"

# The documented short module paths, importable as modules too (``import swiglu_ops.layouts``, ``from
# swiglu_ops.mx import dst_name``), not only as attributes.
_sys.modules[f"{__name__}.layouts"] = layouts
_sys.modules[f"{__name__}.mx"] = mx


__all__ = [
    "swiglu_group_grad",
    "swiglu_backward_mx_quant_dual_axis",
    "clipped_swiglu",
    "clipped_swiglu_grad",
    "swiglu_mx_quant_dual_axis",
    "float4_e1m2fn_x2",
    "mx_dequantize",
    "available_backends",
    "counts_to_ends",
    "ends_to_counts",
    "GroupConventionWarning",
    "layouts",
    "mx",
    "integrations",
    "ClampedSwiGLU",
    "clamped_swiglu",
    "ClippedSwiGLU",
    "swiglu_mx_backward",
    "MXGradient",
    "MXFP8ExpertMLP",
    "mxfp8_expert_mlp",
    "ExpertParallelMLP",
    "dispatch_tokens",
    "combine_tokens",
    "single_process_order",
    "__version__",
]
