"""Expert parallelism for :class:`swiglu_ops.MXFP8ExpertMLP` on plain ``torch.distributed``.

The library adds no engine: each rank holds ``E / world`` of the ``E`` experts in an ordinary
:class:`~swiglu_ops.MXFP8ExpertMLP` (rank ``r`` owns experts ``r * E_local .. (r + 1) * E_local - 1``), and
two ``all_to_all_single`` exchanges move the tokens to the rank that owns their expert and the results back:

1. :func:`dispatch_tokens`: every rank exchanges its per-expert token counts (one ``all_to_all_single`` on
   the counts, then one host read: the splits of a token exchange are Python ints), then its tokens (one
   ``all_to_all_single``). The received rows are sorted by local expert, **without padding**: the local
   MLP runs on ragged groups whose ends are the cumulative received counts.
2. The rank's :class:`~swiglu_ops.MXFP8ExpertMLP` runs on those rows.
3. :func:`combine_tokens`: the results go back the same way (one ``all_to_all_single``) and come out in the
   caller's order.

:class:`ExpertParallelMLP` wraps the three steps in a module with :class:`~swiglu_ops.MXFP8ExpertMLP`'s
``forward(x, group_ends)``.

**Token order** (what makes the results bitwise those of one process): the tokens of expert ``e`` reach
its rank as rank 0's tokens of ``e`` (in rank 0's order), then rank 1's, and so on. One process that runs
all ``E`` experts on the ranks' tokens in that order (:func:`single_process_order` gives the
permutation) computes every output row, every input gradient row and every expert's weight gradient bit for
bit as the ranks do: each expert sees the same rows in the same order, and the exchanges only copy bits.
(Each expert's MXFP8 token blocks restart at its first token, so they are the same blocks too.)

**Autograd**: both exchanges are differentiable (one autograd Function each; the backward of a dispatch is
the combine of the gradients and vice versa, pure copies). The experts' weight gradients are those of the
*sum* of the ranks' losses: an expert receives the gradients of every rank's tokens. For the gradient of
the mean over ranks, divide each rank's loss by the world size, and all-reduce the gradients of the
replicated parameters (a router, say) with ``SUM``.

Tensors cross the collectives as ``uint8`` views of their bytes (any dtype, FP8 included: on torch 2.13 FP8
and E8M0 tensors cannot cross a gloo collective themselves). ``E % world == 0`` is required.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..ops.groups import counts_to_ends, ends_to_counts
from .expert_mlp import MXFP8ExpertMLP, check_expert_ends, check_local

__all__ = [
    "DispatchPlan",
    "dispatch_tokens",
    "combine_tokens",
    "ExpertParallelMLP",
    "single_process_order",
]


@dataclass(frozen=True)
class DispatchPlan:
    """How :func:`dispatch_tokens` moved the rows; :func:`combine_tokens` needs it to move them back.

    - ``send_splits[j]``: rows this rank sent to rank ``j`` (its tokens of rank ``j``'s experts).
    - ``recv_splits[j]``: rows this rank received from rank ``j``.
    - ``recv_counts``: ``[world, E_local]`` int64, tokens of each local expert received from each rank.
    - ``order``: int64 permutation of the received rows: ``received[order]`` is sorted by local expert
      (stable: within an expert, by source rank, then in the source's order).
    - ``local_ends``: ``[E_local]`` int64 cumulative row ends of the sorted rows (the local MLP's groups).
    """

    send_splits: list[int]
    recv_splits: list[int]
    recv_counts: torch.Tensor
    order: torch.Tensor
    local_ends: torch.Tensor
    group: dist.ProcessGroup | None = None


def _byte_rows(x: torch.Tensor) -> torch.Tensor:
    """The rows of ``x [T, ...]`` as ``uint8 [T, bytes per row]``: the collectives and permutations below
    work on bytes, so they copy every dtype bit for bit (FP8 and E8M0 included, which gloo and some CPU
    index kernels do not take on torch 2.13)."""
    # an empty tensor with stride 0 (e.g. the gradient of sum()) stays so in contiguous(): made afresh
    if x.numel() == 0:
        x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return x.contiguous().reshape(x.shape[0], math.prod(x.shape[1:])).view(torch.uint8)


def _from_byte_rows(b: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return b.view(like.dtype).reshape(b.shape[0], *like.shape[1:])


def _all_to_all_rows(b: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """``all_to_all_single`` of byte rows (``in_splits[j]`` rows to rank ``j``, ``out_splits[j]`` rows from
    rank ``j``)."""
    recv = b.new_empty(sum(out_splits), b.shape[1])
    dist.all_to_all_single(recv, b, out_splits, in_splits, group=group)
    return recv


def _dispatch(x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    received = _all_to_all_rows(_byte_rows(x), plan.recv_splits, plan.send_splits, plan.group)
    return _from_byte_rows(received.index_select(0, plan.order), x)


def _combine(y: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    b = _byte_rows(y)
    received = torch.empty_like(b).index_copy_(0, plan.order, b)  # back to the order they came in
    return _from_byte_rows(_all_to_all_rows(received, plan.send_splits, plan.recv_splits, plan.group), y)


class _Exchange(torch.autograd.Function):
    """Rows moved by ``there`` (:func:`_dispatch`: to their expert's rank, sorted by local expert;
    :func:`_combine`: back to the rank and position their token came from); the backward moves the gradient
    by ``back``, the other one. Copies only, so the gradients are bit-exact."""

    @staticmethod
    def forward(ctx, x, plan, there, back):
        ctx.plan, ctx.back = plan, back
        return there(x, plan)

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad, ctx.plan), None, None, None


def dispatch_tokens(
    x: torch.Tensor, group_ends: torch.Tensor, num_experts: int, group: dist.ProcessGroup | None = None
) -> tuple[torch.Tensor, torch.Tensor, DispatchPlan]:
    """Send every token to the rank that owns its expert; collective (every rank of ``group`` calls it).

    Args:
        x: ``[T, ...]`` this rank's tokens sorted by (global) expert; any dtype (cast it to the MLP's dtype
            first to send fewer bytes: :class:`ExpertParallelMLP` sends bf16).
        group_ends: ``[E]`` int64/int32 cumulative token ends of ``x``'s experts (empty experts allowed).
        num_experts: ``E``, a multiple of the group's size; rank ``r`` owns experts
            ``[r * E_local, (r + 1) * E_local)``, ``E_local = E / world``.
        group: the process group (default: the default group).

    Returns:
        ``(x_local, local_ends, plan)``: the received rows sorted by local expert (within an expert by source
        rank, then in the source's order; differentiable with respect to ``x``), their ``[E_local]`` int64
        cumulative ends, and the plan for :func:`combine_tokens`.

    Host synchronisation: two reads, this rank's counts (the send splits, checked before any collective)
    and the received counts (the receive splits); nothing else waits for the device.
    """
    check_local("x", x)  # before any collective: every rank raises, none waits
    world = dist.get_world_size(group)
    if isinstance(num_experts, bool) or not isinstance(num_experts, numbers.Integral):
        raise TypeError(f"num_experts must be an int, got {type(num_experts).__name__}")
    if num_experts < 1 or num_experts % world:
        raise ValueError(
            f"num_experts ({num_experts}) must be a positive multiple of the world size ({world})"
        )
    check_expert_ends(group_ends, num_experts)
    local = num_experts // world
    counts = ends_to_counts(group_ends.to(device=x.device, dtype=torch.int64)).view(world, local)
    host_counts = counts.tolist()  # the one host read of this rank's counts
    send_splits = [sum(row) for row in host_counts]
    negative = any(c < 0 for row in host_counts for c in row)
    if sum(send_splits) != x.shape[0] or negative:  # before any collective
        raise ValueError(f"group_ends must rise from 0 to x's {x.shape[0]} rows, got {group_ends.tolist()}")
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts.contiguous(), group=group)  # [source rank, local expert]
    recv_splits = recv_counts.sum(1).tolist()
    expert_of_row = (
        torch.arange(local, device=x.device)
        .repeat(world)
        .repeat_interleave(recv_counts.flatten(), output_size=sum(recv_splits))  # no second sync
    )
    order = torch.argsort(expert_of_row, stable=True)
    plan = DispatchPlan(
        send_splits, recv_splits, recv_counts, order, counts_to_ends(recv_counts.sum(0)), group
    )
    return _Exchange.apply(x, plan, _dispatch, _combine), plan.local_ends, plan


def combine_tokens(y_local: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """The inverse movement of :func:`dispatch_tokens`: ``y_local`` (rows in the dispatched order) goes back
    to the ranks and positions its tokens came from; collective. Returns ``[T, ...]`` in the order of the
    ``x`` given to :func:`dispatch_tokens` (sorted by expert); differentiable with respect to ``y_local``."""
    check_local("y_local", y_local)
    if y_local.shape[0] != plan.order.numel():
        raise ValueError(f"y_local has {y_local.shape[0]} rows, the plan dispatched {plan.order.numel()}")
    return _Exchange.apply(y_local, plan, _combine, _dispatch)


def single_process_order(counts: torch.Tensor) -> torch.Tensor:
    """The one-process equivalent of an expert-parallel step: ``counts [world, E]`` (tokens of each expert
    on each rank) -> the int64 permutation ``p`` such that ``torch.cat(xs)[p]`` (``xs``: the ranks' tokens,
    each sorted by expert) is sorted by expert and, within an expert, by rank: the order in which the
    expert's rank runs them. ``counts_to_ends(counts.sum(0))`` are its group ends. ``p`` also maps the
    one-process results back: row ``i`` of ``torch.cat(xs)`` is row ``p.argsort()[i]`` of them."""
    if not isinstance(counts, torch.Tensor) or counts.dtype not in (torch.int64, torch.int32):
        raise TypeError("counts must be an int64 or int32 tensor [world, E]")
    if counts.dim() != 2 or bool((counts < 0).any()):
        raise ValueError(f"counts must be [world, E] token counts (>= 0), got shape {tuple(counts.shape)}")
    counts = counts.to(torch.int64)
    world, experts = counts.shape
    # rows of cat(xs): (rank, expert) blocks
    rank_expert = torch.arange(world * experts, device=counts.device).view(world, experts)
    key = rank_expert.remainder(experts) * world + rank_expert.div(experts, rounding_mode="floor")
    key_of_row = key.flatten().repeat_interleave(counts.flatten())  # (expert, rank) rank of each row
    return torch.argsort(key_of_row, stable=True)


class ExpertParallelMLP(torch.nn.Module):
    """Expert-parallel :class:`~swiglu_ops.MXFP8ExpertMLP`: ``forward(x, group_ends)`` takes this rank's
    tokens sorted by global expert and their ``[E]`` cumulative ends, as the one-process module does, and
    returns ``[T, d]`` bf16 in the same order; the rank's ``experts`` (an :class:`~swiglu_ops.MXFP8ExpertMLP`
    with ``E / world`` experts, rank ``r`` holding experts ``r * E_local ..``) run on the tokens of all ranks.
    Collective: every rank of ``group`` calls ``forward`` (and the backward) together.

    ``ExpertParallelMLP.from_module(full, group)`` takes this rank's experts from a full module (a copy of
    its slice of the weights and its settings).
    """

    def __init__(self, experts: MXFP8ExpertMLP, num_experts: int, group: dist.ProcessGroup | None = None):
        super().__init__()
        world = dist.get_world_size(group)
        if num_experts != experts.w1.shape[0] * world:
            raise ValueError(
                f"num_experts ({num_experts}) must be the local experts ({experts.w1.shape[0]}) times the "
                f"world size ({world})"
            )
        self.experts, self.num_experts, self.group = experts, num_experts, group

    @classmethod
    def from_module(cls, full: MXFP8ExpertMLP, group: dist.ProcessGroup | None = None) -> ExpertParallelMLP:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        e, d, two_h = full.w1.shape
        if e % world:
            raise ValueError(f"the module's {e} experts must be a multiple of the world size ({world})")
        local = e // world
        experts = MXFP8ExpertMLP(
            local, d, two_h // 2, limit=full.limit, alpha=full.alpha, bias=full.bias,
            interleaved=full.interleaved, quantize=full.quantize, backend=full.backend, gemm=full.gemm,
            device=full.w1.device, dtype=full.w1.dtype,
        )  # fmt: skip
        with torch.no_grad():
            experts.w1.copy_(full.w1[rank * local : (rank + 1) * local])
            experts.w2.copy_(full.w2[rank * local : (rank + 1) * local])
        return cls(experts, e, group)

    def forward(self, x: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if torch.is_grad_enabled() and not x.requires_grad:
            # The dispatch's backward is a collective: every rank must record it, also one whose x needs no
            # gradient (e.g. a rank without tokens), or the others wait for it in backward()
            x = x.detach().requires_grad_()
        x_local, local_ends, plan = dispatch_tokens(x, group_ends, self.num_experts, self.group)
        return combine_tokens(self.experts(x_local, local_ends), plan)

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, world={dist.get_world_size(self.group)}"
