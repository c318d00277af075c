"""Hugging Face ``transformers`` (5.x) experts implementations on the fused kernels, chosen by name.

``import swiglu_ops.integrations.hf`` registers two implementations in transformers' experts registry
(``transformers.integrations.moe.ExpertsInterface``, whose instance ``ALL_EXPERTS_FUNCTIONS`` every
``@use_experts_implementation`` expert class dispatches through):

- ``"swiglu_ops"``: bf16 / fp16 / fp32. Hugging Face's ``grouped_mm`` path (tokens sorted by expert, grouped
  GEMMs, linear biases, routing weights, unsorting: the same ops in the same order) with the gated
  activation replaced by the fused operator :func:`swiglu_ops.clipped_swiglu`, forward and backward each one
  fused pass in fp32 rounded once (kernels ``ClippedSwiglu`` / ``ClippedSwigluGrad``):

  * GPT-OSS (``GptOssExperts``: interleaved gate/up, ``alpha``, ``limit``, ``+1``):
    ``clipped_swiglu(h, alpha=alpha, limit=limit, bias=1.0, interleaved=True)``;
  * plain SwiGLU (``silu(gate) * up``, Qwen3-MoE, Mixtral, ...):
    ``clipped_swiglu(h, alpha=1.0, limit=inf, bias=0.0, interleaved=False)``, which is exactly
    ``silu(gate) * up`` (no clamp, ``A / (exp(-A) + 1) * B``).

- ``"swiglu_ops_mxfp8"``: bf16 only. The expert MLP is :func:`swiglu_ops.mxfp8_expert_mlp`: forward
  activation quantised by the fused ``swiglu_mx_quant_dual_axis``, backward SwiGLU gradient by the fused
  ``swiglu_backward_mx_quant_dual_axis``, GEMMs on MXFP8 operands (emulated on CPU and on GPUs without MX
  GEMMs). GPT-OSS passes its clipped SwiGLU and its linear biases (``b1`` / ``b2``); plain SwiGLU the
  default activation. Routing, weighting and unsorting are as above. Needs ``2 * intermediate % 64 == 0``
  and ``hidden % 8 == 0``.

Usage::

    import swiglu_ops.integrations.hf  # registers both names
    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="swiglu_ops")
    model.set_experts_implementation("swiglu_ops_mxfp8")  # and back: "grouped_mm", "eager", ...

Which activation a model computes is read from the module (``GptOssExperts``' ``alpha`` / ``limit``, or
MiniMax-M3's ``swiglu_alpha`` / ``swiglu_limit``; a ``limit`` or ``swiglu_limit`` alone, DeepSeek-V4's
and HY-V4's ``silu(min(gate, L)) * clip(up, -L, L)``, which is ``clipped_swiglu`` with alpha 1 and bias 0;
``is_concatenated``) and then **checked**: on its
first call (and after its parameters, ``act_fn``'s class or ``_apply_gate`` change) each expert module
runs its class's own ``_apply_gate`` on an fp32 probe (values on both sides of the clamp, and magnitudes up
to 2**34, so that a bound of the model's own is seen) and compares the fused operator's result with it;
another activation (e.g. ``hidden_act="gelu"``) is
refused with a ``NotImplementedError``, as are experts without a gate, expert parallelism and, for the
MXFP8 path, dtypes other than bf16 and sizes the MX blocks do not divide. The fused kernels' backend is
:data:`BACKEND` (``"auto"``), or per module the attribute ``_swiglu_ops_backend`` (which
:func:`swiglu_ops.integrations.patch_gpt_oss` also sets).

Only the public ``swiglu_ops`` API is used here; transformers is imported when this module is.
"""

from __future__ import annotations

import math

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

from ..training.expert_mlp import TORCH_VERSION, check_bf16, check_sizes, mxfp8_expert_mlp
from ..training.nn import clipped_swiglu

__all__ = [
    "IMPLEMENTATION",
    "MXFP8_IMPLEMENTATION",
    "BACKEND",
    "swiglu_ops_experts_forward",
    "mxfp8_experts_forward",
    "register",
]

#: The names registered in transformers' experts registry.
IMPLEMENTATION = "swiglu_ops"
MXFP8_IMPLEMENTATION = "swiglu_ops_mxfp8"

#: Default backend of the fused kernels ("auto", "reference", "cpu", "triton").
BACKEND = "auto"

_GLU = "_swiglu_ops_glu"  # per module: the checked activation parameters (cached after the first call)
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ------------------------------------------------------------------------------------ the activation


def _glu_params(module: torch.nn.Module) -> dict:
    """``clipped_swiglu`` keyword arguments for the module's gated activation, read from the module at every
    call and checked on a probe against the module class's own ``_apply_gate`` whenever they differ from
    the last checked ones (kept on the module)."""
    name = type(module).__name__
    if not getattr(module, "has_gate", True):
        raise NotImplementedError(
            f"{name} has no gate (an up projection and an activation): the swiglu_ops experts "
            "implementations compute gated SwiGLU experts only"
        )
    if getattr(module, "_is_expert_parallel", False):
        raise NotImplementedError(
            f"{name} runs expert parallel (EP sentinel tokens): not supported by the swiglu_ops experts "
            "implementations yet; use 'grouped_mm'"
        )
    interleaved = not getattr(module, "is_concatenated", True)
    bound = next((v for v in (getattr(module, n, None) for n in ("limit", "swiglu_limit")) if _real(v)), None)
    alpha = next(
        (v for v in (getattr(module, n, None) for n in ("alpha", "swiglu_alpha")) if _number(v)), None
    )
    # GPT-OSS (alpha, limit) and MiniMax-M3 (swiglu_alpha, swiglu_limit): (clip(up) + 1) * glu
    if alpha is not None and bound is not None:
        params = dict(alpha=float(alpha), limit=float(bound), bias=1.0, interleaved=interleaved)
    elif bound is not None:  # silu(min(gate, L)) * clip(up, -L, L): DeepSeek-V4 (limit), HY-V4 (swiglu_limit)
        params = dict(alpha=1.0, limit=float(bound), bias=0.0, interleaved=interleaved)
    else:  # silu(gate) * up
        params = dict(alpha=1.0, limit=math.inf, bias=0.0, interleaved=interleaved)
    # checked again when the parameters, the activation's class or the class's _apply_gate change
    key = (params, type(getattr(module, "act_fn", None)), type(module)._apply_gate, _instance_gate(module))
    if module.__dict__.get(_GLU) != key and _check_activation(module, params):
        module.__dict__[_GLU] = key
    return params


def _instance_gate(module: torch.nn.Module):
    """An ``_apply_gate`` set on the instance (a user's override, which transformers' own implementations
    call), or None; :func:`swiglu_ops.patch_gpt_oss`'s fused one stands for its class's (checked against it
    when set)."""
    from .gpt_oss import _FusedApplyGate

    own = module.__dict__.get("_apply_gate")
    return None if own is None or isinstance(own, _FusedApplyGate) else own


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _real(value) -> bool:  # a bound: a positive number (inf included)
    return _number(value) and value > 0


def _check_activation(module: torch.nn.Module, params: dict) -> bool:
    """The module's ``_apply_gate`` (an override set on the instance, which transformers' implementations
    would run, else its class's) on an fp32 probe must equal ``clipped_swiglu`` with ``params`` (a few fp32
    ulp apart: clipped_swiglu rounds once). False: not checked (no data)."""
    weight = next((p for p in module.parameters()), None)
    device = weight.device if weight is not None else torch.device("cpu")
    if device.type == "meta":  # no data (e.g. built under init_empty_weights): checked on a later call
        return False
    reach = params["limit"] * 1.5 if math.isfinite(params["limit"]) else 12.0
    near = torch.linspace(-reach, reach, 96, dtype=torch.float32, device="cpu").reshape(3, 32)
    # and magnitudes up to 2**34, so that a clamp anywhere below them (a model's own bound on gate or up,
    # e.g. DeepSeek-V4's swiglu_limit without GPT-OSS's alpha) is seen, not only one inside [-12, 12]
    far = torch.tensor(
        [s * 2.0**k for k in range(4, 36, 2) for s in (1.0, -1.0)], dtype=torch.float32, device="cpu"
    )
    probe = torch.cat([near, far.reshape(1, 32)])
    probe = probe[:, torch.randperm(32, generator=torch.Generator().manual_seed(0), device="cpu")].to(device)
    try:
        with torch.no_grad():
            own = _instance_gate(module)
            expected = own(probe) if own is not None else type(module)._apply_gate(module, probe)
            got = clipped_swiglu(probe, **params, backend="reference")
        same = got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    except Exception as exc:  # an activation that does not even run on the probe
        raise NotImplementedError(
            f"{type(module).__name__}'s gated activation could not be checked on a probe ({exc})"
        ) from exc
    if not same:
        kind = (
            "GPT-OSS clipped SwiGLU" if params["bias"]
            else "SwiGLU silu(gate) * up" if math.isinf(params["limit"])
            else f"clamped SwiGLU silu(min(gate, {params['limit']:g})) * clip(up, +-{params['limit']:g})"
        )  # fmt: skip
        layout = "interleaved" if params["interleaved"] else "concatenated [gate | up]"
        act = getattr(module, "act_fn", None)
        raise NotImplementedError(
            f"{type(module).__name__}'s gated activation is not the {kind} ({layout}) that the swiglu_ops "
            f"experts implementations compute"
            + (f" (act_fn: {type(act).__name__}; only SiLU is supported)" if act is not None else "")
            + "; use another experts_implementation (e.g. 'grouped_mm')"
        )
    return True


def _backend(module: torch.nn.Module) -> str:
    return getattr(module, "_swiglu_ops_backend", BACKEND)


# -------------------------------------------------------------------------------------- GEMMs, routing


_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
_CPU_GROUPED_MM = _GROUPED_MM is not None and TORCH_VERSION >= (2, 9)  # no CPU kernel before 2.9
_CPU_UNALIGNED_OK = TORCH_VERSION > (2, 10)  # CPU kernel takes operands not 16-byte aligned


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``a [S, K]`` rows of group g times ``b[g]`` (``b [E, K, N]``), ``offs`` int32 group ends: the GEMM
    transformers' ``grouped_mm`` path runs, chosen by its rules: ``torch.nn.functional.grouped_mm`` (else
    ``torch._grouped_mm``), and transformers' own custom op ``transformers::grouped_mm_fallback`` (a
    per-expert loop, opaque to torch.compile, with autograd) where that kernel cannot run: no CPU kernel
    (torch < 2.9), CPU operands not 16-byte aligned (torch <= 2.10), or non-bf16 operands while compiling
    (the kernel's fake implementation takes bf16 only)."""
    a = a.to(b.dtype)
    usable = _GROUPED_MM is not None and not (torch.compiler.is_compiling() and b.dtype != torch.bfloat16)
    if usable and b.device.type == "cpu":
        aligned = _CPU_UNALIGNED_OK or (a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)
        usable = _CPU_GROUPED_MM and aligned
    if usable:
        return _GROUPED_MM(a, b, offs=offs)
    return torch.ops.transformers.grouped_mm_fallback(a, b, offs=offs)


def _weights(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W1 [E, d, 2I], W2 [E, I, d])`` as views of the module's parameters."""
    w1, w2 = module.gate_up_proj, module.down_proj
    if not getattr(module, "is_transposed", False):  # stored [E, out, in]
        w1, w2 = w1.transpose(-2, -1), w2.transpose(-2, -1)
    return w1, w2


def _biases(module: torch.nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if not getattr(module, "has_bias", False):
        return None, None
    return module.gate_up_proj_bias, module.down_proj_bias


def _sort_by_expert(module, hidden_states, top_k_index, top_k_weights):
    """transformers' ``grouped_mm`` routing: ``(x sorted by expert, routing weights in that order, the sorted
    expert ids, the permutation, int32 cumulative ends per expert)``."""
    num_top_k = top_k_index.size(-1)
    expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))
    x_g = hidden_states[perm // num_top_k]
    weights_g = top_k_weights.reshape(-1)[perm]
    # histc as transformers: deterministic, and no bincount (CUDA graphs); CPU's histc needs floats
    ids = expert_ids_g.float() if hidden_states.device.type in ("cpu", "mps") else expert_ids_g.int()
    counts = torch.histc(ids, bins=module.num_experts, min=0, max=module.num_experts - 1)
    ends = torch.cumsum(counts, dim=0, dtype=torch.int32)
    return x_g, weights_g, expert_ids_g, perm, ends


def _finish(module, out_g, weights_g, perm, hidden_states, num_top_k):
    """Post-expert norm, routing weights, original order, sum over the top-k (transformers' order of ops)."""
    if getattr(module, "has_post_expert_norm", False):
        out_g = module.post_expert_norm(out_g)
    weighted = out_g * weights_g.unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=perm.device)
    weighted = weighted[inv_perm]
    num_tokens, hidden = hidden_states.shape
    return weighted.view(num_tokens, num_top_k, hidden).sum(dim=1).to(hidden_states.dtype)


# ------------------------------------------------------------------------------ the two implementations


def swiglu_ops_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The ``"swiglu_ops"`` experts implementation (module docstring): transformers' ``grouped_mm`` path
    with the gated activation on the fused ``clipped_swiglu`` (forward and backward)."""
    glu = _glu_params(self)
    if hidden_states.dtype not in _FLOAT_DTYPES:
        raise NotImplementedError(
            f"experts_implementation='swiglu_ops' computes bf16, fp16 or fp32, got {hidden_states.dtype}"
        )
    routed = _sort_by_expert(self, hidden_states, top_k_index, top_k_weights)
    x_g, weights_g, expert_ids_g, perm, ends = routed
    w1, w2 = _weights(self)
    b1, b2 = _biases(self)
    h = _grouped_mm(x_g, w1, ends)
    if b1 is not None:
        h = h + b1[expert_ids_g]
    act = clipped_swiglu(h, **glu, backend=_backend(self))
    out = _grouped_mm(act, w2, ends)
    if b2 is not None:
        out = out + b2[expert_ids_g]
    return _finish(self, out, weights_g, perm, hidden_states, top_k_index.size(-1))


def mxfp8_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The ``"swiglu_ops_mxfp8"`` experts implementation (module docstring): the expert MLP on
    :func:`swiglu_ops.mxfp8_expert_mlp` (both fused dual-axis MX operators, MXFP8 GEMMs)."""
    glu = _glu_params(self)
    w1, w2 = _weights(self)
    b1, b2 = _biases(self)
    tensors = dict(
        hidden_states=hidden_states, gate_up_proj=w1, down_proj=w2, gate_up_proj_bias=b1, down_proj_bias=b2
    )
    try:
        check_bf16(**{n: t for n, t in tensors.items() if t is not None})
    except TypeError as exc:
        raise NotImplementedError(
            f"experts_implementation='swiglu_ops_mxfp8' needs a bf16 model ({exc}); load it with "
            "dtype=torch.bfloat16, or use 'swiglu_ops' for fp32/fp16"
        ) from exc
    try:
        check_sizes(w1.shape[-1], w1.shape[-2])
    except ValueError as exc:
        raise NotImplementedError(
            f"experts_implementation='swiglu_ops_mxfp8' needs sizes the MX blocks divide (hidden: the "
            f"expert intermediate size, d_model: the model's hidden size): {exc}"
        ) from exc
    x_g, weights_g, _, perm, ends = _sort_by_expert(self, hidden_states, top_k_index, top_k_weights)
    # a clipped SwiGLU (GPT-OSS's, or a bound alone: DeepSeek-V4, HY-V4): its checked parameters as they
    # are; else the operators' plain SwiGLU
    clipped = glu["bias"] or math.isfinite(glu["limit"])
    act = glu if clipped else dict(interleaved=glu["interleaved"])
    out = mxfp8_expert_mlp(x_g, w1, w2, ends, **act, b1=b1, b2=b2, backend=_backend(self))
    return _finish(self, out, weights_g, perm, hidden_states, top_k_index.size(-1))


def register() -> None:
    """Register both implementations in transformers' experts registry (done on import; idempotent)."""
    ExpertsInterface.register(IMPLEMENTATION, swiglu_ops_experts_forward)
    ExpertsInterface.register(MXFP8_IMPLEMENTATION, mxfp8_experts_forward)
    assert IMPLEMENTATION in ALL_EXPERTS_FUNCTIONS and MXFP8_IMPLEMENTATION in ALL_EXPERTS_FUNCTIONS


register()
