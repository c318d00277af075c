"""Integrations with the libraries MoE models are trained in, each an optional extra imported lazily.

- :mod:`swiglu_ops.integrations.gpt_oss`: :func:`patch_gpt_oss` puts the fused clipped SwiGLU into a Hugging
  Face GPT-OSS model (``pip install "swiglu-ops[hf]"``).
- :mod:`swiglu_ops.integrations.torchtitan`: ``FusedGroupedExperts`` and ``FusedExpertsConverter`` run
  torchtitan's routed experts on :func:`swiglu_ops.mxfp8_expert_mlp` (``pip install
  "swiglu-ops[torchtitan]"``); import that module yourself (it imports torchtitan).

Nothing here imports an optional dependency at import time: each integration imports its library when it is
used.
"""

from __future__ import annotations

from .gpt_oss import is_patched, patch_gpt_oss

__all__ = ["patch_gpt_oss", "is_patched"]
