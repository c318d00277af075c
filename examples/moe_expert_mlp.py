"""Train a small MoE expert MLP on CPU with swiglu_ops, then compare MXFP8 and bf16 gradients.

The layer: a learned top-1 router sends each token to one of E experts (uneven groups), tokens are sorted by
expert into a buffer padded to a multiple of 64 rows, each expert applies ``up`` (D -> 2H), the clamped SwiGLU
weighted by the routing probability, and ``down`` (H -> D). Everything runs in bf16 with fp32 master weights.

- bf16 run: the activation is :func:`swiglu_ops.clamped_swiglu` with the routing weight and ``group_index``
  counts (the padding rows are masked); its backward is the fused ``swiglu_group_grad``, which also gives the
  router its gradient through the routing weight.
- MXFP8 run: the activation is :func:`swiglu_ops.swiglu_mx_backward` (plain SwiGLU, as the fused MX operator
  computes no clamp and no weight; the routing weight multiplies its output), so the gradient reaching the
  experts' ``up`` weights is the dequantised MXFP8 (E4M3 + E8M0) gradient. The quantised tensors are captured
  too: the script recomputes ``up``'s weight gradient from the column-wise (token-axis) copy, the operand an
  FP8 wgrad GEMM would read, and shows the blocked scale shapes such a GEMM takes.

Run: ``python examples/moe_expert_mlp.py`` (about 10 s on 2 CPU cores); ``--help`` for the sizes.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import swiglu_ops


class ExpertMLP(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, clamp: float, mx_backward: bool, backend: str):
        super().__init__()
        self.router = torch.nn.Parameter(torch.randn(dim, experts) / dim**0.5)
        self.up = torch.nn.Parameter(torch.randn(experts, dim, 2 * hidden) / dim**0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, dim) / hidden**0.5)
        self.clamp, self.mx_backward, self.backend = clamp, mx_backward, backend
        self.capture = swiglu_ops.MXGradient()  # filled by the MX backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, experts = x.shape[0], self.up.shape[0]
        probs = torch.softmax(x.float() @ self.router, dim=-1)
        weight, expert = probs.max(dim=-1)  # fp32 routing weight, differentiable w.r.t. the router
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=experts)
        ends = counts.cumsum(0).tolist()
        starts = [0, *ends[:-1]]
        xs = x[order].bfloat16()
        up = self.up.bfloat16()
        h = torch.cat([xs[s:e] @ up[i] for i, (s, e) in enumerate(zip(starts, ends, strict=True))])
        if self.mx_backward:
            act = swiglu_ops.swiglu_mx_backward(
                h, torch.tensor(ends), backend=self.backend, capture=self.capture
            )
            act = act * weight[order].unsqueeze(1).bfloat16()
        else:
            rows = -(-tokens // 64) * 64  # a buffer padded to 64 rows: the padding rows are masked out
            h = F.pad(h, (0, 0, 0, rows - tokens))
            w = F.pad(weight[order], (0, rows - tokens))
            act = swiglu_ops.clamped_swiglu(h, w, counts, self.clamp, backend=self.backend)[:tokens]
        down = self.down.bfloat16()
        out_sorted = torch.cat(
            [act[s:e] @ down[i] for i, (s, e) in enumerate(zip(starts, ends, strict=True))]
        )
        return torch.empty_like(out_sorted).index_copy_(0, order, out_sorted).float()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64, help="H; 2H must be a multiple of 64")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--clamp", type=float, default=7.0)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args(argv)
    start = time.perf_counter()

    torch.manual_seed(0)
    teacher = ExpertMLP(args.dim, args.hidden, args.experts, args.clamp, False, args.backend)
    inputs = torch.randn(args.tokens, args.dim)
    with torch.no_grad():
        targets = teacher(inputs)

    torch.manual_seed(1)
    bf16_model = ExpertMLP(args.dim, args.hidden, args.experts, args.clamp, False, args.backend)
    mx_model = ExpertMLP(args.dim, args.hidden, args.experts, args.clamp, True, args.backend)
    mx_model.load_state_dict(bf16_model.state_dict())
    counts = torch.bincount((inputs @ bf16_model.router).argmax(-1), minlength=args.experts)
    print(f"tokens per expert: {counts.tolist()}, clamp {args.clamp}, backend {args.backend!r}")

    # Gradients of one step. The runs differ in the activation's backward (MXFP8 vs bf16), in where the
    # routing weight is applied (one rounding vs two) and in the clamp, which does not bind at initialisation.
    grads = {}
    for name, model in (("bf16", bf16_model), ("mxfp8", mx_model)):
        model.zero_grad()
        F.mse_loss(model(inputs), targets).backward()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()}
    errors = {n: relative_error(grads["mxfp8"][n], grads["bf16"][n]) for n in ("up", "router")}
    for n, g in grads["bf16"].items():
        print(
            f"grad {n:6s}  bf16 {g.flatten()[:3].tolist()}  mxfp8 {grads['mxfp8'][n].flatten()[:3].tolist()}"
        )
    print(
        "relative error of MXFP8 vs bf16 gradients: " + ", ".join(f"{n} {e:.4f}" for n, e in errors.items())
    )

    # The captured quantised gradient is what FP8 GEMMs read. Autograd's gradient of `up` used the row-wise
    # copy (y1, mxscale1: the dgrad operand); an FP8 wgrad GEMM would read the token-axis copy (y2, mxscale2).
    # Both quantise the same 16-bit gradient, so the two weight gradients agree to MX precision.
    cap = mx_model.capture
    grad_h = swiglu_ops.mx_dequantize(cap.y2, cap.mxscale2, axis=-2, group_index=cap.group_index)
    order = torch.argsort((inputs @ mx_model.router).argmax(-1), stable=True)  # the forward's token order
    xs = inputs[order].bfloat16().float()
    ends = cap.group_index.tolist()
    wgrad = torch.stack([xs[s:e].t() @ grad_h[s:e] for s, e in zip([0, *ends[:-1]], ends, strict=True)])
    wgrad_error = relative_error(wgrad, grads["mxfp8"]["up"])
    print(
        f"wgrad of up from (y2, mxscale2) vs autograd's from (y1, mxscale1): relative difference "
        f"{wgrad_error:.4f}"
    )
    dgrad_scales = swiglu_ops.layouts.mxscale1_to_blocked(cap.mxscale1, cap.group_index)
    wgrad_scales = swiglu_ops.layouts.mxscale2_to_blocked(cap.mxscale2, args.tokens, cap.group_index)
    print(
        f"blocked scales for FP8 GEMMs: dgrad {tuple(dgrad_scales.shape)}, wgrad {tuple(wgrad_scales.shape)}"
    )

    losses = {}
    for name, model in (("bf16", bf16_model), ("mxfp8", mx_model)):
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        history = []
        for _ in range(args.steps):
            optimizer.zero_grad()
            loss = F.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            history.append(loss.item())
        losses[name] = history
        shown = ", ".join(f"{v:.4f}" for v in history[:: max(1, args.steps // 6)])
        print(f"{name:5s} loss: {shown} -> {history[-1]:.4f}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    return {"losses": losses, "grad_errors": errors, "wgrad_error": wgrad_error}


if __name__ == "__main__":
    main()
