"""swiglu_ops: Ascend's fused SwiGLU-backward MoE operators for PyTorch on CPU and NVIDIA GPUs.

- :func:`swiglu_group_grad`: clamped SwiGLU backward with a per-token routing weight, a row mask from
  ``group_index`` (counts) and the routing-weight gradient (CANN ``SwigluGroupGrad``).
- :func:`swiglu_backward_mx_quant_dual_axis`: SwiGLU backward fused with dual-axis MX (FP8 + E8M0) block
  quantisation, token-axis blocks restarting at every expert group (CANN
  ``SwigluBackwardMxQuantWithDualAxis``).
- :func:`mx_dequantize`: the inverse of the quantisation.

Both operators take ``backend=`` ("auto", "reference", "cpu", "triton") and ``out=``.
"""

from __future__ import annotations

from . import _api, layouts, torch_ops  # noqa: F401  (torch_ops registers torch.ops.swiglu_ops.*)
from ._api import available_backends, swiglu_backward_mx_quant_dual_axis, swiglu_group_grad
from .mx import mx_dequantize
from .nn import ClampedSwiGLU, MXGradient, clamped_swiglu, swiglu_mx_backward

__version__ = "0.1.0"


__all__ = [
    "swiglu_group_grad",
    "swiglu_backward_mx_quant_dual_axis",
    "mx_dequantize",
    "available_backends",
    "layouts",
    "ClampedSwiGLU",
    "clamped_swiglu",
    "swiglu_mx_backward",
    "MXGradient",
    "__version__",
]
