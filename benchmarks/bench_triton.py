"""Triton backend on a CUDA GPU: conformance at realistic sizes, then time and % of measured copy bandwidth.

    python benchmarks/bench_triton.py                 # check + benchmark + compiled-reference baselines
    python benchmarks/bench_triton.py --tune          # also time launch-configuration variants
    python benchmarks/bench_triton.py --json out.json # write every number

Steps (each prints as it goes; the summary table comes last):

1. ``check``: both ops against the reference (run on the same GPU, eager) over dtypes, options and ragged
   groups, with the contract's rule for every output tensor: FP8/E8M0 codes and 16-bit gradients equal except
   near ties (at most 1 in 10,000 elements, one unit each), grad_weight within 1e-5 relative.
2. ``big``: one tensor of more than 2**31 elements per op (64-bit offsets); its last rows are compared with
   the reference run on just those rows.
3. ``bench``: the op (backend=BACKEND), and a device copy of the same number of bytes (inputs read + outputs
   written), both timed with CUDA-graph replay (``triton.testing.do_bench_cudagraph``, median). The headline
   is % of copy roofline = copy time / op time. Contract targets on H100/H200: swiglu_group_grad >= 85 %,
   dual-axis quantisation >= 75 %.
4. ``tune`` (optional): the same timings for other tile shapes / warp counts, each variant first checked
   against the reference.
5. ``baselines``: the reference under ``torch.compile`` (plain ``do_bench``: it reads group ends on the
   host), skipped when the run has used its ``--budget`` seconds.

Exits with a message (status 0) when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import swiglu_ops
from swiglu_ops.tolerances import unit_differences

# The contract's comparison rules (spec README section 3) live with the tests; the check reuses them.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _compare  # noqa: E402

T0 = time.perf_counter()
#: Where and what is measured (a dry run on CPU swaps these to exercise the script without a GPU).
DEVICE = "cuda"
BACKEND = "triton"


def _log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


def _cpu(ts):
    return tuple(None if t is None else t.cpu() for t in ts)


def _verdict(what: str, check) -> bool:
    """Run one of the test suite's contract assertions (tests/_compare.py); log and return the verdict."""
    try:
        check()
    except AssertionError as exc:
        _log(f"  {what}: FAIL: {str(exc)[:300]}")
        return False
    return True


# --------------------------------------------------------------------------------------------- inputs


def _gen(seed):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _group_grad_case(rows, hidden, dtype, seed=0, weight=True, groups=True):
    g = _gen(seed)
    dy = torch.randn(rows, hidden, device=DEVICE, generator=g).to(dtype)
    x = (torch.randn(rows, 2 * hidden, device=DEVICE, generator=g) * 3).to(dtype)
    w = torch.rand(rows, 1, device=DEVICE, generator=g) if weight else None
    yo = torch.randn(rows, hidden, device=DEVICE, generator=g).to(dtype) if weight else None
    gi = torch.tensor([rows // 2, rows - rows // 2 - rows // 7], device=DEVICE) if groups else None
    args = (dy, x, w, yo, gi, 7.0)
    nbytes = sum(t.numel() * t.element_size() for t in args[:4] if t is not None)
    nbytes += x.numel() * x.element_size() + (rows * 4 if weight else 0)
    return args, nbytes


def _ragged_ends(m, groups, seed):
    """Uneven cumulative ends (the last is M, as the API requires) with an empty second group."""
    g = torch.Generator().manual_seed(seed)
    if groups == 1:
        return torch.tensor([m], device=DEVICE)
    sizes = torch.rand(groups, generator=g) + 0.2
    sizes[1] = 0
    ends = (sizes.cumsum(0) / sizes.sum() * m).round().to(torch.int64)
    ends[-1] = m
    return ends.to(DEVICE)


def _mx_case(m, c, groups, dtype, seed=0, ragged=False):
    g = _gen(seed)
    x = (torch.randn(m, c, device=DEVICE, generator=g) * 3).to(dtype)
    dy = torch.randn(m, c // 2, device=DEVICE, generator=g).to(dtype)
    if groups is None:
        ends = None
    elif ragged:
        ends = _ragged_ends(m, groups, seed)
    else:
        ends = torch.linspace(0, m, groups + 1, device=DEVICE)[1:].round().to(torch.int64)
    rows2 = (m // 64 + groups) if groups else -(-m // 64)
    nbytes = (x.numel() + dy.numel()) * x.element_size() + 2 * m * c + m * c // 32 + rows2 * c * 2
    return (x, dy, ends), nbytes


GG = swiglu_ops.swiglu_group_grad
MXQ = swiglu_ops.swiglu_backward_mx_quant_dual_axis
MX_NAMES = ("y1", "mxscale1", "y2", "mxscale2")


def _compare_gg(args, quiet=False) -> bool:
    got = GG(*args, backend=BACKEND)
    want = GG(*args, backend="reference")
    dy, x, w, yo, _gi, clamp = args
    what = f"group_grad {tuple(x.shape)} {x.dtype} weight={w is not None}"
    ok = _verdict(
        what,
        lambda: _compare.assert_group_grad_matches(
            _cpu(got), _cpu(want), BACKEND, (*_cpu((dy, x, w, yo)), clamp)
        ),
    )
    if not quiet:
        count, worst = unit_differences(got[0], want[0])
        _log(f"  {what}: grad_x {count} differ (max {worst} units) -> {'ok' if ok else 'FAIL'}")
    return ok


def _compare_mx(args, quiet=False, **kw) -> bool:
    got = MXQ(*args, backend=BACKEND, **kw)
    want = MXQ(*args, backend="reference", **kw)
    groups = None if args[2] is None else args[2].numel()
    what = f"mx {tuple(args[0].shape)} {args[0].dtype} {kw or ''} groups={groups}"
    ok = _verdict(what, lambda: _compare.assert_mx_matches(_cpu(got), _cpu(want), BACKEND))
    if not quiet:
        counts = ", ".join(
            f"{n} {unit_differences(a, b)[0]}" for n, a, b in zip(MX_NAMES, got, want, strict=True)
        )
        _log(f"  {what}: differ {counts} -> {'ok' if ok else 'FAIL'}")
    return ok


def check() -> bool:
    ok = True
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, hidden, weight, groups in (
            (77, 96, True, True),
            (2048, 1408, True, True),
            (4096, 2048, False, False),
        ):
            args, _ = _group_grad_case(rows, hidden, dtype, seed=rows, weight=weight, groups=groups)
            ok &= _compare_gg(args)
        for m, c, groups in ((100, 128, 3), (2048, 2048, 8), (4099, 1088, None), (3000, 4096, 33)):
            args, _ = _mx_case(m, c, groups, dtype, seed=m, ragged=True)
            ok &= _compare_mx(args)
    args, _ = _mx_case(2048, 2048, 8, torch.bfloat16, seed=5, ragged=True)
    ok &= _compare_mx(args, dst_dtype=torch.float8_e5m2)
    ok &= _compare_mx(args, scale_alg=0)
    ok &= _compare_mx(args, activate_left=False)
    # Extreme magnitudes: overflow to inf/saturation, subnormal blocks, NaN.
    x, dy, ends = args
    x = x.clone()
    x[:40] *= 2.0**100
    x[40:80] *= 2.0**-120
    x[100, 7] = float("nan")
    for kw in ({}, {"dst_dtype": torch.float8_e5m2}, {"scale_alg": 0}):
        ok &= _compare_mx((x, dy * 2.0**60, ends), **kw)
    # Magnitudes spread over 24 binades inside every block: FP8 subnormals, ties and zeros after scaling
    # (the hardware cast's subnormal rounding and the byte order of its packed results).
    g = _gen(17)
    spread = torch.exp2(-torch.randint(0, 24, dy.shape, device=DEVICE, generator=g).float())
    for kw in ({}, {"dst_dtype": torch.float8_e5m2}, {"scale_alg": 0}):
        ok &= _compare_mx((args[0], (dy.float() * spread).to(dy.dtype), ends), **kw)
    return ok


BIG_SHAPE = (2**20 + 64, 2048)  # x: 2.15e9 elements


def check_big() -> bool:
    """One tensor above 2**31 elements per op; compare the last rows with the reference on just those."""
    m, c = BIG_SHAPE
    x = torch.randn(m, c, device=DEVICE, dtype=torch.bfloat16)
    dy = torch.randn(m, c // 2, device=DEVICE, dtype=torch.bfloat16)
    got = MXQ(x, dy, backend=BACKEND)
    tail = slice(m - 256, m)  # starts on a 64-row boundary: its mxscale2 rows are the last four
    want = MXQ(x[tail], dy[tail], backend="reference")
    got_tail = (got[0][tail], got[1][tail], got[2][tail], got[3][(m - 256) // 64 :])
    ok = _verdict("big mx", lambda: _compare.assert_mx_matches(_cpu(got_tail), _cpu(want), BACKEND))
    _log(f"  big mx {tuple(x.shape)}: last 256 rows -> {'ok' if ok else 'FAIL'}")
    del got, want
    w = torch.rand(m, device=DEVICE)
    gx, gw = GG(dy, x, w, dy, None, 7.0, backend=BACKEND)
    want = GG(dy[tail], x[tail], w[tail], dy[tail], None, 7.0, backend="reference")
    good = _verdict(
        "big group_grad",
        lambda: _compare.assert_group_grad_matches(_cpu((gx[tail], gw[tail])), _cpu(want), BACKEND),
    )
    _log(f"  big group_grad {tuple(x.shape)}: last 256 rows -> {'ok' if good else 'FAIL'}")
    return ok and good


# ------------------------------------------------------------------------------------------- timing


def _bench(fn) -> float:
    from triton.testing import do_bench_cudagraph

    fn()
    return do_bench_cudagraph(fn, rep=100, return_mode="median")


def _copy_ms(nbytes: int) -> float:
    """A device copy that reads nbytes / 2 and writes nbytes / 2: the op's bytes moved, read + written."""
    src = torch.empty(nbytes // 8, dtype=torch.float32, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    return _bench(lambda: dst.copy_(src))


GG_SHAPES = ((8192, 2048), (16384, 4096))
MX_SHAPES = ((8192, 4096, None), (16384, 4096, 8), (32768, 7168, 32))


def bench_cases():
    for rows, hidden in GG_SHAPES:
        args, nbytes = _group_grad_case(rows, hidden, torch.bfloat16)
        yield (
            "swiglu_group_grad",
            f"{rows}x{2 * hidden}",
            args,
            nbytes,
            lambda a=args: GG(*a, backend=BACKEND),
        )
    for m, c, groups in MX_SHAPES:
        args, nbytes = _mx_case(m, c, groups, torch.bfloat16)
        name = f"mx_dual_axis G={groups or 0}"
        yield name, f"{m}x{c}", args, nbytes, lambda a=args: MXQ(*a, backend=BACKEND)


def run_bench(copy_ms: dict) -> list[dict]:
    rows = []
    for name, shape, _args, nbytes, fn in bench_cases():
        t = _bench(fn)
        if nbytes not in copy_ms:
            copy_ms[nbytes] = _copy_ms(nbytes)
        rows.append({"op": name, "shape": shape, "bytes": nbytes, "ms": t, "copy_ms": copy_ms[nbytes]})
        _log(f"  {name} {shape}: {t:.4f} ms, {100 * copy_ms[nbytes] / t:.1f} % of copy")
    return rows


# The first entry of each list is the default in swiglu_ops.triton; <= 30 variants in all (a short lease).
# Launch-configuration variants; the first of each list is the shipped default. HW_CONVERSIONS selects the
# PTX conversion instructions (opt-in until measured here) instead of the integer transcriptions.
_GG = dict(GROUP_GRAD_ROWS=4, GROUP_GRAD_BLOCK_H=256, GROUP_GRAD_NUM_WARPS=4, GROUP_GRAD_PREFETCH=True)
TUNE_GG = [
    {**_GG, "GROUP_GRAD_PREFETCH": prefetch, "HW_CONVERSIONS": hw}
    for hw, prefetch in ((False, True), (False, False), (True, True), (True, False))
] + [
    dict(GROUP_GRAD_ROWS=r, GROUP_GRAD_BLOCK_H=h, GROUP_GRAD_NUM_WARPS=w, GROUP_GRAD_PREFETCH=True,
         HW_CONVERSIONS=True)
    for r, h, w in ((2, 256, 2), (8, 256, 8), (4, 512, 8), (2, 512, 4), (1, 1024, 4))
]  # fmt: skip
TUNE_MX = [
    dict(MX_BLOCK_N=b, MX_NUM_WARPS=w, HW_CONVERSIONS=hw)
    for hw, (b, w) in [(False, t) for t in ((64, 8), (32, 4), (128, 8))]
    + [(True, t) for t in ((128, 8), (64, 8), (32, 4), (64, 4), (128, 4), (256, 8), (32, 2))]
]


def run_tune(copy_ms: dict) -> list[dict]:
    from swiglu_ops import triton as tb

    defaults = {k: getattr(tb, k) for k in {*TUNE_GG[0], *TUNE_MX[0]}}
    out = []
    try:
        for variants, op in ((TUNE_GG, "gg"), (TUNE_MX, "mx")):
            for v in variants:
                for k, val in v.items():
                    setattr(tb, k, val)
                try:
                    _tune_variant(op, v, copy_ms, out)
                except Exception as exc:  # noqa: BLE001 - one variant that fails to build must not end the run
                    _log(f"  tune {op} {v}: {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        for k, val in defaults.items():
            setattr(tb, k, val)
    return out


def _tune_variant(op: str, v: dict, copy_ms: dict, out: list) -> None:
    """Check the variant against the reference on a ragged case, then time it on the benchmark shapes."""
    if op == "gg":
        args, _ = _group_grad_case(333, 1408, torch.bfloat16, seed=3)
        good = _compare_gg(args, quiet=True)
    else:
        args, _ = _mx_case(1000, 2048, 5, torch.bfloat16, seed=3, ragged=True)
        good = _compare_mx(args, quiet=True)
    for name, shape, _a, nbytes, fn in bench_cases():
        if name.startswith("swiglu") != (op == "gg"):
            continue
        t = _bench(fn)
        pct = 100 * copy_ms[nbytes] / t
        out.append({"op": name, "shape": shape, "variant": v, "ok": good, "ms": t, "pct": pct})
        _log(f"  tune {name} {shape} {v}: {t:.4f} ms {pct:.1f} % {'ok' if good else 'WRONG'}")


def run_baselines(rows: list[dict], budget: float) -> None:
    from triton.testing import do_bench

    gg_ref = torch.compile(lambda *a: GG(*a, backend="reference"))
    mx_ref = torch.compile(lambda x, dy, ends: MXQ(x, dy, ends, backend="reference"))
    for row, (name, _shape, args, _n, _fn) in zip(rows, bench_cases(), strict=True):
        row["compiled_ref_ms"] = float("nan")
        if time.perf_counter() - T0 > budget:
            _log(f"  compiled reference for {name} {row['shape']}: skipped (budget spent)")
            continue
        ref = (lambda a=args: gg_ref(*a)) if name.startswith("swiglu") else (lambda a=args: mx_ref(*a))
        try:
            ref()
            row["compiled_ref_ms"] = do_bench(ref, rep=100, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - a baseline failure must not hide the op's numbers
            _log(f"  compiled reference unavailable: {type(exc).__name__}: {str(exc)[:160]}")
        _log(f"  compiled reference {name} {row['shape']}: {row['compiled_ref_ms']:.3f} ms")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tune", action="store_true", help="also time launch-configuration variants")
    p.add_argument("--no-check", action="store_true", help="skip the conformance sweep and the big case")
    p.add_argument("--no-baselines", action="store_true", help="skip the compiled reference")
    p.add_argument("--budget", type=float, default=420.0, help="seconds after which baselines are skipped")
    p.add_argument("--json", help="write all results to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_triton: no CUDA device; the Triton backend benchmark needs an NVIDIA GPU (nothing run).")
        return 0
    import triton

    _log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    result: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    ok = True
    if not args.no_check:
        _log("check: triton against the reference")
        ok = result["check_ok"] = check()
        _log("check big (> 2**31 elements)")
        big = result["big_ok"] = check_big()
        ok &= big
        torch.cuda.empty_cache()
    _log("bench")
    copy_ms: dict = {}
    rows = result["bench"] = run_bench(copy_ms)
    if args.tune:
        _log("tune")
        result["tune"] = run_tune(copy_ms)
    if not args.no_baselines:
        _log("baselines: reference under torch.compile")
        run_baselines(rows, args.budget)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{result['device']}")
    header = ("op", "shape", "MB", "ms", "GB/s", "% copy", "compiled ref ms", "speedup")
    print("{:<24} {:>12} {:>8} {:>8} {:>8} {:>7} {:>16} {:>8}".format(*header))
    for r in rows:
        t, ref = r["ms"], r.get("compiled_ref_ms", float("nan"))
        gbs, pct = r["bytes"] / t / 1e6, 100 * r["copy_ms"] / t
        print(f"{r['op']:<24} {r['shape']:>12} {r['bytes'] / 1e6:>8.1f} {t:>8.4f} {gbs:>8.0f} "
              f"{pct:>6.1f}% {ref:>16.4f} {ref / t:>7.1f}x")  # fmt: skip
    if not args.no_check:
        print("conformance:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
