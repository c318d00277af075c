"""Integrations with the libraries MoE models are trained in, each an optional extra imported lazily.

- :mod:`swiglu_ops.integrations.gpt_oss`: :func:`patch_gpt_oss` puts the fused clipped SwiGLU into a Hugging
  Face GPT-OSS model (``pip install "swiglu-ops[hf]"``).
- :mod:`swiglu_ops.integrations.torchtitan`: ``FusedGroupedExperts`` and ``FusedExpertsConverter`` run
  torchtitan's routed experts on :func:`swiglu_ops.mxfp8_expert_mlp` (``pip install
  "swiglu-ops[torchtitan]"``); import that module yourself (it imports torchtitan).
- :mod:`swiglu_ops.integrations.hf`: importing it registers the transformers experts implementations
  ``"swiglu_ops"`` and ``"swiglu_ops_mxfp8"`` (``from_pretrained(..., experts_implementation="swiglu_ops")``,
  ``model.set_experts_implementation(...)``) for GPT-OSS and plain-SwiGLU MoE models such as Qwen3-MoE.
  It imports transformers, so it is loaded on first access (``swiglu_ops.integrations.hf`` or
  ``import swiglu_ops.integrations.hf``), never by ``import swiglu_ops``.
- :mod:`swiglu_ops.integrations.torchao`: the dual-axis MX outputs as torchao ``MXTensor`` s sharing the
  data's storage (``rowwise_mxtensor``, ``tokenwise_mxtensor``, ``tokenwise_mxtensors``; ``pip install
  "swiglu-ops[torchao]"``); loaded on first access like ``hf``.

Nothing here imports an optional dependency at import time: each integration imports its library when it is
used.
"""

from __future__ import annotations

import importlib

from .gpt_oss import is_patched, patch_gpt_oss, unpatch_gpt_oss

__all__ = [
    "patch_gpt_oss",
    "unpatch_gpt_oss",
    "is_patched",
]  # not "hf"/"torchao": a star import must not need them

_LAZY = ("hf", "torchao")


def __getattr__(name: str):
    """``swiglu_ops.integrations.hf`` / ``.torchao``: imported (with their library) on first access."""
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
