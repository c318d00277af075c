"""Integrations with model libraries: :func:`patch_gpt_oss` puts the fused clipped SwiGLU into a Hugging Face
``transformers`` GPT-OSS model (optional dependency: ``pip install "swiglu-ops[hf]"``).

How Hugging Face computes the GPT-OSS expert activation (``transformers/models/gpt_oss/modeling_gpt_oss.py``,
``GptOssExperts._apply_gate``, transformers 5.x)::

    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=self.limit)
    up = up.clamp(min=-self.limit, max=self.limit)
    glu = gate * torch.sigmoid(gate * self.alpha)
    return (up + 1) * glu

with ``self.alpha = config.swiglu_alpha`` (1.702) and ``self.limit = config.swiglu_limit`` (7.0). That is
``clipped_swiglu(gate_up, alpha=alpha, limit=limit, bias=1.0, interleaved=True, clamp_mode=0)``
(clipped_swiglu.md section 9: the same function; CANN's fp32 evaluation rounds once instead of once per op).
Every expert code path of ``GptOssExperts`` calls ``self._apply_gate(gate_up)`` on the ``[tokens, 2I]``
output of the gate/up projection: the original per-expert loop ("eager") and the ``batched_mm`` and
``grouped_mm`` paths of ``transformers.integrations.moe`` (all three run on CPU; the CUDA-only ones,
``deepgemm`` and ``sonicmoe``, call it too). The patch replaces exactly that method, per module instance, by
the fused operator with its fused backward; routing, projections and weights stay Hugging Face's.
"""

from __future__ import annotations

import torch

from ..ops.registry import check_backend_name
from ..training.nn import ClippedSwigluFunction

__all__ = ["patch_gpt_oss", "unpatch_gpt_oss", "is_patched"]

#: GPT-OSS adds 1 to the clipped up projection (``(up + 1) * glu``); it is not a config attribute.
GPT_OSS_BIAS = 1.0
_MARK = "_swiglu_ops_backend"
_ABSENT = object()


def _experts_class():
    try:
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            'patch_gpt_oss needs Hugging Face transformers with GPT-OSS support: pip install "swiglu-ops[hf]"'
        ) from exc
    if not callable(getattr(GptOssExperts, "_apply_gate", None)):
        raise NotImplementedError(
            "this transformers version computes the GPT-OSS activation inside GptOssExperts.forward (no "
            "_apply_gate method to replace); patch_gpt_oss supports transformers versions with "
            "GptOssExperts._apply_gate (5.x)"
        )
    return GptOssExperts


class _FusedApplyGate:
    """``GptOssExperts._apply_gate``, fused, for one module (set on the instance, read at call time: its
    ``alpha``, ``limit`` and backend): ``[..., 2I]`` interleaved gate/up -> ``[..., I]``. An object rather
    than a bound method so that a patched model pickles (``torch.save(model)``): pickle stores a bound
    method as a name to look up on the instance, which the class does not have, so loading failed."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        # what the instance held before the patch (an override of _apply_gate, a backend of the swiglu_ops
        # experts implementations), put back by unpatch_gpt_oss
        self.saved = {name: module.__dict__.get(name, _ABSENT) for name in ("_apply_gate", _MARK)}

    def __call__(self, gate_up: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        m = self.module
        backend = getattr(m, _MARK) if backend is None else backend
        return ClippedSwigluFunction.apply(
            gate_up, None, -1, m.alpha, m.limit, GPT_OSS_BIAS, True, 0, backend
        )


def _check_same_function(experts, backend: str) -> None:
    """The patch assumes that the module's ``_apply_gate`` (the one it runs: its class's, Hugging Face's or a
    subclass's, or one set on the instance) is the GPT-OSS clipped SwiGLU (module docstring). A probe in
    fp32 (values on both sides of +-limit) catches a transformers version, a subclass or an override where
    it is not."""
    original = experts._apply_gate  # a bound method of the class, or the instance's own
    device = next((p.device for p in experts.parameters()), torch.device("cpu"))
    if device.type == "meta":  # parameters without data (init_empty_weights, FSDP2's meta init): the probe
        device, backend = torch.device("cpu"), "reference"  # reads none of them, so it runs on CPU
    limit = float(experts.limit)
    scale = limit if limit < 1e30 else 8.0
    probe = torch.linspace(-1.5, 1.5, 48, dtype=torch.float32, device=device).reshape(2, 24) * scale
    with torch.no_grad():
        expected = original(probe)
        got = _FusedApplyGate(experts)(probe, backend)
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
        raise RuntimeError(
            f"{type(experts).__qualname__}._apply_gate does not compute the GPT-OSS clipped SwiGLU "
            f"(interleaved gate/up, alpha={experts.alpha}, limit={experts.limit}, +1); nothing patched"
        )


def patch_gpt_oss(model: torch.nn.Module, *, backend: str = "auto") -> torch.nn.Module:
    """Make every ``GptOssExperts`` of a Hugging Face GPT-OSS model use the fused clipped SwiGLU.

    Replaces each expert module's ``_apply_gate`` (Hugging Face's activation, module docstring) by
    :class:`swiglu_ops.training.nn.ClippedSwigluFunction` with the module's own ``alpha`` and ``limit`` (read
    at call time), ``bias=1.0``, interleaved gate/up: forward ``clipped_swiglu`` and backward
    ``clipped_swiglu_grad``, each one fused pass computed in fp32 and rounded once to the activation dtype.
    Works for every expert implementation that calls ``_apply_gate`` (``eager``, ``batched_mm``,
    ``grouped_mm``), in training and inference. Weights, state dict and routing are untouched. Calling it
    again only updates the backend.

    Args:
        model: a ``GptOssForCausalLM``, ``GptOssModel`` or any module containing ``GptOssExperts``.
        backend: backend of the fused operators ("auto", "reference", "cpu", "triton").

    Returns:
        ``model`` itself, patched in place.

    Raises:
        ValueError: the model has no ``GptOssExperts`` module; its ``swiglu_limit`` is not > 0 (the
            operator's rule, from the probe); ``backend`` is not a backend's name.
        TypeError: ``backend`` is not a string; ``model`` is not a module.
        RuntimeError: a module computes another activation (its class's, the installed transformers'
            ``GptOssExperts`` or a subclass, or an ``_apply_gate`` set on the instance; checked on a probe).

    Every module is checked before any is changed: when it raises, nothing is patched.
    """
    _check_model(model)
    experts_class = _experts_class()
    check_backend_name(backend)
    experts = [m for m in model.modules() if isinstance(m, experts_class)]
    if not experts:
        raise ValueError(
            f"model must contain GptOssExperts modules (a GPT-OSS model), got {type(model).__name__}"
        )
    for module in experts:  # every module checked before any is changed: a refusal patches nothing
        if not is_patched(module):
            _check_same_function(module, backend)
    for module in experts:
        if not is_patched(module):
            module._apply_gate = _FusedApplyGate(module)
        setattr(module, _MARK, backend)
    return model


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def unpatch_gpt_oss(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`patch_gpt_oss`: every patched ``GptOssExperts`` of ``model`` computes the activation it
    ran before again (Hugging Face's, or an ``_apply_gate`` set on the instance; bit for bit the never-patched
    model), with the ``_swiglu_ops_backend`` it had (none, or the user's). Modules that are not patched are
    left alone. Returns ``model``."""
    _check_model(model)
    for module in model.modules():
        if is_patched(module):
            for name, value in module._apply_gate.saved.items():
                if value is _ABSENT:
                    module.__dict__.pop(name, None)
                else:
                    setattr(module, name, value)
    return model


def is_patched(module: torch.nn.Module) -> bool:
    """Whether ``module`` (a ``GptOssExperts``) runs the fused activation of :func:`patch_gpt_oss`."""
    return isinstance(module.__dict__.get("_apply_gate"), _FusedApplyGate)
