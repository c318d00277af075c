"""CPU benchmark of every operator against the copy roofline and the reference (eager and compiled).

    swiglu-ops bench                 # full run, several minutes; results in bench_results/
    swiglu-ops bench --quick         # tiny shapes, no torch.compile, seconds (smoke test)
    swiglu-ops bench --ops swiglu_mx_quant --no-compile   # a subset
    python benchmarks/bench_cpu.py   # the same

For every case, in one run on the same machine:

- ``fused``: the op with ``backend="cpu"`` as called (outputs allocated by the op), and ``fused_out`` with
  preallocated ``out=`` tensors reused across calls; ``isa`` names the instruction set of the C kernels
  (the machine's best unless the case asks for another, e.g. ``portable``);
- ``copy``: a plain ``Tensor.copy_`` of half the op's bytes into a reused buffer, i.e. the same number of
  bytes read + written (inputs read + outputs written by the op), from 2 MiB up rounded down to whole
  4 KiB pages (at most 4 KiB less): PyTorch splits the copy among its threads at the middle, and a length
  32 bytes past a multiple of 64 (the 8 int64 group ends) put the second thread's half 16 bytes off its
  cache lines, every vector access split in two (9-14 % slower, which read as the op beating the copy).
  % of copy roofline = copy time / op time;
- ``eager``: the reference backend; ``compiled``: the reference backend's kernel functions under
  ``torch.compile`` (graph breaks allowed: its group loop is Python), for the cases marked as baselines,
  each timed in turns with the fused op (one call of each per round): ``x eager`` and ``x comp`` are ratios
  of the same minutes of the host.
  For swiglu_group_grad, grad_weight is a plain ``torch.sum`` there instead of the reference's NumPy-order
  pairwise sum, which Inductor cannot compile in reasonable time (that only makes the baseline faster).
  ``compiled_faults`` counts the page faults of one compiled call: Inductor's code for swiglu_group_grad
  writes a 64 MiB temporary at M=8192, 2H=4096 that glibc maps afresh on every call in some processes and
  reuses in others (45 against 27 ms; 16,385 faults per call in the slow mode), and the table says when a
  row's baseline paid for fresh memory.

Times are medians over repeats. The copy and the op (as called and with ``out=``) are timed in turns, one
call of each per round, so that the ratio sees the same moments of a shared, noisy host: timed one after the
other, a slow minute that fell on one of them alone moved a percentage by 20 points between runs. Every
timed call (the copy's and the baselines' too) starts with a cold last-level cache: a buffer of twice its
size is written before it (not timed; not with ``--quick``). Without that, a call found part of its inputs
where the call before it had left them, depending on the order of the turns and on the host's other tenants
(480 MiB of L3 on the Intel host: the MX backward took 9.0 ms right after a call on the same inputs, 11.4
after the copy, and the copy of the forward's bytes 2.6-4.5 ms from run to run); all of them now read and
write memory.

Every case's results are also checked against the reference backend's on the same inputs
(:func:`swiglu_ops.ops.checks.compare_outputs`, the rule of ``swiglu-ops verify``: bitwise but for the
contract's near ties, fp32 within 4 ulp, grad_weight within its relative tolerance): a fast kernel that is
wrong is reported (``check``; ``RESULTS DIFFER`` under the table) and makes the command fail, however fast
it ran. The sweep checks its cases up to 8192 rows.

Writes ``bench_cpu.csv`` and ``bench_cpu.json`` (with the first-call latency of each operator in a fresh
interpreter) and ``bench_cpu.png`` (% of copy roofline and time over sizes) into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .numerics import mx
from .numerics.glu import GluParams
from .ops import api, registry
from .ops import validate as V
from .ops.checks import call_values, compare_outputs
from .ops.table import PUBLIC

#: The benchmarked operators, by their kernel contract's name (the table's rows: one per public operator).
OPS = tuple(op.kernel for op in PUBLIC)
#: The public function of each benchmarked op.
_PUBLIC = {op.kernel: op.name for op in PUBLIC}
_DST = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}


@dataclass
class Case:
    op: str
    rows: int
    cols: int  # the x last dim (2H)
    dtype: torch.dtype
    groups: int = 0  # 0: no group_index
    label: str = ""
    dst: str = ""  # swiglu_mx_quant: the element format (default e4m3)
    isa: str = ""  # the cpu backend's instruction set ("": the machine's best)
    baselines: bool = True  # time the reference eager and compiled too
    weighted: bool = False  # the MX operators with a routing weight (weight=, spec 7.1)
    threads: int = 0  # torch threads while timed (0: as set)
    check: bool = True  # compare the results with the reference's (ops.checks)

    @property
    def name(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        extra = "".join(f" {v}" for v in (f"G={self.groups}" if self.groups else "", self.dst, self.isa) if v)
        tail = (" weighted" if self.weighted else "") + (f" threads={self.threads}" if self.threads else "")
        return f"{self.op} M={self.rows} 2H={self.cols} {dt}{extra}{tail}"


@dataclass
class Result:
    op: str
    rows: int
    cols: int
    dtype: str
    groups: int
    label: str
    dst: str
    isa: str
    mbytes: float
    copy_ms: float
    fused_ms: float
    fused_out_ms: float
    eager_ms: float | None
    compiled_ms: float | None
    compiled_error: str = ""  # why the compiled baseline is missing (e.g. the C++ compiler failed)
    #: weighted cases: the same call without weight, timed in the same turns
    unweighted_ms: float | None = None
    threads: int = 0
    #: minor page faults in one call of the compiled reference (fresh temporaries fault page by page)
    compiled_faults: int | None = None
    #: the fused op's time in the turns of the eager / compiled baseline (their speed-ups' denominators)
    eager_turns_ms: float | None = None
    compiled_turns_ms: float | None = None
    #: the results against the reference's (ops.checks): "ok", "FAIL: ..." or "" (not checked)
    check: str = ""
    pct_roofline: float = field(init=False)
    pct_roofline_out: float = field(init=False)
    speedup_vs_compiled: float | None = field(init=False)
    speedup_vs_eager: float | None = field(init=False)

    def __post_init__(self):
        self.pct_roofline = 100 * self.copy_ms / self.fused_ms
        self.pct_roofline_out = 100 * self.copy_ms / self.fused_out_ms
        speedup = lambda base, op: None if base is None else base / (op or self.fused_ms)  # noqa: E731
        self.speedup_vs_compiled = speedup(self.compiled_ms, self.compiled_turns_ms)
        self.speedup_vs_eager = speedup(self.eager_ms, self.eager_turns_ms)


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


#: page faults per call of the compiled reference from which the table says so (4 MiB of 4 KiB pages)
FAULTS_NOTED = 1024


def _time_ms(fn, repeats: int, evict=None) -> float:
    return _time_in_turns_ms([fn], repeats, evict)[0]


def _time_in_turns_ms(fns, repeats: int, evict=None) -> list[float]:
    """The median time of each of ``fns``, timed in turns: one call of each per round, ``repeats`` rounds;
    ``evict`` (untimed) before each call."""
    for fn in fns:
        fn()  # warm-up: JIT compilation, caches, first-touch of reused buffers
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, record in zip(fns, times, strict=True):
            if evict is not None:
                evict()
            t0 = time.perf_counter()
            fn()
            record.append(time.perf_counter() - t0)
    return [1e3 * statistics.median(t) for t in times]


def faults_per_call(fn) -> int:
    """The minor page faults of one call of ``fn`` (this process's, from getrusage): each page of fresh
    memory that a call writes faults once, so a call that maps its temporaries afresh pays for that on every
    call, at the allocator's whim (glibc maps large blocks afresh or reuses them, by the process's
    history)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _uneven_counts(rows: int, groups: int, gen: torch.Generator) -> torch.Tensor:
    """``groups`` positive, uneven row counts summing to ``rows`` (like a skewed MoE router)."""
    weights = torch.rand(groups, generator=gen) ** 2 + 0.05
    counts = (weights / weights.sum() * rows).floor().to(torch.int64).clamp(min=1)
    counts[-1] += rows - counts.sum()
    return counts


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


_GPT_OSS = GluParams(interleaved=True, clipped=True, alpha=1.702, limit=7.0, bias=1.0)


def _prepare(case: Case, gen: torch.Generator):
    """(inputs of the public op, the reference kernel function's arguments, out= tensors, bytes moved)."""
    m, c, dt = case.rows, case.cols, case.dtype
    x = (torch.randn(m, c, generator=gen) * 3).to(dt)
    dy = torch.randn(m, c // 2, generator=gen).to(dt)
    counts = _uneven_counts(m, case.groups, gen) if case.groups else None
    valid = None if counts is None else V.valid_rows(counts, m)
    ends = None if counts is None else counts.cumsum(0)
    if case.op == "swiglu_group_grad":
        weight = torch.rand(m, 1, generator=gen) + 0.5
        y_origin = torch.randn(m, c // 2, generator=gen).to(dt)
        args, kwargs = (dy, x, weight, y_origin, counts, 7.0), {}
        grad_x, grad_weight = torch.empty_like(x), torch.empty(m, dtype=torch.float32)
        kernel_args = (dy, x, weight.view(m), y_origin, valid, 7.0, grad_x, grad_weight)
        outs = (grad_x, grad_weight.view(m, 1))
    elif case.op in ("clipped_swiglu", "clipped_swiglu_grad"):  # GPT-OSS's defaults: interleaved, 1.702, 7, 1
        backward = case.op == "clipped_swiglu_grad"
        args, kwargs = ((dy, x, counts) if backward else (x, counts)), {}
        out = torch.empty_like(x) if backward else torch.empty_like(dy)
        kernel_args = (dy, x, valid, _GPT_OSS, out) if backward else (x, valid, _GPT_OSS, out)
        outs = out
    else:
        if case.op == "swiglu_bwd_mx_quant":
            args, kwargs = (x, dy, ends), {}
            fmt, width = mx.E4M3FN, c
        else:
            dst = _DST[case.dst or "e4m3"]
            args, kwargs = (x, ends), {"dst_dtype": dst}
            fmt, width = mx.element_format(dst), c // 2
        if case.weighted:
            kwargs["weight"] = torch.rand(m, generator=gen) + 0.5
        outs = _call(case.op, args, kwargs, "cpu")
        y1, s1, y2, s2 = (t.view(torch.uint8) for t in outs[:4])
        ybytes = width // 2 if fmt.packed else width
        scale_alg = 0 if fmt.packed else 1
        kernel_args = (
            x.view(1, m, c),
            *((dy.view(1, m, c // 2),) if case.op == "swiglu_bwd_mx_quant" else ()),
            ends,
            GluParams(),
            scale_alg,
            fmt,
            *(() if case.op == "swiglu_bwd_mx_quant" else ("rint",)),
            y1.view(1, m, ybytes),
            s1.view(1, m, -1),
            y2.view(1, m, ybytes),
            s2.view(1, *s2.shape),
        )
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    nbytes = _nbytes(*inputs, *(outs if isinstance(outs, tuple) else (outs,)))
    return args, kwargs, kernel_args, outs, nbytes


def _call(op: str, args, kwargs, backend: str, out=None):
    return getattr(api, _PUBLIC[op])(*args, **kwargs, backend=backend, out=out)


def _reference(kernel: str):
    """The reference backend's kernel function of a contract, from the registry."""
    return registry.select("reference", kernel, kernel, torch.device("cpu"), None)[1]


def _reference_group_grad_plain_sum(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight):
    """The reference group_grad with grad_weight as a plain ``torch.sum``: the reference's NumPy-order
    pairwise sum unrolls into thousands of tiny ops that Inductor takes many minutes to compile."""
    _reference("swiglu_group_grad")(dy, x, weight, y_origin, valid_rows, clamp, grad_x, None)
    grad_weight.copy_((dy.float() * y_origin.float()).sum(-1))


def reference_baseline(op: str):
    """What the compiled baseline compiles: the reference kernel of ``op``."""
    return _reference_group_grad_plain_sum if op == "swiglu_group_grad" else _reference(op)


_COMPILED = {}


def _compiled_reference(op: str):
    """The reference backend's kernel function under torch.compile (one compiled function per op)."""
    if op not in _COMPILED:
        _COMPILED[op] = torch.compile(reference_baseline(op), dynamic=True)
    return _COMPILED[op]


def _isa(name: str):
    """The cpu backend's instruction set for a case ("" = the default one)."""
    if not name:
        return contextlib.nullcontext()
    from .backends import cpu

    return cpu.instruction_set(name)


def last_level_cache_bytes() -> int:
    """The size of CPU 0's last-level cache in bytes (Linux sysfs: the highest cache level's ``size``), 0
    where the system does not say. (Python's ``os.sysconf`` has no cache names, so it cannot tell.)"""
    levels = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        digits = size[:-1] if size[-1:] in ("K", "M", "G") else size
        if digits.isdigit():
            levels[level] = max(levels.get(level, 0), int(digits) * unit)
    return levels[max(levels)] if levels else 0


def cache_evict_bytes() -> int:
    """Twice the last-level cache, 2 GiB at most; 256 MiB where the system does not say its size."""
    llc = last_level_cache_bytes()
    return min(2 * llc, 2 << 30) if llc > 0 else 256 << 20


def cache_evictor():
    """A function that clears the last-level cache of everything else: it writes cache_evict_bytes()."""
    buf = torch.empty(cache_evict_bytes(), dtype=torch.uint8)
    return lambda: buf.fill_(1)


def run_case(
    case: Case, *, repeats: int, compile_reference: bool, gen: torch.Generator, evict=None
) -> Result:
    from .backends import cpu

    args, kwargs, kernel_args, outs, nbytes = _prepare(case, gen)
    copy_bytes = nbytes // 2
    if copy_bytes >= 1 << 20:  # whole pages: every thread's share starts on a cache line (docstring)
        copy_bytes -= copy_bytes % 4096
    src = torch.ones(copy_bytes, dtype=torch.uint8)  # written: a fresh buffer would read the zero page
    dst = torch.empty_like(src)
    saved_threads = torch.get_num_threads()
    got, want = [None], [None]  # the last results of the op and of the reference

    def fused():
        got[0] = _call(case.op, args, kwargs, "cpu")

    def eager():
        want[0] = _call(case.op, args, kwargs, "reference")

    eager_ms = compiled_ms = compiled_faults = eager_turns_ms = compiled_turns_ms = None
    compiled_error = check = ""
    with _isa(case.isa), _threads(case.threads):
        isa = cpu.LIBRARY.isa
        _progress(f"{case.name}: fused cpu kernel and the copy roofline ({nbytes / 1e6:.0f} MB), in turns")
        calls = [lambda: dst.copy_(src), fused, lambda: _call(case.op, args, kwargs, "cpu", out=outs)]
        if case.weighted:  # the unweighted call in the same turns: the weight's cost, same minute of the host
            plain = {k: v for k, v in kwargs.items() if k != "weight"}
            calls.append(lambda: _call(case.op, args, plain, "cpu"))
        copy_ms, fused_ms, fused_out_ms, *unweighted = _time_in_turns_ms(calls, repeats, evict)
        # the baselines in turns with the op too: each speed-up is a ratio of the same minutes of the host
        slow_repeats = max(2, repeats // 3)
        if case.baselines:
            _progress(f"{case.name}: reference eager, in turns with the fused op")
            eager_turns_ms, eager_ms = _time_in_turns_ms([fused, eager], slow_repeats, evict)
            if compile_reference:
                _progress(
                    f"{case.name}: reference under torch.compile (compiling...), in turns with the fused op"
                )
                fn = _compiled_reference(case.op)
                try:
                    compiled_turns_ms, compiled_ms = _time_in_turns_ms(
                        [fused, lambda: fn(*kernel_args)], repeats, evict
                    )
                    compiled_faults = faults_per_call(lambda: fn(*kernel_args))
                except Exception as exc:  # noqa: BLE001 - a failing baseline must not hide the op's numbers
                    compiled_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
                    _progress(f"{case.name}: compiled reference unavailable ({compiled_error})")
        if case.check:
            if want[0] is None:
                _progress(f"{case.name}: checking the results against the reference")
                eager()
            op = next(o for o in PUBLIC if o.kernel == case.op)
            values = call_values(getattr(api, op.name), args, kwargs)
            found = compare_outputs(op, values, got[0], want[0])
            check = "ok" if all(good for _, good in found) else "FAIL: " + ", ".join(w for w, _ in found)
    return Result(
        case.op,
        case.rows,
        case.cols,
        str(case.dtype).removeprefix("torch."),
        case.groups,
        case.label,
        case.dst,
        isa,
        nbytes / 1e6,
        copy_ms,
        fused_ms,
        fused_out_ms,
        eager_ms,
        compiled_ms,
        compiled_error,
        unweighted[0] if unweighted else None,
        case.threads or saved_threads,
        compiled_faults,
        eager_turns_ms,
        compiled_turns_ms,
        check,
    )


@contextlib.contextmanager
def _threads(n: int):
    """``torch.set_num_threads(n)`` inside the block (0: unchanged), restored after."""
    saved = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


#: ``--sweep``: how the cost grows, per operator, bf16, no groups.
SWEEP_ROWS = (1024, 4096, 16384, 65536)  # at 2H = 4096
SWEEP_COLS = (
    256,
    1000,
    2112,
    4096,
    8192,
)  # at M = 8192; 1000 and 2112 are not multiples of 128 (1000: of 64)


def sweep_cases(ops=OPS) -> list[Case]:
    """Time and fraction of the copy roofline over M (1k-64k rows), 2H (256-8192, also sizes that are not
    multiples of 64, where the operator takes them: the MX backward needs 2H % 64 == 0) and threads (1, 2,
    all the cores this process may use)."""
    bf16 = torch.bfloat16
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cases = []
    for op in ops:
        # (the results are checked against the reference's up to the headline's 8192 rows: beyond, one
        # eager reference call takes a minute and gigabytes)
        cases += [
            Case(op, m, 4096, bf16, label="sweep M", baselines=False, check=m <= 8192) for m in SWEEP_ROWS
        ]
        cols = [c for c in SWEEP_COLS if op != "swiglu_bwd_mx_quant" or c % 64 == 0]
        cols = [c for c in cols if op != "swiglu_mx_quant" or c % 4 == 0]  # FP8 takes any even 2H
        cases += [Case(op, 8192, c, bf16, label="sweep 2H", baselines=False) for c in cols]
        for t in sorted({1, 2, cores}):
            cases.append(Case(op, 8192, 4096, bf16, label="sweep threads", baselines=False, threads=t))
    return cases


def default_cases(quick: bool, ops=OPS) -> list[Case]:
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    cases = []
    for op in ops:
        if quick:
            cases += [Case(op, 64, 256, bf16, label="size"), Case(op, 256, 512, bf16, 4)]
            if op == "swiglu_mx_quant":
                cases.append(Case(op, 64, 256, bf16, dst="e2m1", label="fp4"))
            continue
        for m in (256, 1024, 4096, 8192):
            cases.append(Case(op, m, 4096, bf16, label="size" if m != 8192 else "headline"))
        cases.append(Case(op, 8192, 4096, bf16, groups=8, label="8 uneven groups"))
        if op in ("swiglu_bwd_mx_quant", "swiglu_mx_quant"):  # routing weights: beside the headline case
            cases.append(Case(op, 8192, 4096, bf16, label="weighted", weighted=True, baselines=False))
        if op == "swiglu_mx_quant":
            cases.append(Case(op, 8192, 4096, bf16, dst="e2m1", label="fp4"))
        if op in ("swiglu_group_grad", "swiglu_bwd_mx_quant"):
            cases.append(Case(op, 8192, 4096, fp16, label="fp16", baselines=False))
        cases.append(Case(op, 8192, 4096, fp32, label="fp32", baselines=False))
        # the instruction sets below this machine's best (AVX2: laptops, AMD before Zen 4; portable C)
        from .backends import cpu

        for isa in ("avx2", "portable"):
            if isa in cpu.LIBRARY.supported_isas() and isa != cpu.LIBRARY.isa:
                cases.append(Case(op, 8192, 4096, bf16, label=isa, isa=isa, baselines=False))
    return cases


_LATENCY_SCRIPT = """
import time
t_ = time.perf_counter()
import torch
t0 = time.perf_counter()
import swiglu_ops
t1 = time.perf_counter()
x = torch.randn(256, 1024).bfloat16(); dy = torch.randn(256, 512).bfloat16()
calls = [
    lambda: swiglu_ops.swiglu_group_grad(dy, x, backend="cpu"),
    lambda: swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="cpu"),
    lambda: swiglu_ops.clipped_swiglu(x, backend="cpu"),
    lambda: swiglu_ops.clipped_swiglu_grad(dy, x, backend="cpu"),
    lambda: swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="cpu"),
]
times = []
for call in calls:
    t = time.perf_counter(); call(); times.append(time.perf_counter() - t)
print(t0 - t_, t1 - t0, *times)
"""


def first_call_latency() -> dict:
    """In a fresh interpreter: ``import torch``, ``import swiglu_ops``, then the first bf16 call of each
    operator (256 x 1024) with the cpu backend (loading the library, starting the threads, building the
    activation tables)."""
    _progress("first-call latency (fresh interpreter)")
    res = subprocess.run([sys.executable, "-c", _LATENCY_SCRIPT], capture_output=True, text=True, check=True)
    torch_s, imp, *calls = (float(v) for v in res.stdout.split())
    return {"torch_s": torch_s, "import_s": imp, **{f"{op}_s": t for op, t in zip(OPS, calls, strict=True)}}


def _fmt(v, spec: str, suffix: str = "") -> str:
    width = int(spec.strip(">").split(".")[0]) + len(suffix)
    return "-".rjust(width) if v is None else format(v, spec) + suffix


def _case_name(r: Result) -> str:
    tags = (
        f"G={r.groups}" if r.groups else "",
        r.dst,
        "weighted" if r.label == "weighted" else "",
        f"threads={r.threads}" if r.label == "sweep threads" else "",
    )
    return f"{r.op} {r.rows}x{r.cols} {r.dtype}" + "".join(f" {v}" for v in tags if v)


def format_table(results: list[Result]) -> str:
    head = (
        f"{'case':<46} {'isa':>11} {'MB':>6} {'copy':>7} {'fused':>7} {'%roof':>6} {'out=':>7} {'%roof':>6} "
        f"{'eager':>8} {'compiled':>8} {'x comp':>7} {'x eager':>7} {'check':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{_case_name(r):<46} {r.isa:>11} {r.mbytes:>6.0f} {r.copy_ms:>7.2f} {r.fused_ms:>7.2f} "
            f"{r.pct_roofline:>5.0f}% {r.fused_out_ms:>7.2f} {r.pct_roofline_out:>5.0f}% "
            f"{_fmt(r.eager_ms, '>8.1f')} {_fmt(r.compiled_ms, '>8.1f')} "
            f"{_fmt(r.speedup_vs_compiled, '>6.1f', 'x')} {_fmt(r.speedup_vs_eager, '>6.1f', 'x')} "
            f"{(r.check or '-')[:4]:>5}"
        )
    lines.append(
        "times in ms (median; every call on a cold last-level cache, but with --quick); %roof = copy time / "
        "op time; x comp / x eager = speedup of the fused op as called, timed in turns with the baseline; "
        "check = the results against the reference's (bitwise but for near ties); isa = the C kernels' "
        "instruction set" + (" (AVX-512 activation tables read by gather)" if _cpu_gathers() else "")
    )
    for r in results:
        if r.check.startswith("FAIL"):
            lines.append(f"RESULTS DIFFER from the reference for {_case_name(r)}: {r.check[6:]}")
        if r.compiled_error:
            lines.append(f"compiled reference failed for {_case_name(r)}: {r.compiled_error}")
        if r.compiled_faults is not None and r.compiled_faults >= FAULTS_NOTED:
            lines.append(
                f"compiled reference of {_case_name(r)}: {r.compiled_faults} page faults per call "
                "(temporaries in fresh memory; without them it runs faster, and x comp is smaller)"
            )
        if r.unweighted_ms is not None:
            lines.append(
                f"{_case_name(r)} weighted: {r.fused_ms:.2f} ms vs {r.unweighted_ms:.2f} ms unweighted, in "
                f"turns: x{r.fused_ms / r.unweighted_ms:.3f}"
            )
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the Agg backend (pictures to files), or None (said once) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _progress("matplotlib is not installed: no picture")
        return None
    return plt


def _plot(results: list[Result], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, (ax_pct, ax_ms) = plt.subplots(1, 2, figsize=(13, 4.5))
    for op in OPS:
        pts = sorted(
            (r.mbytes, r.pct_roofline, r.pct_roofline_out, r.fused_ms, r.copy_ms)
            for r in results
            if r.op == op and r.label in ("size", "headline")
        )
        if not pts:
            continue
        mb, pct, pct_out, ms, copy = zip(*pts, strict=True)
        (line,) = ax_pct.plot(mb, pct, "o-", label=f"{op} (as called)")
        ax_pct.plot(mb, pct_out, "s--", color=line.get_color(), label=f"{op} (out=)")
        ax_ms.plot(mb, ms, "o-", color=line.get_color(), label=op)
    if any(r.label in ("size", "headline") for r in results):
        copy_pts = sorted({(r.mbytes, r.copy_ms) for r in results if r.label in ("size", "headline")})
        ax_ms.plot(*zip(*copy_pts, strict=True), "k:", label="copy of the same bytes")
    for y, text in ((50, "50 % goal"), (25, "25 % first milestone")):
        ax_pct.axhline(y, color="grey", lw=0.8, ls=":")
        ax_pct.annotate(text, (ax_pct.get_xlim()[0], y), fontsize=7, color="grey", va="bottom")
    for ax in (ax_pct, ax_ms):
        ax.set_xscale("log")
        ax.set_xlabel("bytes moved per call (MB), bf16, 2H = 4096, M = 256 ... 8192")
        ax.legend(fontsize=7)
    ax_ms.set_yscale("log")
    ax_pct.set_ylabel("% of copy roofline (copy time / op time)")
    ax_ms.set_ylabel("time per call (ms, median)")
    ax_pct.set_title("swiglu_ops cpu backend: % of copy roofline")
    ax_ms.set_title("swiglu_ops cpu backend: time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _plot_sweep(results: list[Result], path: Path) -> bool:
    """``--sweep``: ns per element over M, % of the copy roofline over 2H, speed-up over threads."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    isa = results[0].isa if results else ""
    for op in OPS:
        mine = [r for r in results if r.op == op]
        by_m = sorted((r.rows, 1e6 * r.fused_ms / (r.rows * r.cols)) for r in mine if r.label == "sweep M")
        by_c = sorted((r.cols, r.pct_roofline) for r in mine if r.label == "sweep 2H")
        by_t = sorted((r.threads, r.fused_ms) for r in mine if r.label == "sweep threads")
        if by_m:
            axes[0].plot(*zip(*by_m, strict=True), "o-", label=op)
        if by_c:
            axes[1].plot(*zip(*by_c, strict=True), "o-", label=op)
        if by_t:
            axes[2].plot([t for t, _ in by_t], [by_t[0][1] / ms for _, ms in by_t], "o-", label=op)
    axes[0].set(xscale="log", xlabel="M (rows), 2H = 4096", ylabel="ns per element of x")
    axes[0].set_title(f"time per element ({isa})")
    axes[1].set(xlabel="2H (M = 8192)", ylabel="% of copy roofline", title="fraction of the copy roofline")
    axes[2].set(xlabel="threads (M = 8192, 2H = 4096)", ylabel="speed-up over 1 thread", title="threads")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="swiglu-ops bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes, no torch.compile (smoke test)")
    p.add_argument("--out", type=Path, default=Path("bench_results"), help="output folder")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd reference")
    p.add_argument("--no-latency", action="store_true", help="skip the first-call latency subprocess")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="the operators to benchmark")
    p.add_argument(
        "--only", nargs="+", metavar="LABEL", help="only the cases with these labels (e.g. headline)"
    )
    p.add_argument(
        "--sweep", action="store_true", help="how the cost grows over M, 2H and threads (bench_sweep.*)"
    )
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    ok, why = registry.backend_status("cpu", torch.device("cpu"))
    if not ok:
        print(f"the cpu backend is not available: {why}", file=sys.stderr)
        return 1
    repeats = args.repeats or (3 if args.quick else 7)
    compile_reference = not (args.quick or args.no_compile)
    gen = torch.Generator().manual_seed(0)
    results = []
    if args.sweep and args.quick:  # the sweep's shapes are its point: warm small runs would replace them
        p.error("--sweep takes no --quick (the sweep runs its full shapes on a cold cache)")
    cases = sweep_cases(args.ops) if args.sweep else default_cases(args.quick, args.ops)
    if args.only:
        unknown = sorted(set(args.only) - {c.label for c in cases})
        if unknown:
            p.error(f"--only: no case labelled {unknown} here (labels: {sorted({c.label for c in cases})})")
        cases = [c for c in cases if c.label in args.only]
    compile_reference = compile_reference and not args.sweep
    evict = None if args.quick else cache_evictor()
    for i, case in enumerate(cases, 1):
        _progress(f"[{i}/{len(cases)}] {case.name}")
        results.append(
            run_case(case, repeats=repeats, compile_reference=compile_reference, gen=gen, evict=evict)
        )
    latency = None if (args.quick or args.no_latency or args.sweep) else first_call_latency()
    table = format_table(results)
    print(table)
    if latency:
        calls = ", ".join(f"{op} {latency[f'{op}_s'] * 1e3:.0f} ms" for op in OPS)
        total = latency["import_s"] + sum(latency[f"{op}_s"] for op in OPS)
        print(
            f"fresh interpreter: import torch {latency['torch_s']:.2f} s (PyTorch's own); import swiglu_ops "
            f"{latency['import_s']:.2f} s; first calls: {calls}; swiglu_ops in all {total:.2f} s"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in results]
    stem = "bench_sweep" if args.sweep else "bench_cpu"
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    from .backends import cpu

    meta = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "isa": cpu.LIBRARY.isa,
        "isas": cpu.LIBRARY.supported_isas(),
        "table_gather": _cpu_gathers(),  # AVX-512 tables read by vgatherdps (SWIGLU_OPS_CPU_GATHER)
        "quick": args.quick,
        "repeats": repeats,
        "cold_cache": not args.quick,  # each timed call after writing twice the last-level cache
        "evict_bytes": 0 if args.quick else cache_evict_bytes(),
    }
    (args.out / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "results": rows, "first_call_latency": latency}, indent=2)
    )
    plotted = (_plot_sweep if args.sweep else _plot)(results, args.out / f"{stem}.png")
    _progress(f"wrote {stem}.csv, {stem}.json{f', {stem}.png' if plotted else ''} into {args.out}")
    return 0 if all(math.isfinite(r.fused_ms) and not r.check.startswith("FAIL") for r in results) else 1


def _cpu_gathers() -> bool:
    from .backends import cpu

    return bool(cpu.LIBRARY.gather) and cpu.LIBRARY.isa.startswith("avx512")


if __name__ == "__main__":
    raise SystemExit(main())
