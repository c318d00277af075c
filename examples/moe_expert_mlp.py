"""Train a small MoE layer on CPU twice, in bf16 and in MXFP8 on swiglu_ops' fused dual-axis MX operators.

The layer: a learned top-1 router sends each token to one of E experts (uneven groups), the tokens are sorted
by expert, the experts are a :class:`swiglu_ops.MXFP8ExpertMLP` (``x @ W1[e]`` -> SwiGLU -> ``@ W2[e]``), and
each token's output is scaled by its routing probability. Weights are fp32 masters, computed in bf16.

- bf16 run: ``MXFP8ExpertMLP(quantize=False)``: bf16 GEMMs, the SwiGLU and its gradient rounded to bf16.
- MXFP8 run: the activation comes from ``swiglu_mx_quant_dual_axis`` and the SwiGLU gradient from
  ``swiglu_backward_mx_quant_dual_axis``, each as two MXFP8 copies (blocks along the hidden dim for the
  next GEMM, blocks along the tokens restarting at every expert for the weight-gradient GEMM); the down
  projection, both weight gradients and the input gradient are GEMMs on MXFP8 operands (emulated on CPU,
  ``torch._scaled_grouped_mm`` on GPUs with MX support; see ``docs/integration.md``).

Both runs start from the same weights and see the same data (a teacher-student regression). The script
prints the relative errors of the MXFP8 gradients against the bf16 ones at the initial weights and the two
loss curves, for CANN's plain SwiGLU and for GPT-OSS's clipped SwiGLU (limit 7, alpha 1.702, bias 1,
interleaved gate/up).

Run: ``python examples/moe_expert_mlp.py`` (about 10 s on 2 CPU cores); ``--help`` for the sizes.
``--compile`` trains under ``torch.compile``: the FP8 operands of the MXFP8 GEMMs stay in the compiled graph
(forward and backward), and the losses equal the eager ones (Inductor is told to round like eager,
``emulate_precision_casts``; see ``docs/integration.md`` section 12).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import swiglu_ops

GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)


class MoELayer(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, glu: dict, quantize: bool, backend: str):
        super().__init__()
        self.router = torch.nn.Parameter(torch.randn(dim, experts) / dim**0.5)
        self.experts = swiglu_ops.MXFP8ExpertMLP(
            experts, dim, hidden, **glu, quantize=quantize, backend=backend
        )

    def forward(self, x: torch.Tensor, capture: dict | None = None) -> torch.Tensor:
        probs = torch.softmax(x.float() @ self.router, dim=-1)
        weight, expert = probs.max(dim=-1)  # fp32 routing weight, differentiable w.r.t. the router
        order = torch.argsort(expert, stable=True)
        ends = torch.bincount(expert, minlength=self.router.shape[1]).cumsum(0)  # the MX operators' groups
        out = self.experts(x[order], ends, capture=capture).float() * weight[order].unsqueeze(1)
        return torch.empty_like(out).index_copy_(0, order, out)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run_variant(name: str, glu: dict, args) -> dict:
    torch.manual_seed(0)
    teacher = MoELayer(args.dim, args.hidden, args.experts, glu, quantize=False, backend=args.backend)
    with torch.no_grad():
        teacher.experts.w1.mul_(2.0)  # larger pre-activations: the GPT-OSS clamps bind on some of them
    inputs = torch.randn(args.tokens, args.dim)
    with torch.no_grad():
        targets = teacher(inputs)

    torch.manual_seed(1)
    models = {
        "bf16": MoELayer(args.dim, args.hidden, args.experts, glu, quantize=False, backend=args.backend),
        "mxfp8": MoELayer(args.dim, args.hidden, args.experts, glu, quantize=True, backend=args.backend),
    }
    models["mxfp8"].load_state_dict(models["bf16"].state_dict())
    counts = torch.bincount((inputs @ models["bf16"].router).argmax(-1), minlength=args.experts)
    print(f"\n== {name} == tokens per expert at the start: {counts.tolist()}")

    grads, capture = {}, {}
    for run, model in models.items():
        model.zero_grad()
        x = inputs.clone().requires_grad_()
        F.mse_loss(model(x, capture if run == "mxfp8" else None), targets).backward()
        grads[run] = {"x": x.grad, **{n: p.grad.clone() for n, p in model.named_parameters()}}
    errors = {n: relative_error(grads["mxfp8"][n], grads["bf16"][n]) for n in grads["bf16"]}
    print("relative error of the MXFP8 gradients vs bf16 at the same weights:")
    print("  " + ", ".join(f"{n} {e:.4f}" for n, e in errors.items()))

    # What the MX GEMMs read: FP8 codes and the cuBLAS blocked scales of swiglu_ops.layouts.
    ends = torch.bincount((inputs @ models["mxfp8"].router).argmax(-1), minlength=args.experts).cumsum(0)
    y1, s1, y2, s2 = capture["dh"]
    dgrad = swiglu_ops.layouts.mxscale1_to_blocked(s1, ends)
    wgrad = swiglu_ops.layouts.mxscale2_to_blocked(s2, args.tokens, ends)
    print(
        f"SwiGLU gradient for the GEMMs: {tuple(y1.shape)} {y1.dtype}; blocked scales dgrad "
        f"{tuple(dgrad.shape)} (groups along M), wgrad {tuple(wgrad.shape)} (groups along K); GEMMs: "
        f"{capture['gemm']}"
    )

    losses = {}
    for run, model in models.items():
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        forward = torch.compile(model) if args.compile else model
        history = []
        for _ in range(args.steps):
            optimizer.zero_grad()
            loss = F.mse_loss(forward(inputs), targets)
            loss.backward()
            optimizer.step()
            history.append(loss.item())
        losses[run] = history
    print(f"{'step':>6} {'bf16 loss':>10} {'MXFP8 loss':>11}")
    for i in sorted({*range(0, args.steps, max(1, args.steps // 6)), args.steps - 1}):
        print(f"{i + 1:>6} {losses['bf16'][i]:>10.5f} {losses['mxfp8'][i]:>11.5f}")
    return {"losses": losses, "grad_errors": errors}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64, help="H, a multiple of 32")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--compile", action="store_true", help="train under torch.compile (Inductor)")
    args = parser.parse_args(argv)
    if args.compile:  # Inductor rounds the bf16 casts of the fp32 master weights as eager does
        torch._inductor.config.emulate_precision_casts = True
    start = time.perf_counter()
    results = {
        "swiglu": run_variant("SwiGLU", {}, args),
        "gpt_oss": run_variant("GPT-OSS (limit 7, alpha 1.702, bias 1, interleaved)", GPT_OSS, args),
    }
    print(f"\ndone in {time.perf_counter() - start:.1f} s")
    return results


if __name__ == "__main__":
    main()
