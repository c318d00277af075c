"""torchtitan: :class:`FusedGroupedExperts`, a drop-in for torchtitan's routed-expert ``GroupedExperts`` whose
SwiGLU runs on swiglu_ops, and :class:`FusedExpertsConverter`, the model converter that swaps it into a model
config (optional dependency: ``pip install "swiglu-ops[torchtitan]"``; written against torchtitan 0.3.0).

torchtitan's ``GroupedExperts`` (``torchtitan/models/common/moe.py``) holds ``w1_EFD [E, F, D]`` (gate),
``w3_EFD [E, F, D]`` (up) and ``w2_EDF [E, D, F]`` (down) and computes, per expert, in bf16::

    h = silu(x @ w1^T) * (x @ w3^T)      # two grouped GEMMs, each rounded to bf16, then silu and * in bf16
    out = h @ w2^T

:class:`FusedGroupedExperts` keeps the same three parameters (same names, shapes, state-dict keys, param_init
and sharding config: checkpoints load either way) and computes the same function with
:func:`swiglu_ops.mxfp8_expert_mlp` on ``w13 = [w1^T | w3^T]`` (``[E, D, 2F]``, gate | up halves) and
``w2^T``:

- ``recipe="bf16"``: ``mxfp8_expert_mlp(..., quantize=False)``: one gate|up grouped GEMM, the SwiGLU and its
  gradient evaluated in fp32 and rounded once to bf16 (the stage 1 of the fused MX operators, without
  quantisation), bf16 GEMMs with fp32 accumulation. No MX kernel runs in this recipe; one rounding of the
  activation instead of torchtitan's three (measured error no larger than torchtitan's: docs/integration.md).
- ``recipe="mxfp8"``: ``mxfp8_expert_mlp(..., quantize=True)``: the forward activation is quantised by the
  fused :func:`swiglu_ops.swiglu_mx_quant_dual_axis` and the SwiGLU gradient by the fused
  :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis` (``backend=``: "auto", "cpu", "triton",
  "reference"), feeding the MXFP8 GEMMs of :mod:`swiglu_ops.training.expert_mlp` (``gemm=``).

Parallelism (as torchtitan's module): under expert parallelism the parameters are DTensors sharded on the
expert dim over the ``ep`` mesh and the token dispatcher hands this module the tokens of its local experts
with their counts; under tensor parallelism w1/w3 are sharded on F and w2 on its F dim, so each rank's SwiGLU
is exact on its own columns and the down projection gives partial sums that torchtitan reduces. The module
works on the local shards (``DTensor.to_local()``). An MXFP8 run needs whole 32-element blocks along F on
every shard (the MX operators need ``2F % 64 == 0``): a TP sharding that splits a block on any rank raises
ValueError on every rank (decided from the weights' global shape and placements, so that no rank is left
waiting in a collective), and so does a ``Partial`` weight (no whole values to compute on). An
unsharded F (and, in the bf16 recipe, any F per shard) that is not a multiple of 32 is zero-padded to one,
which is exact (a zero gate and up give a zero activation; zero rows of w2 add nothing) and for MXFP8 is the
MX rule of a short last block. D must be a multiple of 8 (as torchtitan's grouped GEMMs need). The token
counts must sum to the number of rows, as torchtitan's standard dispatchers give them (not the padded groups
of its ``TorchAOTokenDispatcher``).

The converter replaces ``GroupedExperts.Config`` itself, never a subclass (GPT-OSS's ``GptOssGroupedExperts``
has biases and a clipped SwiGLU of its own)::

    from swiglu_ops.integrations.torchtitan import FusedExpertsConverter
    model_spec = model_registry("debugmodel", converters=[FusedExpertsConverter.Config(recipe="mxfp8")])
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.tools.logging import logger

from ..training.expert_mlp import check_options, mxfp8_expert_mlp

__all__ = ["FusedGroupedExperts", "FusedExpertsConverter", "RECIPES"]

#: Values of ``recipe=``.
RECIPES = ("bf16", "mxfp8")

_MX_BLOCK = 32


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_sizes(t: torch.Tensor, dim: int) -> tuple[int, ...]:
    """Every rank's local size of ``t``'s dim ``dim``, from a DTensor's global shape and placements (as
    ``torch.chunk`` splits), so the same on every rank; ``(size,)`` for a plain tensor. A ``Partial``
    placement holds no whole value to compute on: ValueError."""
    sizes = [t.shape[dim]]
    for mesh_dim, placement in enumerate(t.placements if isinstance(t, DTensor) else ()):
        if placement.is_partial():
            raise ValueError(
                f"expert weights must be Replicate or Shard, not Partial ({t.placements}): the fused experts "
                "compute on each rank's local values"
            )
        if placement.is_shard() and placement.dim % t.dim() == dim % t.dim():
            n = t.device_mesh.size(mesh_dim)
            sizes = [min(-(-size // n), max(size - i * -(-size // n), 0)) for size in sizes for i in range(n)]
    return tuple(sizes)


def _check_config(config) -> None:
    """A config's ``recipe``, ``backend`` and ``gemm``, checked where it is built (not at the first
    forward)."""
    if config.recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {config.recipe!r}")
    check_options(config.backend, config.gemm)


class FusedGroupedExperts(GroupedExperts):
    """torchtitan's ``GroupedExperts`` (same parameters ``w1_EFD``, ``w2_EDF``, ``w3_EFD``) on
    :func:`swiglu_ops.mxfp8_expert_mlp`; ``recipe`` "bf16" or "mxfp8" (module docstring).

    ``forward(x_RD, num_tokens_per_expert_E)``: the tokens sorted by (local) expert, ``R`` of them, and each
    local expert's token count (summing to ``R``, as torchtitan's dispatchers give them); returns ``[R, D]``
    in ``x_RD``'s dtype (computed in bf16, as torchtitan's)."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        recipe: Literal["bf16", "mxfp8"] = "bf16"
        backend: str = "auto"
        """Backend of the fused MX operators ("auto", "cpu", "triton", "reference")."""
        gemm: str = "auto"
        """Where the MXFP8 GEMMs run (``swiglu_ops.training.expert_mlp``: "auto", "emulated", ...)."""

    def __init__(self, config: Config):
        super().__init__(config)
        _check_config(config)
        self.dim, self.hidden_dim = config.dim, config.hidden_dim
        self.recipe, self.backend, self.gemm = config.recipe, config.backend, config.gemm

    def _local_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # F per shard from the global shapes and placements, the same on every rank: a sharding that some
        # rank cannot compute fails on all of them (a rank-local check would leave the others waiting in
        # the next collective)
        f_sizes = {_shard_sizes(self.w1_EFD, 1), _shard_sizes(self.w3_EFD, 1), _shard_sizes(self.w2_EDF, 2)}
        w1, w2, w3 = _local(self.w1_EFD), _local(self.w2_EDF), _local(self.w3_EFD)
        e, f, d = w1.shape
        if tuple(w3.shape) != (e, f, d) or tuple(w2.shape) != (e, d, f) or len(f_sizes) != 1:
            raise ValueError(
                f"local expert weights disagree: w1_EFD {tuple(w1.shape)}, w3_EFD {tuple(w3.shape)}, "
                f"w2_EDF {tuple(w2.shape)} (expected w2_EDF [{e}, {d}, {f}], F sharded alike)"
            )
        (sizes,) = f_sizes  # plain tensors of a shard (f != F): only this rank's size is known
        sharded = len(sizes) > 1 or f != self.hidden_dim
        if self.recipe == "mxfp8" and sharded and any(size % _MX_BLOCK for size in sizes):
            raise ValueError(
                f"recipe='mxfp8' with the hidden dimension F = {self.hidden_dim} sharded into F = "
                f"{list(sizes) if len(sizes) > 1 else f} per shard: a shard that is not a multiple of "
                f"{_MX_BLOCK} would split a {_MX_BLOCK}-element MX block (the fused MX operators need 2F "
                f"per shard to be a multiple of {2 * _MX_BLOCK}); use a tensor-parallel degree that leaves "
                f"F per shard a multiple of {_MX_BLOCK}, or recipe='bf16'"
            )
        return w1, w2, w3

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = self._local_weights()
        e, f, d = w1.shape
        if num_tokens_per_expert_E.numel() != e:
            raise ValueError(
                f"num_tokens_per_expert_E has {num_tokens_per_expert_E.numel()} counts for {e} local experts"
            )
        w1, w2, w3 = w1.bfloat16(), w2.bfloat16(), w3.bfloat16()
        pf = -f % _MX_BLOCK if f else _MX_BLOCK  # (an empty shard, F < TP degree: one zero block)
        if pf:  # zero padding to whole MX blocks: exact (module docstring)
            w1, w3, w2 = F.pad(w1, (0, 0, 0, pf)), F.pad(w3, (0, 0, 0, pf)), F.pad(w2, (0, pf))
        # gate | up as [e, D, 2F] and the down projection as [e, F, D]: transposed views of [e, 2F, D] and
        # [e, D, F], the column-major B operands torchtitan's own grouped GEMMs read
        w13 = torch.cat([w1, w3], dim=1).transpose(-2, -1)
        down = w2.transpose(-2, -1)
        ends = torch.cumsum(num_tokens_per_expert_E, dim=0).to(torch.int64)
        out = mxfp8_expert_mlp(
            x_RD.bfloat16(),
            w13,
            down,
            ends,
            quantize=self.recipe == "mxfp8",
            backend=self.backend,
            gemm=self.gemm,
        )
        return out.type_as(x_RD)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, dim={self.dim}, hidden_dim={self.hidden_dim}, "
            f"recipe={self.recipe!r}, backend={self.backend!r}, gemm={self.gemm!r}"
        )


class FusedExpertsConverter(QuantizationConverter):
    """Replaces every ``GroupedExperts.Config`` of a torchtitan model config by
    ``FusedGroupedExperts.Config`` (same fields, ``param_init`` and ``sharding_config`` kept) with the
    given ``recipe`` ("bf16" or "mxfp8"), ``backend`` and ``gemm``.

    A quantization converter for torchtitan's ordering check (before LoRA). Use it in ``model_registry(...,
    converters=[FusedExpertsConverter.Config(recipe="mxfp8")])`` or ``FusedExpertsConverter.Config(
    recipe="bf16").build().convert(model_config)``. Converting twice is a no-op on already fused experts."""

    @dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        recipe: Literal["bf16", "mxfp8"] = "mxfp8"
        backend: str = "auto"
        gemm: str = "auto"

    def __init__(self, config: Config):
        _check_config(config)
        self.config = config

    def convert(self, model_config):
        converted = 0
        for _fqn, cfg, parent, attr in list(model_config.traverse(GroupedExperts.Config)):
            if type(cfg) is not GroupedExperts.Config:  # subclasses (GPT-OSS, already fused) stay
                continue
            new = FusedGroupedExperts.Config(
                **{fl.name: getattr(cfg, fl.name) for fl in fields(cfg)},
                recipe=self.config.recipe,
                backend=self.config.backend,
                gemm=self.config.gemm,
            )
            if parent is None:
                model_config = new
            elif isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
            converted += 1
        self.converted = converted
        if converted == 0:  # a model whose experts are all subclasses (GPT-OSS's) or converted already
            logger.warning(
                "FusedExpertsConverter converted nothing: the model config has no plain GroupedExperts "
                "(subclasses such as GPT-OSS's GptOssGroupedExperts, and FusedGroupedExperts, stay as "
                "they are)"
            )
        logger.info(
            f"Converted {converted} GroupedExperts to swiglu_ops FusedGroupedExperts "
            f"(recipe={self.config.recipe!r}, backend={self.config.backend!r}, gemm={self.config.gemm!r})"
        )
        return model_config
