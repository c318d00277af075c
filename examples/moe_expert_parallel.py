"""Train a tiny MoE layer with expert parallelism on plain torch.distributed and check it against one process.

Each rank holds a replica of the router and E / world of the E experts (``swiglu_ops.ExpertParallelMLP``
around an ``MXFP8ExpertMLP``); every step it routes its own new batch of tokens (top-1), the tokens travel
to their experts' ranks and back with ``all_to_all_single``, and the router's gradients are all-reduced
(``SUM``; each rank's loss is divided by the world size, so all gradients are those of the mean over the
ranks). Then every rank replays the same steps as one process holding all experts (the ranks' batches
routed chunk by chunk, each expert's tokens in the order of ``swiglu_ops.single_process_order``) and checks
that the weights of its experts and the router are bit for bit the same; rank 0 prints the result.

Run (CPU, gloo; a few seconds)::

    torchrun --nproc-per-node 2 examples/moe_expert_parallel.py
    torchrun --nproc-per-node 2 examples/moe_expert_parallel.py --gpt-oss --bf16

``--gpt-oss``: GPT-OSS's clipped SwiGLU (limit 7, alpha 1.702, bias 1, interleaved); ``--bf16``: the bf16
baseline instead of MXFP8. The recipe: ``docs/distributed.md``.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import swiglu_ops

GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)


def batch(args, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tokens and targets at ``step`` (a teacher: a fixed random two-layer map)."""
    g = torch.Generator().manual_seed(10_000 + 100 * step + rank)
    x = torch.randn(args.tokens, args.dim, generator=g)
    teacher = torch.Generator().manual_seed(7)
    a = torch.randn(args.dim, args.dim, generator=teacher) / args.dim**0.5
    b = torch.randn(args.dim, args.dim, generator=teacher) / args.dim**0.5
    return x, torch.tanh(x @ a) @ b


def route(router: torch.Tensor, x: torch.Tensor, experts: int):
    """Top-1 routing: the order that sorts the tokens by expert, tokens per expert, routing weights."""
    probs = torch.softmax(x @ router, dim=-1)
    weight, expert = probs.max(dim=-1)
    return torch.argsort(expert, stable=True), torch.bincount(expert, minlength=experts), weight


def unsort(order: torch.Tensor, y_sorted: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The tokens' outputs, weighted by their routing weight, back in the tokens' order."""
    y = y_sorted.float() * weight[order].unsqueeze(1)
    return torch.empty_like(y).index_copy(0, order, y)


def train_expert_parallel(args, router, moe, rank, world) -> list[float]:
    optimizer = torch.optim.AdamW([router, *moe.parameters()], lr=args.lr, foreach=False)
    losses = []
    for step in range(args.steps):
        x, target = batch(args, rank, step)
        order, counts, weight = route(router, x, args.experts)
        y = moe(x[order], swiglu_ops.counts_to_ends(counts))  # collective: all ranks together
        loss = F.mse_loss(unsort(order, y, weight), target) / world
        optimizer.zero_grad()
        loss.backward()
        dist.all_reduce(router.grad)  # the replicated router; the experts' gradients are complete already
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    return losses


def train_one_process(args, router, experts, world) -> list[float]:
    """The same steps in one process: all ranks' batches, all experts in one MXFP8ExpertMLP."""
    optimizer = torch.optim.AdamW([router, *experts.parameters()], lr=args.lr, foreach=False)
    losses = []
    for step in range(args.steps):
        chunks = [batch(args, r, step) for r in range(world)]
        routes = [route(router, x, args.experts) for x, _ in chunks]
        counts = torch.stack([c for _, c, _ in routes])  # [world, E]
        p = swiglu_ops.single_process_order(counts)
        xs = torch.cat([x[order] for (x, _), (order, _, _) in zip(chunks, routes, strict=True)])
        y_all = experts(xs[p], swiglu_ops.counts_to_ends(counts.sum(0)))
        y_cat = torch.empty_like(y_all).index_copy(0, p, y_all)  # back to the ranks' chunks
        loss, start = 0.0, 0
        for (_, target), (order, _, weight) in zip(chunks, routes, strict=True):
            y = y_cat[start : start + order.numel()]
            start += order.numel()
            loss = loss + F.mse_loss(unsort(order, y, weight), target) / world
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per rank and step")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32, help="H, a multiple of 32")
    parser.add_argument("--experts", type=int, default=4, help="a multiple of the world size")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--gpt-oss", action="store_true", help="GPT-OSS's clipped SwiGLU")
    parser.add_argument("--bf16", action="store_true", help="the bf16 baseline (quantize=False)")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    try:
        glu = GPT_OSS if args.gpt_oss else {}
        torch.manual_seed(0)  # the same initial weights on every rank
        router0 = torch.randn(args.dim, args.experts) / args.dim**0.5
        full = swiglu_ops.MXFP8ExpertMLP(args.experts, args.dim, args.hidden, **glu, quantize=not args.bf16)
        moe = swiglu_ops.ExpertParallelMLP.from_module(full)  # this rank's experts, copied
        router = router0.clone().requires_grad_()
        losses = train_expert_parallel(args, router, moe, rank, world)

        ref_router = router0.clone().requires_grad_()
        ref_losses = train_one_process(args, ref_router, full, world)
        lo, hi = rank * args.experts // world, (rank + 1) * args.experts // world
        same = (
            torch.equal(router, ref_router)
            and torch.equal(moe.experts.w1, full.w1[lo:hi])
            and torch.equal(moe.experts.w2, full.w2[lo:hi])
            and losses == ref_losses
        )
        ok = torch.tensor(int(same))
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if rank == 0:
            recipe = ("bf16" if args.bf16 else "MXFP8") + (", GPT-OSS" if args.gpt_oss else ", SwiGLU")
            print(f"expert parallel: {world} ranks x {args.experts // world} experts ({recipe})")
            print(f"{'step':>4} {'loss (EP)':>12} {'loss (1 process)':>17}")
            for i, (a, b) in enumerate(zip(losses, ref_losses, strict=True)):
                print(f"{i + 1:>4} {a:>12.6f} {b:>17.6f}")
            if ok.item():
                print(
                    f"matches one process: every step's loss, and the router and expert weights after "
                    f"{args.steps} AdamW steps, bit for bit"
                )
            else:
                print("MISMATCH: the expert-parallel run differs from one process")
        dist.barrier()  # torch 2.13: before destroy_process_group
        return 0 if ok.item() else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
