"""``swiglu-ops`` command line: ``demo`` (the main job), ``verify`` and ``bench``.

``swiglu-ops demo`` runs the backward of an MoE expert MLP on synthetic data twice: with the bf16 gradient
of :func:`swiglu_ops.swiglu_group_grad`, and with the MXFP8 gradient of
:func:`swiglu_ops.swiglu_backward_mx_quant_dual_axis` dequantised and fed to the dgrad and wgrad matmuls.
It prints how far the MXFP8 weight/input gradients are from the bf16 ones and how fast each backend is.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from . import _api, mx_dequantize, swiglu_backward_mx_quant_dual_axis, swiglu_group_grad
from .tolerances import GRAD_WEIGHT_RTOL, unit_differences, within_near_ties


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


def make_moe_problem(tokens_per_expert, d_model: int, hidden: int, clamp: float, seed: int = 0):
    """Synthetic expert-MLP activations: x [T, d], per-expert W1 [d, 2H], pre-activations h = x W1 [T, 2H]
    (gate | up), routing weights w [T], upstream grad dy [T, H], forward outputs (weighted and not)."""
    gen = torch.Generator().manual_seed(seed)
    t = sum(tokens_per_expert)
    x = torch.randn(t, d_model, generator=gen).bfloat16()
    w1 = [
        (torch.randn(d_model, 2 * hidden, generator=gen) / d_model**0.5).bfloat16() for _ in tokens_per_expert
    ]
    ends = torch.tensor(tokens_per_expert).cumsum(0)
    starts = ends - torch.tensor(tokens_per_expert)
    h = torch.cat([x[s:e].float() @ w.float() for s, e, w in zip(starts, ends, w1, strict=True)]).bfloat16()
    weight = torch.rand(t, 1, generator=gen) * 0.9 + 0.1
    g, u = h[:, :hidden].float(), h[:, hidden:].float()
    y_unweighted = torch.nn.functional.silu(torch.clamp(g, max=clamp)) * torch.clamp(u, -clamp, clamp)
    dy = (torch.randn(t, hidden, generator=gen) * 0.01).bfloat16()
    return dict(
        x=x,
        w1=w1,
        h=h,
        weight=weight,
        y_origin=y_unweighted.bfloat16(),
        dy=dy,
        starts=starts.tolist(),
        ends=ends.tolist(),
        counts=torch.tensor(tokens_per_expert),
    )


def demo(argv=None) -> int:
    p = argparse.ArgumentParser(prog="swiglu-ops demo", description=demo.__doc__)
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=[700, 96, 333, 1, 512, 160, 48, 198],
        help="tokens routed to each expert (uneven groups)",
    )
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024, help="H (x has 2H columns: gate | up)")
    p.add_argument("--clamp", type=float, default=7.0)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.hidden % 32:
        p.error("--hidden must be a multiple of 32 (x's last dim 2H must be a multiple of 64)")

    t_all = time.perf_counter()
    print(
        f"swiglu_ops demo: MoE expert-MLP backward, {len(args.tokens)} experts, tokens per expert "
        f"{args.tokens}, d_model {args.d_model}, H {args.hidden}, clamp {args.clamp}"
    )
    _progress("building synthetic problem")
    prob = make_moe_problem(args.tokens, args.d_model, args.hidden, args.clamp)
    h, dy, weight = prob["h"], prob["dy"], prob["weight"]
    hmax = float(h.float().abs().max())
    print(
        f"pre-activations |h| <= {hmax:.2f}; routing weights in [{float(weight.min()):.2f}, "
        f"{float(weight.max()):.2f}]"
    )
    if hmax < args.clamp:
        print(
            f"(the clamp {args.clamp} bounds no pre-activation here, so the bf16 and MXFP8 paths compute the "
            "same math and differ only by quantisation)"
        )
    else:
        print(f"(note: some |h| >= clamp {args.clamp}; the MX op has no clamp, so those positions differ)")

    # --- bf16 path: SwigluGroupGrad (clamp, routing weight, group row mask, routing-weight gradient).
    _progress(
        "bf16 gradient (swiglu_group_grad; the first call of a Numba backend compiles it, cached after)"
    )
    dh_bf16, dweight = swiglu_group_grad(dy, h, weight, prob["y_origin"], prob["counts"], args.clamp)

    # --- MXFP8 path: the MX op computes the plain SwiGLU backward, so the routing weight is folded into the
    # upstream gradient; the clamp bounds no value here when |h| < clamp (then both paths are the same math).
    _progress("MXFP8 gradient (swiglu_backward_mx_quant_dual_axis)")
    ends = torch.tensor(prob["ends"])
    y1, s1, y2, s2 = swiglu_backward_mx_quant_dual_axis(h, (dy.float() * weight).bfloat16(), ends)
    dh_row = mx_dequantize(y1, s1, axis=-1)  # blocks along 2H: operand of the dgrad GEMM (contracts 2H)
    dh_col = mx_dequantize(y2, s2, axis=-2, group_index=ends)  # blocks along tokens: wgrad (contracts tokens)

    _progress("dgrad / wgrad matmuls")
    rows = []
    for e, (s, t) in enumerate(zip(prob["starts"], prob["ends"], strict=True)):
        if t == s:
            continue
        xe, w1 = prob["x"][s:t].float(), prob["w1"][e].float()
        dgrad_ref = dh_bf16[s:t].float() @ w1.T
        wgrad_ref = xe.T @ dh_bf16[s:t].float()
        rows.append((e, t - s, _rel(dh_row[s:t] @ w1.T, dgrad_ref), _rel(xe.T @ dh_col[s:t], wgrad_ref)))

    print()
    print("MXFP8 vs bf16 gradients (relative Frobenius error)")
    print(f"{'expert':>6} {'tokens':>6} {'dgrad':>9} {'wgrad':>9}")
    for e, n, d, w in rows:
        print(f"{e:>6} {n:>6} {d:>9.4f} {w:>9.4f}")
    print(
        f"{'all':>6} {sum(args.tokens):>6} {_rel(dh_row, dh_bf16.float()):>9.4f} "
        f"{_rel(dh_col, dh_bf16.float()):>9.4f}   (gradient itself: rowwise / colwise dequantised)"
    )
    print(
        f"routing-weight gradient: |dL/dw| mean {float(dweight.abs().mean()):.3e} "
        f"over {dweight.numel()} tokens"
    )

    print()
    print(f"time per op on {h.shape[0]} x {h.shape[1]} bf16 (median of {args.repeats})")
    print(
        f"{'backend':>10} {'swiglu_group_grad':>22} {'mx_quant_dual_axis':>23}   (x: speed-up over reference)"
    )
    times = {}
    for name in _api.available_backends("cpu"):
        _progress(f"timing backend {name!r}")
        t_gg = _time(
            lambda n=name: swiglu_group_grad(
                dy, h, weight, prob["y_origin"], prob["counts"], args.clamp, backend=n
            ),
            args.repeats,
        )
        t_mx = _time(lambda n=name: swiglu_backward_mx_quant_dual_axis(h, dy, ends, backend=n), args.repeats)
        times[name] = (t_gg, t_mx)
    ref_gg, ref_mx = times["reference"]
    for name, (t_gg, t_mx) in times.items():
        gg = f"{t_gg * 1e3:>9.2f} ms {ref_gg / t_gg:>5.0f}x"
        print(f"{name:>10} {gg} {t_mx * 1e3:>10.2f} ms {ref_mx / t_mx:>5.0f}x")
    print(f"\ndone in {time.perf_counter() - t_all:.1f} s")
    return 0


_MX_NAMES = ("y1", "mxscale1", "y2", "mxscale2")


def _near_ties(name: str, got: torch.Tensor, want: torch.Tensor) -> tuple[str, bool]:
    """Contract section 3: equal except at most 1 in 10,000 elements, each one unit (ulp / code) apart."""
    got, want = got.cpu(), want.cpu()
    return f"{name} {unit_differences(got, want)[0]} differ", within_near_ties(got, want)


def verify(argv=None) -> int:
    """Check every available backend against the reference on random inputs (a quick install check)."""
    p = argparse.ArgumentParser(prog="swiglu-ops verify", description=verify.__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(300, 256, generator=gen) * 3).to(dtype).to(device)
        dy = torch.randn(300, 128, generator=gen).to(dtype).to(device)
        w = torch.rand(300, generator=gen).to(device)
        ends = torch.tensor([17, 17, 100, 300], device=device)
        counts = torch.tensor([40, 200], device=device)  # swiglu_group_grad: counts, 240 valid rows
        ref_gg = swiglu_group_grad(dy, x, w, dy, counts, 7.0, backend="reference")
        ref_mx = swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="reference")
        for name in _api.available_backends(device):
            if name == "reference":
                continue
            gg = swiglu_group_grad(dy, x, w, dy, counts, 7.0, backend=name)
            got = swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend=name)
            checks = [_near_ties("grad_x", gg[0], ref_gg[0])]
            checks += [_near_ties(n, a, b) for n, a, b in zip(_MX_NAMES, got, ref_mx, strict=True)]
            rel_gw = float(((gg[1] - ref_gg[1]).abs() / ref_gg[1].abs().clamp_min(1e-30)).max())
            good = all(c[1] for c in checks) and rel_gw <= GRAD_WEIGHT_RTOL
            ok &= good
            detail = ", ".join(c[0] for c in checks)
            verdict = "ok" if good else "FAIL"
            print(f"{name:>8} {str(dtype):>15}: {detail}, grad_weight max rel {rel_gw:.1e} -> {verdict}")
    print("verify:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def bench(argv=None) -> int:
    from . import bench as _bench

    return _bench.main(argv)


COMMANDS = {"demo": demo, "verify": verify, "bench": bench}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(
            "usage: swiglu-ops {demo,verify,bench} [options]\n"
            "  demo    MoE expert-MLP backward: bf16 vs MXFP8 gradients, time per backend (the main job)\n"
            "  verify  check every available backend against the reference\n"
            "  bench   benchmark against the copy roofline and the (compiled) reference"
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
