"""``swiglu-ops`` command line: ``demo`` (the main job), ``verify`` and ``bench``.

``swiglu-ops demo`` trains a small MoE expert MLP (:class:`swiglu_ops.MXFP8ExpertMLP`: a few experts with
uneven token counts, a teacher-student regression) twice from the same initial weights: in bf16, and in
MXFP8, the activation quantised by :func:`swiglu_ops.swiglu_mx_quant_dual_axis` in the forward and the
SwiGLU gradient by :func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis` in the backward, the GEMMs on MXFP8
operands. It prints, for CANN's plain SwiGLU and for GPT-OSS's clipped SwiGLU, the relative errors of the
whole MLP's output and gradients (MXFP8 vs bf16, each vs the exact float64 MLP) at the same weights and the
two loss curves side by side, then how fast each backend runs the two fused operators and a training step.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .ops import api
from .ops.api import swiglu_backward_mx_quant_dual_axis, swiglu_mx_quant_dual_axis
from .ops.checks import compare_outputs
from .ops.registry import backend_status, check_backend_name
from .ops.table import EXAMPLE_CASES, PUBLIC
from .training.expert_mlp import MXFP8ExpertMLP, check_sizes, expert_mlp_reference

#: What the demo compares: the output, the gradients of x, W1, W2 and the router (through the probabilities).
GRADIENTS = ("out", "dx", "dW1", "dW2", "router")

#: The GPT-OSS clipped SwiGLU (openai/gpt-oss, Hugging Face GptOssExperts).
GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)


def _progress(msg: str) -> None:
    sys.stdout.flush()
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of ``a`` against ``b``."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _time(fn, repeats: int) -> float:
    fn()  # warm-up (JIT compilation, caches)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def make_moe_problem(tokens_per_expert, d_model: int, hidden: int, glu: dict, seed: int = 0):
    """Synthetic regression: tokens ``x [T, d]`` sorted by expert, their cumulative ends, and targets from a
    random teacher expert MLP of the same shape and activation whose outputs are scaled by the teacher
    router's probabilities (computed exactly, in float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(tokens_per_expert), d_model, generator=gen)
    ends = torch.tensor(tokens_per_expert).cumsum(0)
    e = len(tokens_per_expert)
    w1 = torch.randn(e, d_model, 2 * hidden, generator=gen, dtype=torch.float64) * 2.0 / d_model**0.5
    w2 = torch.randn(e, hidden, d_model, generator=gen, dtype=torch.float64) / hidden**0.5
    router = torch.randn(d_model, generator=gen, dtype=torch.float64) / d_model**0.5
    probs = torch.sigmoid(x.double() @ router)
    target = expert_mlp_reference(x.double(), w1, w2, ends, **glu, probs=probs).float()
    return x, ends, target


class RoutedExperts(torch.nn.Module):
    """The demo's model: a router (one logit per token, its probability ``sigmoid(x r)``, fp32) and the
    experts (:class:`MXFP8ExpertMLP`), whose fused forward operator multiplies each token's activation by its
    probability; the router's gradient comes from the fused backward operator's ``grad_weight``."""

    def __init__(self, experts: MXFP8ExpertMLP):
        super().__init__()
        self.experts = experts
        self.router = torch.nn.Parameter(torch.zeros(experts.w1.shape[1]))

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x.float() @ self.router)

    def forward(self, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        return self.experts(x, ends, self.probs(x))


def _loss_and_grads(model: RoutedExperts, x, ends, target):
    """MSE loss and its gradients (output, dx, dW1, dW2, d router) at the model's current weights."""
    model.zero_grad()
    xr = x.detach().to(torch.bfloat16).requires_grad_()
    out = model(xr, ends)
    loss = torch.nn.functional.mse_loss(out.float(), target)
    loss.backward()
    e = model.experts
    return loss.item(), (
        out.detach(),
        xr.grad,
        e.w1.grad.clone(),
        e.w2.grad.clone(),
        model.router.grad.clone(),
    )


def _exact_grads(model: RoutedExperts, x, ends, target, glu: dict):
    """The same at the same (bf16) weights in float64, nothing rounded or quantised."""
    x64 = x.to(torch.bfloat16).double().requires_grad_()
    w1 = model.experts.w1.detach().to(torch.bfloat16).double().requires_grad_()
    w2 = model.experts.w2.detach().to(torch.bfloat16).double().requires_grad_()
    router = model.router.detach().double().requires_grad_()
    out = expert_mlp_reference(x64, w1, w2, ends, **glu, probs=torch.sigmoid(x64 @ router))
    torch.nn.functional.mse_loss(out, target.double()).backward()
    return out.detach(), x64.grad, w1.grad, w2.grad, router.grad


def compare_training(tokens, d_model: int, hidden: int, glu: dict, steps: int, lr: float, backend: str):
    """bf16 vs MXFP8 expert MLP from the same initial weights on the same data: gradient errors at the
    initial weights and both loss curves. Returns ``(errors, losses, median seconds per step)``."""
    x, ends, target = make_moe_problem(tokens, d_model, hidden, glu)
    torch.manual_seed(1)
    models = {
        name: RoutedExperts(MXFP8ExpertMLP(len(tokens), d_model, hidden, **glu, quantize=q, backend=backend))
        for name, q in (("bf16", False), ("mxfp8", True))
    }
    models["mxfp8"].load_state_dict(models["bf16"].state_dict())
    exact = _exact_grads(models["bf16"], x, ends, target, glu)
    grads = {name: _loss_and_grads(m, x, ends, target)[1] for name, m in models.items()}
    errors = {
        what: (_rel(grads["mxfp8"][i], grads["bf16"][i]), _rel(grads["bf16"][i], exact[i]),
               _rel(grads["mxfp8"][i], exact[i]))
        for i, what in enumerate(GRADIENTS)
    }  # fmt: skip
    losses, step_time = {}, {}
    for name, model in models.items():
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        history, durations = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss, _ = _loss_and_grads(model, x, ends, target)
            opt.step()
            durations.append(time.perf_counter() - t0)
            history.append(loss)
        step_time[name] = sorted(durations)[len(durations) // 2] if durations else float("nan")
        losses[name] = history
    return errors, losses, step_time


def _plot_demo(results: dict, path: str) -> bool:
    """The loss curves (bf16 and MXFP8) and the error table of each activation, as one picture."""
    from .bench import pyplot

    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(2, len(results), figsize=(6 * len(results), 7), squeeze=False)
    for col, (title, (errors, losses)) in enumerate(results.items()):
        ax = axes[0][col]
        for name, history in losses.items():
            ax.plot(range(1, len(history) + 1), history, label=name)
        ax.set(title=title, xlabel="step", ylabel="MSE loss", yscale="log")
        ax.legend()
        table = axes[1][col]
        table.axis("off")
        cells = [[what, *(f"{v:.4f}" for v in vals)] for what, vals in errors.items()]
        table.table(
            cellText=cells, colLabels=["", "MXFP8 vs bf16", "bf16 vs exact", "MXFP8 vs exact"], loc="center"
        ).scale(1, 1.4)
        table.set_title("relative error at the initial weights (exact: float64)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _at_least(low: int):
    """An argparse type: an int >= ``low`` (a clean usage error instead of a traceback mid-run)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _check_plot_path(path: str) -> str | None:
    """Why ``--plot`` cannot be written (checked before the run, not after it), or None; makes its folder."""
    from pathlib import Path

    from .bench import pyplot

    plt = pyplot()
    suffix = Path(path).suffix.lstrip(".").lower()
    if plt is not None and suffix not in plt.figure().canvas.get_supported_filetypes():
        plt.close("all")
        return f"{path!r}: matplotlib cannot write {'.' + suffix if suffix else 'a file without a suffix'}"
    if plt is not None:
        plt.close("all")
    try:
        Path(path).resolve().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{path!r}: cannot make its folder ({exc})"
    return None


def demo(argv=None) -> int:
    """Train a small MoE expert MLP in bf16 and in MXFP8 (both fused dual-axis MX operators, router
    probabilities through their weight) from the same weights, for CANN's plain and GPT-OSS's clipped
    SwiGLU: the output's and every gradient's error against the float64 MLP, the two loss curves, and the
    time per backend of the two fused operators and of a training step (the main job)."""
    p = argparse.ArgumentParser(prog="swiglu-ops demo", description=demo.__doc__)
    p.add_argument(
        "--tokens",
        type=_at_least(0),
        nargs="+",
        default=[300, 61, 0, 207, 1, 155],
        help="tokens routed to each expert (uneven groups; 0 = an expert without tokens)",
    )
    p.add_argument("--d-model", type=_at_least(1), default=64)
    p.add_argument("--hidden", type=_at_least(1), default=128, help="H (W1 has 2H columns: gate | up)")
    p.add_argument("--steps", type=_at_least(1), default=30)
    p.add_argument("--lr", type=_positive_float, default=1e-2)
    p.add_argument("--backend", default="auto", help="backend of the fused operators in the training runs")
    p.add_argument("--repeats", type=_at_least(1), default=3, help="timed repeats per backend")
    p.add_argument(
        "--train-threads",
        type=_at_least(1),
        default=1,
        help="torch threads while training (default 1: the problem is small; docs/integration.md)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="save the loss curves and the error table as a picture (needs matplotlib)",
    )
    args = p.parse_args(argv)
    try:
        check_sizes(2 * args.hidden, args.d_model)
    except ValueError as exc:  # --hidden / --d-model: the expert MLP's own rule
        p.error(f"--hidden / --d-model: {exc}")
    if sum(args.tokens) == 0:
        p.error("--tokens: at least one expert needs a token (there is nothing to train on)")
    try:
        check_backend_name(args.backend)
    except ValueError as exc:
        p.error(f"--backend: {exc}")
    if args.backend != "auto" and not (status := backend_status(args.backend, "cpu"))[0]:
        p.error(f"--backend: {args.backend!r} cannot run the demo's CPU tensors: {status[1]}")
    if args.plot is not None and (why := _check_plot_path(args.plot)) is not None:
        p.error(f"--plot: {why}")

    t_all = time.perf_counter()
    print(
        f"swiglu_ops demo: MoE expert MLP d_model {args.d_model} -> 2H {2 * args.hidden} -> d_model, "
        f"{len(args.tokens)} experts, tokens per expert {args.tokens}"
    )
    print(
        "MXFP8 run: act = swiglu_mx_quant_dual_axis(x W1, weight=probs), dh, d probs = "
        "swiglu_backward_mx_quant_dual_axis(h, dact, weight=probs);\n  GEMMs out = act W2, dW2 = act^T dout, "
        "dx = dh W1^T, dW1 = x^T dh on MXFP8 operands (E4M3 + E8M0, 32-blocks; emulated on CPU);\n  x W1 and "
        "dout W2^T in bf16. probs = sigmoid(x r), a router: its gradient flows through the operators' weight"
    )
    variants = {"SwiGLU": {}, "GPT-OSS (limit 7, alpha 1.702, bias 1, interleaved)": GPT_OSS}
    step_times, results = {}, {}
    threads = torch.get_num_threads()
    for title, glu in variants.items():
        _progress(f"training {title}: bf16 and MXFP8, {args.steps} steps each")
        torch.set_num_threads(args.train_threads)
        try:
            errors, losses, step_time = compare_training(
                args.tokens, args.d_model, args.hidden, glu, args.steps, args.lr, args.backend
            )
        finally:
            torch.set_num_threads(threads)
        step_times[title] = step_time
        results[title] = (errors, losses)
        print(f"\n== {title} ==")
        print("relative error (Frobenius) at the initial weights; exact = float64 MLP, nothing rounded")
        print(f"{'':>6} {'MXFP8 vs bf16':>14} {'bf16 vs exact':>14} {'MXFP8 vs exact':>15}")
        for what, (mx_bf, bf_ex, mx_ex) in errors.items():
            print(f"{what:>6} {mx_bf:>14.4f} {bf_ex:>14.4f} {mx_ex:>15.4f}")
        print("(router: the gradient of the router's weights, through the operators' grad_weight)")
        print(f"training loss (MSE, Adam lr {args.lr}):")
        print(f"{'step':>6} {'bf16':>10} {'MXFP8':>10} {'rel. diff':>10}")
        shown = sorted({*range(0, args.steps, max(1, args.steps // 6)), args.steps - 1})
        for i in shown:
            b, m = losses["bf16"][i], losses["mxfp8"][i]
            print(f"{i + 1:>6} {b:>10.5f} {m:>10.5f} {(m - b) / b:>+10.2%}")

    print()
    tokens, two_h = sum(args.tokens), 2 * args.hidden
    x, ends, _ = make_moe_problem(args.tokens, args.d_model, args.hidden, {})
    h = (x @ torch.randn(args.d_model, two_h) / args.d_model**0.5).to(torch.bfloat16)
    dact = (torch.randn(tokens, args.hidden) * 0.01).to(torch.bfloat16)
    print(
        f"time per call on h = {tokens} x {two_h} bf16, {len(args.tokens)} groups (median of {args.repeats})"
    )
    print(f"{'backend':>10} {'swiglu_mx_quant_dual_axis':>27} {'swiglu_backward_mx_quant_dual_axis':>36}")
    times = {}
    for name in api.available_backends("cpu"):
        _progress(f"timing backend {name!r}")
        t_fwd = _time(lambda n=name: swiglu_mx_quant_dual_axis(h, ends, backend=n), args.repeats)
        t_bwd = _time(
            lambda n=name: swiglu_backward_mx_quant_dual_axis(h, dact, ends, backend=n), args.repeats
        )
        times[name] = (t_fwd, t_bwd)
    ref_fwd, ref_bwd = times["reference"]
    for name, (t_fwd, t_bwd) in times.items():
        fwd = f"{t_fwd * 1e3:>10.2f} ms {ref_fwd / t_fwd:>5.0f}x"
        bwd = f"{t_bwd * 1e3:>10.2f} ms {ref_bwd / t_bwd:>5.0f}x"
        print(f"{name:>10} {fwd:>27} {bwd:>36}")
    print("(x: speed-up over the reference backend)")
    print(
        f"training step (forward + backward + Adam; median; {args.train_threads} thread(s)), "
        f"backend {args.backend!r}:"
    )
    for title, st in step_times.items():
        print(
            f"  {title.split(' (')[0]:>8}: bf16 {st['bf16'] * 1e3:.1f} ms, MXFP8 {st['mxfp8'] * 1e3:.1f} ms"
        )
    if args.plot:
        print(
            f"picture: {args.plot}" if _plot_demo(results, args.plot) else "no picture: matplotlib is missing"
        )
    print(f"\ndone in {time.perf_counter() - t_all:.1f} s")
    return 0


def verify(argv=None) -> int:
    """Check every operator of the table on every available backend against the reference, on random inputs
    with uneven groups (a quick install check)."""
    p = argparse.ArgumentParser(prog="swiglu-ops verify", description=verify.__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        p.error(f"--device {args.device!r} is not a device ({exc})")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: CUDA is unavailable (torch {torch.__version__}); use --device cpu")
    if device.type == "meta":
        p.error("--device meta holds no values to compare; use cpu or cuda")
    backends = [b for b in api.available_backends(device) if b != "reference"]
    if not backends:  # nothing to check: not a pass
        print(f"verify on {device}: no backend but the reference is available here, nothing to compare")
        return 1
    print(f"verify on {device}: backends {', '.join(backends)} vs the reference")
    ok = True
    for op, case in ((op, case) for op in PUBLIC for case in range(EXAMPLE_CASES)):
        fn = getattr(api, op.name)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            values = op.example(torch.Generator().manual_seed(0), dtype, device, case)
            want = fn(**values, backend="reference")
            for name in backends:
                got = fn(**values, backend=name)
                checks = compare_outputs(op, values, got, want)
                good = all(c[1] for c in checks)
                ok &= good
                detail = ", ".join(c[0] for c in checks)
                verdict = "ok" if good else "FAIL"
                print(f"{op.name:>35} {case} {name:>7} {str(dtype)[6:]:>8}: {detail} -> {verdict}")
    print("verify:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def bench(argv=None) -> int:
    from . import bench as _bench

    return _bench.main(argv)


COMMANDS = {"demo": demo, "verify": verify, "bench": bench}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"swiglu-ops: unknown command {argv[0]!r} (one of: {', '.join(COMMANDS)})", file=sys.stderr)
        print(
            "usage: swiglu-ops {demo,verify,bench} [options]\n"
            "  demo    train a small MoE expert MLP in bf16 and MXFP8: errors, losses, speed (the main job)\n"
            "  verify  check every available backend against the reference\n"
            "  bench   benchmark against the copy roofline and the (compiled) reference"
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
