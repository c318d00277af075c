"""CPU benchmark of both operators against the copy roofline and the reference (eager and compiled).

    swiglu-ops bench                 # full run, a few minutes; results in bench_results/
    swiglu-ops bench --quick         # tiny shapes, no torch.compile, seconds (smoke test)
    python benchmarks/bench_cpu.py   # the same

For every case, in one run on the same machine:

- ``fused``: the op with ``backend="cpu"`` as called (outputs allocated by the op), and ``fused_out`` with
  preallocated ``out=`` tensors reused across calls;
- ``copy``: a plain ``Tensor.copy_`` of half the op's bytes into a reused buffer, i.e. the same number of
  bytes read + written (inputs read + outputs written by the op). % of copy roofline = copy time / op time;
- ``eager``: the reference backend; ``compiled``: the reference backend's kernel functions under
  ``torch.compile`` (graph breaks allowed: its group loop is Python). For swiglu_group_grad, grad_weight
  is a plain ``torch.sum`` there instead of the reference's NumPy-order pairwise sum, which Inductor
  cannot compile in reasonable time (that only makes the baseline faster).

Times are medians over repeats. Writes ``bench_cpu.csv`` and ``bench_cpu.json`` (with first-call latency
of the Numba kernels, cold compile and warm cache, measured in fresh subprocesses) and ``bench_cpu.png``
(% of copy roofline over sizes) into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import _api, mx, reference, swiglu_backward_mx_quant_dual_axis, swiglu_group_grad

OPS = ("swiglu_group_grad", "swiglu_bwd_mx_quant")


@dataclass
class Case:
    op: str
    rows: int
    cols: int  # 2H (the x last dim)
    dtype: torch.dtype
    groups: int = 0  # 0: no group_index
    label: str = ""

    @property
    def name(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        g = f" G={self.groups}" if self.groups else ""
        return f"{self.op} M={self.rows} 2H={self.cols} {dt}{g}"


@dataclass
class Result:
    op: str
    rows: int
    cols: int
    dtype: str
    groups: int
    label: str
    mbytes: float
    copy_ms: float
    fused_ms: float
    fused_out_ms: float
    eager_ms: float
    compiled_ms: float | None
    compiled_error: str = ""  # why the compiled baseline is missing (e.g. the C++ compiler failed)
    pct_roofline: float = field(init=False)
    pct_roofline_out: float = field(init=False)
    speedup_vs_compiled: float | None = field(init=False)
    speedup_vs_eager: float = field(init=False)

    def __post_init__(self):
        self.pct_roofline = 100 * self.copy_ms / self.fused_ms
        self.pct_roofline_out = 100 * self.copy_ms / self.fused_out_ms
        self.speedup_vs_compiled = None if self.compiled_ms is None else self.compiled_ms / self.fused_ms
        self.speedup_vs_eager = self.eager_ms / self.fused_ms


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def _time_ms(fn, repeats: int) -> float:
    fn()  # warm-up: JIT compilation, caches, first-touch of reused buffers
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _uneven_counts(rows: int, groups: int, gen: torch.Generator) -> torch.Tensor:
    """``groups`` positive, uneven row counts summing to ``rows`` (like a skewed MoE router)."""
    weights = torch.rand(groups, generator=gen) ** 2 + 0.05
    counts = (weights / weights.sum() * rows).floor().to(torch.int64).clamp(min=1)
    counts[-1] += rows - counts.sum()
    return counts


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _prepare(case: Case, gen: torch.Generator):
    """(inputs of the public op, inputs of the reference kernel function, output allocator, bytes moved)."""
    m, c, dt = case.rows, case.cols, case.dtype
    x = (torch.randn(m, c, generator=gen) * 3).to(dt)
    dy = torch.randn(m, c // 2, generator=gen).to(dt)
    counts = _uneven_counts(m, case.groups, gen) if case.groups else None
    if case.op == "swiglu_group_grad":
        weight = torch.rand(m, 1, generator=gen) + 0.5
        y_origin = torch.randn(m, c // 2, generator=gen).to(dt)
        args = (dy, x, weight, y_origin, counts, 7.0)
        grad_x, grad_weight = torch.empty_like(x), torch.empty(m, dtype=torch.float32)
        valid = None if counts is None else _api._valid_rows(counts, m)
        kernel_args = (dy, x, weight.view(m), y_origin, valid, 7.0, grad_x, grad_weight)
        outs = (grad_x, grad_weight.view(m, 1))
    else:
        ends = None if counts is None else counts.cumsum(0)
        args = (x, dy, ends)
        outs = _api.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="cpu")
        y1, s1, y2, s2 = (t.view(torch.uint8) for t in outs)
        kernel_args = (
            x.view(1, m, c),
            dy.view(1, m, c // 2),
            ends,
            True,
            1,
            mx.E4M3FN,
            y1.view(1, m, c),
            s1.view(1, m, c // 32),
            y2.view(1, m, c),
            s2.view(1, *s2.shape),
        )
    nbytes = _nbytes(*(a for a in args if isinstance(a, torch.Tensor)), *outs)
    return args, kernel_args, outs, nbytes


def _call(op: str, args, backend: str, out=None):
    if op == "swiglu_group_grad":
        return swiglu_group_grad(*args, backend=backend, out=out)
    return swiglu_backward_mx_quant_dual_axis(*args, backend=backend, out=out)


def _reference_group_grad_plain_sum(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight):
    """The reference group_grad with grad_weight as a plain ``torch.sum``: the reference's NumPy-order
    pairwise sum unrolls into thousands of tiny ops that Inductor takes many minutes to compile."""
    reference.swiglu_group_grad(dy, x, weight, y_origin, valid_rows, clamp, grad_x, None)
    grad_weight.copy_((dy.float() * y_origin.float()).sum(-1))


_COMPILED = {}


def _compiled_reference(op: str):
    """The reference backend's kernel function under torch.compile (one compiled function per op)."""
    if op not in _COMPILED:
        fn = _reference_group_grad_plain_sum if op == "swiglu_group_grad" else reference.swiglu_bwd_mx_quant
        _COMPILED[op] = torch.compile(fn, dynamic=True)
    return _COMPILED[op]


def run_case(case: Case, *, repeats: int, compile_reference: bool, gen: torch.Generator) -> Result:
    args, kernel_args, outs, nbytes = _prepare(case, gen)
    src = torch.ones(nbytes // 2, dtype=torch.uint8)  # written: a fresh buffer would read the zero page
    dst = torch.empty_like(src)
    _progress(f"{case.name}: copy roofline ({nbytes / 1e6:.0f} MB)")
    copy_ms = _time_ms(lambda: dst.copy_(src), repeats)
    _progress(f"{case.name}: fused cpu kernel")
    fused_ms = _time_ms(lambda: _call(case.op, args, "cpu"), repeats)
    fused_out_ms = _time_ms(lambda: _call(case.op, args, "cpu", out=outs), repeats)
    slow_repeats = max(1, repeats // 3)
    _progress(f"{case.name}: reference eager")
    eager_ms = _time_ms(lambda: _call(case.op, args, "reference"), slow_repeats)
    compiled_ms, compiled_error = None, ""
    if compile_reference:
        _progress(f"{case.name}: reference under torch.compile (compiling...)")
        fn = _compiled_reference(case.op)
        try:
            compiled_ms = _time_ms(lambda: fn(*kernel_args), slow_repeats)
        except Exception as exc:  # noqa: BLE001 - a failing baseline must not hide the op's numbers
            compiled_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
            _progress(f"{case.name}: compiled reference unavailable ({compiled_error})")
    return Result(
        case.op,
        case.rows,
        case.cols,
        str(case.dtype).removeprefix("torch."),
        case.groups,
        case.label,
        nbytes / 1e6,
        copy_ms,
        fused_ms,
        fused_out_ms,
        eager_ms,
        compiled_ms,
        compiled_error,
    )


def default_cases(quick: bool) -> list[Case]:
    cases = []
    for op in OPS:
        if quick:
            cases += [Case(op, 64, 256, torch.bfloat16, label="size"), Case(op, 256, 512, torch.bfloat16, 4)]
            continue
        for m in (256, 1024, 4096, 8192):
            cases.append(Case(op, m, 4096, torch.bfloat16, label="size" if m != 8192 else "headline"))
        cases += [
            Case(op, 8192, 4096, torch.bfloat16, groups=8, label="8 uneven groups"),
            Case(op, 8192, 4096, torch.float16, label="fp16"),
        ]
    return cases


_LATENCY_SCRIPT = """
import time, torch
t0 = time.perf_counter()
import swiglu_ops
x = torch.randn(256, 1024).bfloat16(); dy = torch.randn(256, 512).bfloat16()
t1 = time.perf_counter()
swiglu_ops.swiglu_group_grad(dy, x, backend="cpu")
t2 = time.perf_counter()
swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="cpu")
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def first_call_latency() -> dict:
    """Import time and first bf16 call of each op in fresh interpreters: cold (empty Numba cache, so the
    kernels are compiled) and warm (the on-disk cache written by the cold run)."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold", "warm"):
            _progress(f"first-call latency, {label} Numba cache (fresh interpreter)")
            res = subprocess.run(
                [sys.executable, "-c", _LATENCY_SCRIPT], env=env, capture_output=True, text=True, check=True
            )
            imp, gg, mxq = (float(v) for v in res.stdout.split())
            out[label] = {"import_s": imp, "swiglu_group_grad_s": gg, "swiglu_bwd_mx_quant_s": mxq}
    return out


def _fmt(v, spec: str, suffix: str = "") -> str:
    width = int(spec.strip(">").split(".")[0]) + len(suffix)
    return "-".rjust(width) if v is None else format(v, spec) + suffix


def format_table(results: list[Result]) -> str:
    head = (
        f"{'case':<44} {'MB':>6} {'copy':>7} {'fused':>7} {'%roof':>6} {'out=':>7} {'%roof':>6} "
        f"{'eager':>8} {'compiled':>8} {'x comp':>7} {'x eager':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        g = f" G={r.groups}" if r.groups else ""
        name = f"{r.op} {r.rows}x{r.cols} {r.dtype}{g}"
        lines.append(
            f"{name:<44} {r.mbytes:>6.0f} {r.copy_ms:>7.2f} {r.fused_ms:>7.2f} {r.pct_roofline:>5.0f}% "
            f"{r.fused_out_ms:>7.2f} {r.pct_roofline_out:>5.0f}% {r.eager_ms:>8.1f} "
            f"{_fmt(r.compiled_ms, '>8.1f')} {_fmt(r.speedup_vs_compiled, '>6.1f', 'x')} "
            f"{r.speedup_vs_eager:>6.1f}x"
        )
    lines.append(
        "times in ms (median); %roof = copy time / op time; x comp / x eager = speedup of the "
        "fused op as called"
    )
    for r in results:
        if r.compiled_error:
            g = f" G={r.groups}" if r.groups else ""
            lines.append(
                f"compiled reference failed for {r.op} {r.rows}x{r.cols} {r.dtype}{g}: {r.compiled_error}"
            )
    return "\n".join(lines)


def _plot(results: list[Result], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _progress("matplotlib is not installed: no plot")
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for op in OPS:
        pts = sorted(
            (r.mbytes, r.pct_roofline, r.pct_roofline_out)
            for r in results
            if r.op == op and r.label in ("size", "headline")
        )
        if pts:
            mb, pct, pct_out = zip(*pts, strict=True)
            ax.plot(mb, pct, "o-", label=f"{op} (as called)")
            ax.plot(mb, pct_out, "s--", label=f"{op} (out=)")
    ax.axhline(50, color="grey", lw=0.8, ls=":")
    ax.axhline(25, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call (MB), bf16, 2H = x last dim")
    ax.set_ylabel("% of copy roofline")
    ax.set_title("swiglu_ops cpu backend")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="swiglu-ops bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes, no torch.compile (smoke test)")
    p.add_argument("--out", type=Path, default=Path("bench_results"), help="output folder")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd reference")
    p.add_argument("--no-latency", action="store_true", help="skip the first-call latency subprocesses")
    args = p.parse_args(argv)
    ok, why = _api.backend_status("cpu", torch.device("cpu"))
    if not ok:
        print(f"the cpu backend is not available: {why}", file=sys.stderr)
        return 1
    repeats = args.repeats or (3 if args.quick else 7)
    compile_reference = not (args.quick or args.no_compile)
    gen = torch.Generator().manual_seed(0)
    results = []
    cases = default_cases(args.quick)
    for i, case in enumerate(cases, 1):
        _progress(f"[{i}/{len(cases)}] {case.name}")
        results.append(run_case(case, repeats=repeats, compile_reference=compile_reference, gen=gen))
    latency = None if (args.quick or args.no_latency) else first_call_latency()
    table = format_table(results)
    print(table)
    if latency:
        for label, v in latency.items():
            print(
                f"first call ({label} Numba cache): import {v['import_s']:.2f} s, swiglu_group_grad "
                f"{v['swiglu_group_grad_s']:.2f} s, swiglu_bwd_mx_quant {v['swiglu_bwd_mx_quant_s']:.2f} s"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    with open(args.out / "bench_cpu.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    meta = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "quick": args.quick,
        "repeats": repeats,
    }
    try:
        import numba

        meta.update(numba=numba.__version__, numba_threads=numba.get_num_threads())
    except ImportError:  # pragma: no cover - the cpu backend needs numba
        pass
    (args.out / "bench_cpu.json").write_text(
        json.dumps({"meta": meta, "results": rows, "first_call_latency": latency}, indent=2)
    )
    plotted = _plot(results, args.out / "bench_cpu.png")
    _progress(f"wrote bench_cpu.csv, bench_cpu.json{', bench_cpu.png' if plotted else ''} into {args.out}")
    return 0 if all(math.isfinite(r.fused_ms) for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
