"""Triton backend on a CUDA GPU: conformance at realistic sizes, then time and % of measured copy bandwidth.

    python benchmarks/bench_triton.py                 # check + benchmark + compiled-reference baselines
    python benchmarks/bench_triton.py --tune          # also time launch-configuration variants
    python benchmarks/bench_triton.py --json out.json # write every number (rewritten after every stage)
    python benchmarks/bench_triton.py --sass s.json   # predicted % from a benchmarks/sass_budget.py --json
    TRITON_INTERPRET=1 python benchmarks/bench_triton.py --smoke   # every step on CPU, tiny shapes, seconds

Operators (all with ``backend=BACKEND`` against ``backend="reference"`` on the same device):
swiglu_group_grad, swiglu_backward_mx_quant_dual_axis (E4M3), swiglu_mx_quant_dual_axis (E4M3 and FP4 E2M1),
clipped_swiglu and clipped_swiglu_grad (GPT-OSS: alpha 1.702, limit 7, bias 1, interleaved); the two E4M3
MX operators again with a routing weight per row (timed; the summary prints weighted / unweighted time).

Steps (each prints as it goes; the summary table comes last):

1. ``check``: every operator against the reference (run on the same GPU, eager) over dtypes, options and
   ragged groups, with the contract's rule for every output tensor: FP8/FP4/E8M0 codes and 16-bit values
   equal except near ties (at most 1 in 10,000 elements, one unit each; FP4 per element), fp32 within 4 ulp
   (at the cancelling terms' size for gradients), grad_weight within 1e-5 relative.
2. ``big``: one tensor of more than 2**31 elements per op (64-bit offsets); its last rows are compared with
   the reference run on just those rows.
3. ``bench``: every op at the README shape (M=8192, 2H=4096) and at the MoE expert shapes of real models
   (``SHAPES``: 4096 tokens x top-k rows in ragged expert groups), bf16, timed with CUDA-graph replay
   (``triton.testing.do_bench_cudagraph``, median) next to a device copy of the same bytes (inputs read +
   outputs written). The headline is % of copy roofline = copy time / op time; next to it the % that the
   issue model of ``benchmarks/sass_budget.py`` predicts for the launched kernel (serial / overlap bound,
   sm_90 SASS counts from a ``sass_budget.py --json`` file; ``run_gpu_checks.sh`` writes one at the start of
   the run). Contract targets on H100/H200: >= 85 % for the elementwise ops, >= 75 % dual-axis.
4. ``tune`` (optional): the same timings for other tile shapes / warp counts (README and GPT-OSS shapes),
   each variant first checked against the reference.
5. ``baselines``: the reference backend's kernel functions under ``torch.compile`` at the README shape
   (plain ``do_bench``: the group loop reads ends on the host; group_grad's grad_weight as a plain sum, as in
   ``swiglu_ops.bench``), skipped once the run has used its ``--budget`` seconds.

Exits with a message (status 0) when no CUDA device is present (``--smoke`` runs on CPU instead).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

import swiglu_ops
from swiglu_ops.numerics.tolerances import near_tie_differences

# The contract's comparison rules (spec README section 3) live with the tests; the check reuses them.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import _compare  # noqa: E402
from _fwd_oracles import assert_forward_matches  # noqa: E402

T0 = time.perf_counter()
#: Where and what is measured (``--smoke`` swaps these to exercise the script on CPU without a GPU).
DEVICE = "cuda"
BACKEND = "triton"
SMOKE = False
#: do_bench_cudagraph's repetition time per measurement (ms): 10 graph replays of this length each.
REP_MS = 40
#: The SASS table used when --sass is not given (written by benchmarks/sass_budget.py --json).
SASS_DEFAULT = ROOT / "benchmarks" / "results" / "sass_budget.json"


def _log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


def _host(t):
    """A tensor on the CPU (1-byte float codes travel as bytes: FP4 has no copy kernels everywhere)."""
    if t is None or t.device.type == "cpu":
        return t
    if t.element_size() == 1 and t.dtype != torch.uint8:
        return t.view(torch.uint8).cpu().view(t.dtype)
    return t.cpu()


def _cpu(ts):
    return tuple(_host(t) for t in ts)


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
    return dy, x, w, yo, gi, 7.0


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
    return x, dy, ends


def _routed_counts(m, experts, seed):
    """Rows per expert of a top-k router: ``m`` routed rows drawn from a skewed expert popularity (ragged
    groups, some possibly empty), summing to ``m``."""
    g = torch.Generator().manual_seed(seed)
    popularity = torch.softmax(torch.randn(experts, generator=g), 0)
    picks = torch.multinomial(popularity, m, replacement=True, generator=g)
    return torch.bincount(picks, minlength=experts).to(torch.int64)


GG = swiglu_ops.swiglu_group_grad
MXQ = swiglu_ops.swiglu_backward_mx_quant_dual_axis
MXF = swiglu_ops.swiglu_mx_quant_dual_axis
CS = swiglu_ops.clipped_swiglu
CSG = swiglu_ops.clipped_swiglu_grad
MX_NAMES = ("y1", "mxscale1", "y2", "mxscale2")
#: GPT-OSS's clipped SwiGLU (openai/gpt-oss, Hugging Face GptOssExperts).
GPT_OSS = {"alpha": 1.702, "limit": 7.0, "bias": 1.0, "interleaved": True}
FP4 = torch.float4_e2m1fn_x2


# --------------------------------------------------------------------------------------------- check


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
        count, far = near_tie_differences(got[0], want[0])
        _log(f"  {what}: grad_x {count} differ ({far} beyond a near tie) -> {'ok' if ok else 'FAIL'}")
    return ok


def _compare_mx(args, quiet=False, **kw) -> bool:
    got = MXQ(*args, backend=BACKEND, **kw)
    want = MXQ(*args, backend="reference", **kw)
    groups = None if args[2] is None else args[2].numel()
    what = f"bwd mx {tuple(args[0].shape)} {args[0].dtype} {kw or ''} groups={groups}"
    ok = _verdict(what, lambda: _compare.assert_mx_matches(_cpu(got), _cpu(want), BACKEND))
    if not quiet:
        _log(f"  {what}: differ {_mx_counts(got, want)} -> {'ok' if ok else 'FAIL'}")
    return ok


def _mx_counts(got, want) -> str:
    """Differing elements per output (FP4: per code, two a byte)."""
    return ", ".join(
        f"{n} {near_tie_differences(a, b)[0]}" for n, a, b in zip(MX_NAMES, got, want, strict=True)
    )


def _compare_fwd(x, ends, quiet=False, **kw) -> bool:
    got = MXF(x, ends, backend=BACKEND, **kw)
    want = MXF(x, ends, backend="reference", **kw)
    dst = kw.get("dst_dtype", torch.float8_e4m3fn)
    groups = None if ends is None else ends.numel()
    what = f"fwd mx {tuple(x.shape)} {x.dtype} {kw or ''} groups={groups}"
    ok = _verdict(what, lambda: assert_forward_matches(_cpu(got), _cpu(want), BACKEND, dst))
    if not quiet:
        _log(f"  {what}: differ {_mx_counts(got, want)} -> {'ok' if ok else 'FAIL'}")
    return ok


def _clipped_grad_magnitude(dy, x, alpha=1.702, limit=7.0, bias=1.0, interleaved=True, **_):
    """Per grad_x element the size of the fp32 terms it is computed from (float64): the gate gradient's
    ``1 + alpha A~ (1 - s)`` cancels (the test suite's float64_backward, clamp_mode 0)."""
    x, dy = x.double(), dy.double()
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    at = a.clamp(max=limit)
    s = torch.sigmoid(alpha * at)
    mag_a = (dy * (b.clamp(-limit, limit) + bias) * s).abs() * (1 + (alpha * at * (1 - s)).abs())
    mag_b = (dy * at * s).abs()
    mag = torch.stack([mag_a, mag_b], -1).flatten(-2) if interleaved else torch.cat([mag_a, mag_b], -1)
    return torch.nan_to_num(mag, nan=0.0, posinf=0.0).float()


def _compare_clipped(x, dy, counts, quiet=False, **kw) -> bool:
    kw = {**GPT_OSS, **kw}
    y, y_ref = CS(x, counts, **kw, backend=BACKEND), CS(x, counts, **kw, backend="reference")
    g, g_ref = CSG(dy, x, counts, **kw, backend=BACKEND), CSG(dy, x, counts, **kw, backend="reference")
    what = f"clipped {tuple(x.shape)} {x.dtype} interleaved={kw['interleaved']}"
    magnitude = _clipped_grad_magnitude(_host(dy), _host(x), **kw)
    ok = _verdict(
        f"{what} y", lambda: _compare.assert_matches_reference(_host(y), _host(y_ref), BACKEND, "y")
    )
    ok &= _verdict(
        f"{what} grad_x",
        lambda: _compare.assert_matches_reference(
            _host(g), _host(g_ref), BACKEND, "grad_x", magnitude=magnitude
        ),
    )
    if not quiet:
        cy, cg = near_tie_differences(y, y_ref)[0], near_tie_differences(g, g_ref)[0]
        _log(f"  {what}: y {cy}, grad_x {cg} differ -> {'ok' if ok else 'FAIL'}")
    return ok


def _extremes(x, dy):
    """Overflow to inf/saturation, subnormal blocks, NaN (rows 0..120 must exist)."""
    x = x.clone()
    x[:40] *= 2.0**100
    x[40:80] *= 2.0**-120
    x[100, 7] = float("nan")
    return x, dy * 2.0**60


#: check(): (rows, hidden) for group_grad, (M, 2H, groups) for the MX ops, (rows, 2H, experts) for clipped.
CHECK_GG = ((77, 96, True, True), (2048, 1408, True, True), (4096, 2048, False, False))
CHECK_MX = ((100, 128, 3), (2048, 2048, 8), (4099, 1088, None), (3000, 4096, 33))
CHECK_FWD = ((100, 128, 3), (4099, 1088, None), (4096, 5760, 16), (3000, 1536, 33))
CHECK_CLIPPED = ((77, 96, 3), (4096, 5760, 128), (3000, 1536, 33))
SMOKE_CHECK = {
    "CHECK_GG": ((40, 64, True, True),),
    "CHECK_MX": ((70, 128, 3),),
    "CHECK_FWD": ((70, 128, 3),),
    "CHECK_CLIPPED": ((24, 96, 3),),
}


def _sizes(name: str):
    return SMOKE_CHECK[name] if SMOKE else globals()[name]


def check() -> bool:
    ok = True
    dtypes = (torch.bfloat16,) if SMOKE else (torch.bfloat16, torch.float16, torch.float32)
    for dtype in dtypes:
        for rows, hidden, weight, groups in _sizes("CHECK_GG"):
            args = _group_grad_case(rows, hidden, dtype, seed=rows, weight=weight, groups=groups)
            ok &= _compare_gg(args)
        for m, c, groups in _sizes("CHECK_MX"):
            args = _mx_case(m, c, groups, dtype, seed=m, ragged=True)
            ok &= _compare_mx(args)
        for m, c, groups in _sizes("CHECK_FWD"):
            x, _dy, ends = _mx_case(m, c, groups, dtype, seed=m + 1, ragged=True)
            ok &= _compare_fwd(x, ends)
            ok &= _compare_fwd(x, ends, dst_dtype=FP4)
        for rows, c, experts in _sizes("CHECK_CLIPPED"):
            x, dy, _ = _mx_case(rows, c, None, dtype, seed=rows + 2)
            counts = _routed_counts(rows - rows // 9, experts, rows).to(DEVICE)  # the last rows are masked
            ok &= _compare_clipped(x, dy, counts)
    if SMOKE:
        return ok
    args = _mx_case(2048, 2048, 8, torch.bfloat16, seed=5, ragged=True)
    ok &= _compare_mx(args, dst_dtype=torch.float8_e5m2)
    ok &= _compare_mx(args, scale_alg=0)
    ok &= _compare_mx(args, activate_left=False)
    ok &= _compare_mx(args, **GPT_OSS)
    x, dy, ends = args
    ok &= _compare_fwd(x, ends, dst_dtype=torch.float8_e5m2)
    ok &= _compare_fwd(x, ends, scale_alg=0)
    ok &= _compare_fwd(x, ends, activate_left=False)
    ok &= _compare_fwd(x, ends, **GPT_OSS)
    ok &= _compare_fwd(x, ends, dst_dtype=FP4, **GPT_OSS)
    ok &= _compare_fwd(x, ends, dst_dtype=FP4, round_mode="floor")
    ok &= _compare_fwd(x, ends, dst_dtype=FP4, round_mode="round")
    ok &= _compare_clipped(x, dy, None, interleaved=False)
    # Extreme magnitudes: overflow to inf/saturation, subnormal blocks, NaN.
    xe, dye = _extremes(x, dy)
    for kw in ({}, {"dst_dtype": torch.float8_e5m2}, {"scale_alg": 0}):
        ok &= _compare_mx((xe, dye, ends), **kw)
    for kw in ({}, {"dst_dtype": torch.float8_e5m2}, {"dst_dtype": FP4}, GPT_OSS):
        ok &= _compare_fwd(xe, ends, **kw)
    ok &= _compare_clipped(xe, dy, None)
    # Magnitudes spread over 24 binades inside every block: FP8 subnormals, ties and zeros after scaling
    # (the hardware cast's subnormal rounding and the byte order of its packed results).
    g = _gen(17)
    spread = torch.exp2(-torch.randint(0, 24, dy.shape, device=DEVICE, generator=g).float())
    for kw in ({}, {"dst_dtype": torch.float8_e5m2}, {"scale_alg": 0}):
        ok &= _compare_mx((x, (dy.float() * spread).to(dy.dtype), ends), **kw)
    xs = (x.float() * spread.repeat(1, 2)).to(x.dtype)
    for kw in ({}, {"dst_dtype": torch.float8_e5m2}, {"dst_dtype": FP4}):
        ok &= _compare_fwd(xs, ends, **kw)
    return ok


BIG_SHAPE = (2**20 + 64, 2048)  # x: 2.15e9 elements
SMOKE_BIG_SHAPE = (128, 128)


def check_big() -> bool:
    """One tensor above 2**31 elements per op; compare the last rows with the reference on just those."""
    m, c = SMOKE_BIG_SHAPE if SMOKE else BIG_SHAPE
    x = torch.randn(m, c, device=DEVICE, dtype=torch.bfloat16)
    dy = torch.randn(m, c // 2, device=DEVICE, dtype=torch.bfloat16)
    n_tail = 64 if SMOKE else 256
    tail = slice(m - n_tail, m)  # starts on a 64-row boundary: its mxscale2 rows are the last n_tail / 64
    ok = True
    for name, op in (("bwd mx", MXQ), ("fwd mx", lambda xx, _dy, **k: MXF(xx, **k))):
        got = op(x, dy, backend=BACKEND)
        want = op(x[tail], dy[tail], backend="reference")
        got_tail = (got[0][tail], got[1][tail], got[2][tail], got[3][(m - n_tail) // 64 :])
        good = _verdict(
            f"big {name}", lambda g=got_tail, w=want: _compare.assert_mx_matches(_cpu(g), _cpu(w), BACKEND)
        )
        _log(f"  big {name} {tuple(x.shape)}: last {n_tail} rows -> {'ok' if good else 'FAIL'}")
        ok &= good
    y = CS(x, **GPT_OSS, backend=BACKEND)[tail]
    gx = CSG(dy, x, **GPT_OSS, backend=BACKEND)[tail]
    want = (
        CS(x[tail], **GPT_OSS, backend="reference"),
        CSG(dy[tail], x[tail], **GPT_OSS, backend="reference"),
    )
    good = _verdict(
        "big clipped", lambda: _compare.assert_matches_reference(_host(y), _host(want[0]), BACKEND, "y")
    )
    good &= _verdict(
        "big clipped_grad",
        lambda: _compare.assert_matches_reference(_host(gx), _host(want[1]), BACKEND, "grad_x"),
    )
    _log(f"  big clipped + grad {tuple(x.shape)}: last {n_tail} rows -> {'ok' if good else 'FAIL'}")
    ok &= good
    w = torch.rand(m, device=DEVICE)
    gx, gw = GG(dy, x, w, dy, None, 7.0, backend=BACKEND)
    want = GG(dy[tail], x[tail], w[tail], dy[tail], None, 7.0, backend="reference")
    good = _verdict(
        "big group_grad",
        lambda: _compare.assert_group_grad_matches(_cpu((gx[tail], gw[tail])), _cpu(want), BACKEND),
    )
    _log(f"  big group_grad {tuple(x.shape)}: last {n_tail} rows -> {'ok' if good else 'FAIL'}")
    return ok and good


# ------------------------------------------------------------------------------------------- timing


def _bench(fn) -> float:
    """Median ms of ``fn`` under CUDA-graph replay (smoke: one plain call after a warm-up)."""
    fn()
    if SMOKE:
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=REP_MS, return_mode="median")


def _bench_plain(fn) -> float:
    """Median ms without a CUDA graph (for code that synchronises with the host)."""
    if SMOKE:
        return _bench(fn)
    from triton.testing import do_bench

    return do_bench(fn, rep=REP_MS, return_mode="median")


def _copy_ms(nbytes: int) -> float:
    """A device copy that reads nbytes / 2 and writes nbytes / 2: the op's bytes moved, read + written."""
    src = torch.empty(nbytes // 8, dtype=torch.float32, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    return _bench(lambda: dst.copy_(src))


def _flat(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


#: Tokens per batch of the MoE shapes; each routes to top-k experts: M = TOKENS x top-k rows.
TOKENS = 4096
#: (label, rows M, 2H = 2 x expert intermediate size, experts = groups; None: the README shape, MX ops
#: ungrouped and the count-based ops with one group).
SHAPES = (
    ("readme", 8192, 4096, None),
    ("gpt-oss-120b", TOKENS * 4, 2 * 2880, 128),  # hidden 2880, expert intermediate 2880, top-4 of 128
    ("deepseek-v3", TOKENS * 8, 2 * 2048, 256),  # hidden 7168, moe intermediate 2048, top-8 of 256
    ("qwen3-30b-a3b", TOKENS * 8, 2 * 768, 128),  # hidden 2048, moe intermediate 768, top-8 of 128
)
SMOKE_SHAPES = (("tiny", 32, 128, 2),)
#: --tune times its variants on these shapes only; the baselines run on the first shape only.
TUNE_SHAPES = ("readme", "gpt-oss-120b", "tiny")

OPS = (
    "group_grad", "bwd_mx e4m3", "fwd_mx e4m3", "fwd_mx e2m1", "clipped_swiglu", "clipped_swiglu_grad",
    # the routing weight (a probability per row): its cost is these against the unweighted rows above
    "bwd_mx e4m3 weighted", "fwd_mx e4m3 weighted",
)  # fmt: skip
#: The reference backend's kernel function each op calls (the key of swiglu_ops.bench.reference_baseline).
REF_KERNELS = {
    "group_grad": "swiglu_group_grad",
    "bwd_mx e4m3": "swiglu_bwd_mx_quant",
    "fwd_mx e4m3": "swiglu_mx_quant",
    "fwd_mx e2m1": "swiglu_mx_quant",
    "clipped_swiglu": "clipped_swiglu",
    "clipped_swiglu_grad": "clipped_swiglu_grad",
    "bwd_mx e4m3 weighted": "swiglu_bwd_mx_quant",
    "fwd_mx e4m3 weighted": "swiglu_mx_quant",
}


def _op_calls(x, dy, w, yo, counts, ends) -> dict:
    """Per op: (the inputs it reads, ``call(backend)``)."""
    wr = w.view(-1)  # the MX operators' weight: one per row
    return {
        "group_grad": ((dy, x, w, yo, counts), lambda b: GG(dy, x, w, yo, counts, 7.0, backend=b)),
        "bwd_mx e4m3": ((x, dy, ends), lambda b: MXQ(x, dy, ends, backend=b)),
        "fwd_mx e4m3": ((x, ends), lambda b: MXF(x, ends, backend=b)),
        "fwd_mx e2m1": ((x, ends), lambda b: MXF(x, ends, dst_dtype=FP4, backend=b)),
        "clipped_swiglu": ((x, counts), lambda b: CS(x, counts, **GPT_OSS, backend=b)),
        "clipped_swiglu_grad": ((dy, x, counts), lambda b: CSG(dy, x, counts, **GPT_OSS, backend=b)),
        "bwd_mx e4m3 weighted": ((x, dy, ends, wr), lambda b: MXQ(x, dy, ends, weight=wr, backend=b)),
        "fwd_mx e4m3 weighted": ((x, ends, wr), lambda b: MXF(x, ends, weight=wr, backend=b)),
    }


def bench_cases(shapes):
    """Every op on every shape, bf16: dicts with the op's inputs and ``call(backend)``."""
    for label, m, c, experts in shapes:
        x, dy, _ = _mx_case(m, c, None, torch.bfloat16, seed=m + c)
        w = torch.rand(m, 1, device=DEVICE, generator=_gen(1))
        yo = torch.randn(m, c // 2, device=DEVICE, generator=_gen(2)).to(torch.bfloat16)
        counts = (_routed_counts(m, experts, seed=c) if experts else torch.tensor([m])).to(DEVICE)
        ends = counts.cumsum(0) if experts else None
        calls = _op_calls(x, dy, w, yo, counts, ends)
        assert tuple(calls) == OPS
        for op, (inputs, call) in calls.items():
            yield {
                "op": op,
                "model": label,
                "shape": f"{m}x{c}",
                "groups": experts or 0,
                "grouped": experts is not None,
                "inputs": inputs,
                "call": call,
            }


# ------------------------------------------------------------------------ the issue model's prediction


def spec_candidates(op: str, grouped: bool) -> list[str]:
    """The specializations of tests/_triton_compile_checks.py (benchmarks/sass_budget.py's names) that the
    op launches on the bench's bf16 inputs, best match first."""
    g = int(grouped)
    return {
        "group_grad": ["group_grad[bf16,w=1,mask=1]"],
        "bwd_mx e4m3": [f"bwd_mx_quant[bf16,grouped={g}]"],
        "fwd_mx e4m3": [f"mx_quant[bf16,grouped={g},e4m3]"],
        # The compile checks hold FP4 grouped only; ungrouped, the kernel lacks just the group-end scan.
        "fwd_mx e2m1": [
            f"mx_quant[bf16,grouped={g},e2m1,round=rint]",
            "mx_quant[bf16,grouped=1,e2m1,round=rint]",
        ],
        "clipped_swiglu": ["clipped_swiglu[bf16,fwd,mode=0,interleaved]"],
        "clipped_swiglu_grad": ["clipped_swiglu[bf16,bwd,mode=0,interleaved]"],
        # The compile checks hold the weighted specializations grouped only.
        "bwd_mx e4m3 weighted": [
            f"bwd_mx_quant[bf16,grouped={g},weight]",
            "bwd_mx_quant[bf16,grouped=1,weight]",
        ],
        "fwd_mx e4m3 weighted": [
            f"mx_quant[bf16,grouped={g},e4m3,weight]",
            "mx_quant[bf16,grouped=1,e4m3,weight]",
        ],
    }[op]


SASS_SPECS = sorted({n for op in OPS for g in (False, True) for n in spec_candidates(op, g)})


def sass_regex() -> str:
    """``sass_budget.py --only``: exactly the specs the bench launches (run_gpu_checks.sh uses it)."""
    return "^(?:" + "|".join(re.escape(n) for n in SASS_SPECS) + ")$"


def load_sass(path) -> dict:
    """The rows of a ``sass_budget.py --json`` file keyed by (spec, arch, hw_cvt); {} when missing."""
    if path is None:
        path = SASS_DEFAULT if SASS_DEFAULT.exists() else None
    if path is None or not Path(path).exists():
        _log(f"  no SASS table ({path or SASS_DEFAULT} missing): predicted % not shown")
        return {}
    rows = json.loads(Path(path).read_text())["rows"]
    _log(f"  SASS table {path}: {len(rows)} rows")
    return {(r["name"], r["arch"], r["hw_cvt"]): r for r in rows}


def predict(op: str, grouped: bool, sass: dict, arch: int, hw: bool) -> dict:
    """The issue model's % of copy (serial and overlap bounds) for the spec the op launches."""
    for name in spec_candidates(op, grouped):
        r = sass.get((name, arch, hw))
        if r is not None:
            return {"spec": name, "pred_serial": r["pred_serial"], "pred_overlap": r["pred_overlap"]}
    if sass:
        _log(f"  no SASS row for {op} (grouped={grouped}, sm_{arch}, hw_cvt={hw})")
    return {"spec": None, "pred_serial": float("nan"), "pred_overlap": float("nan")}


def run_bench(cases: list[dict], copy_ms: dict, sass: dict, arch: int) -> list[dict]:
    from swiglu_ops.backends import triton as tb

    rows = []
    for case in cases:
        case["nbytes"] = nbytes = _nbytes(*case["inputs"], *_flat(case["call"](BACKEND)))
        t = _bench(lambda c=case: c["call"](BACKEND))
        if nbytes not in copy_ms:
            copy_ms[nbytes] = _copy_ms(nbytes)
        pct = 100 * copy_ms[nbytes] / t
        keys = ("op", "model", "shape", "groups")
        row = {k: case[k] for k in keys} | {"bytes": nbytes, "ms": t, "copy_ms": copy_ms[nbytes], "pct": pct}
        row |= predict(case["op"], case["grouped"], sass, arch, tb.HW_CONVERSIONS)
        rows.append(row)
        what = f"{case['op']} {case['model']} {case['shape']} G={case['groups']}"
        pred = f"predicted {row['pred_serial']:.0f} serial / {row['pred_overlap']:.0f} overlap"
        _log(f"  {what}: {t:.4f} ms, {pct:.1f} % of copy ({pred})")
    return rows


# -------------------------------------------------------------------------------------------- tune

# Launch-configuration variants; the first of each list is the shipped default (<= 20 variants in all: a
# short lease). HW_CONVERSIONS selects the PTX conversion instructions (opt-in until measured here) instead
# of the integer transcriptions. The attributes live in swiglu_ops.backends.triton.
_GG = dict(GROUP_GRAD_ROWS=4, GROUP_GRAD_BLOCK_H=256, GROUP_GRAD_NUM_WARPS=4, GROUP_GRAD_PREFETCH=True)
TUNE_GG = [
    {**_GG, "GROUP_GRAD_PREFETCH": prefetch, "HW_CONVERSIONS": hw}
    for hw, prefetch in ((False, True), (False, False), (True, True), (True, False))
] + [
    dict(GROUP_GRAD_ROWS=r, GROUP_GRAD_BLOCK_H=h, GROUP_GRAD_NUM_WARPS=w, GROUP_GRAD_PREFETCH=True,
         HW_CONVERSIONS=True)
    for r, h, w in ((2, 256, 2), (8, 256, 8), (4, 512, 8), (2, 512, 4), (1, 1024, 4))
]  # fmt: skip
# MX tiles: (forward output columns, warps); the backward's tile is half as many pairs (the same gradient
# columns), its chunked HW_CVT tile as many pairs.
TUNE_MX = [
    dict(MX_BLOCK_N=b, MX_BWD_BLOCK_N=max(b // 2, 32), MX_BWD_CHUNKED_BLOCK_N=b, MX_NUM_WARPS=w,
         HW_CONVERSIONS=hw)
    for hw, (b, w) in [(False, t) for t in ((128, 4), (64, 4), (128, 8))]
    + [(True, t) for t in ((128, 4), (64, 4), (128, 8), (256, 8), (64, 2))]
]  # fmt: skip


def run_tune(cases: list[dict], copy_ms: dict) -> list[dict]:
    from swiglu_ops.backends import triton as tb

    lists = ((TUNE_GG[:1], "gg"), (TUNE_MX[:1], "mx")) if SMOKE else ((TUNE_GG, "gg"), (TUNE_MX, "mx"))
    # every attribute any variant sets (a renamed attribute fails here, also in --smoke)
    defaults = {k: getattr(tb, k) for v in (*TUNE_GG, *TUNE_MX) for k in v}
    out: list[dict] = []
    try:
        for variants, family in lists:
            for v in variants:
                for k, val in v.items():
                    setattr(tb, k, val)
                try:
                    _tune_variant(family, v, cases, copy_ms, out)
                except Exception as exc:  # noqa: BLE001 - one variant that fails to build must not end the run
                    _log(f"  tune {family} {v}: {type(exc).__name__}: {str(exc)[:200]}")
                    out.append({"family": family, "variant": v, "ok": False, "error": repr(exc)[:300]})
                finally:
                    for k, val in defaults.items():
                        setattr(tb, k, val)
    finally:
        for k, val in defaults.items():
            setattr(tb, k, val)
    return out


def _tune_variant(family: str, v: dict, cases: list[dict], copy_ms: dict, out: list) -> None:
    """Check the variant against the reference on a ragged case, then time it on the tune shapes."""
    if family == "gg":
        rows, hidden = (40, 64) if SMOKE else (333, 1408)
        good = _compare_gg(_group_grad_case(rows, hidden, torch.bfloat16, seed=3), quiet=True)
    else:
        m, c, groups = (70, 128, 3) if SMOKE else (1000, 2048, 5)
        x, dy, ends = _mx_case(m, c, groups, torch.bfloat16, seed=3, ragged=True)
        good = _compare_mx((x, dy, ends), quiet=True)
        good &= _compare_fwd(x, ends, quiet=True)
        good &= _compare_fwd(x, ends, quiet=True, dst_dtype=FP4)
    for case in cases:
        if case["model"] not in TUNE_SHAPES or (case["op"] == "group_grad") != (family == "gg"):
            continue
        if case["op"].startswith("clipped"):
            continue
        t = _bench(lambda c=case: c["call"](BACKEND))
        pct = 100 * copy_ms[case["nbytes"]] / t
        out.append({"op": case["op"], "model": case["model"], "shape": case["shape"], "variant": v,
                    "ok": good, "ms": t, "pct": pct})  # fmt: skip
        _log(f"  tune {case['op']} {case['model']} {v}: {t:.4f} ms {pct:.1f} % {'ok' if good else 'WRONG'}")


# --------------------------------------------------------------------------------------- baselines


def _reference_kernel_args(case: dict):
    """The arguments the public op passes to the reference backend's kernel function, recorded from one
    eager call (the kernel contract of docs/design.md, outputs preallocated)."""
    from swiglu_ops.backends import reference

    name = REF_KERNELS[case["op"]]
    original = getattr(reference, name)
    seen = []

    def record(*a, **kw):
        seen.append((a, kw))
        return original(*a, **kw)

    setattr(reference, name, record)
    try:
        case["call"]("reference")
    finally:
        setattr(reference, name, original)
    return seen[0]


def run_baselines(cases: list[dict], rows: list[dict], budget: float, save) -> None:
    from swiglu_ops import bench as cpu_bench

    compiled: dict = {}
    first = cases[0]["model"]
    for case, row in zip(cases, rows, strict=True):
        if case["model"] != first:
            continue
        row["compiled_ref_ms"] = float("nan")
        if time.perf_counter() - T0 > budget:
            _log(f"  compiled reference for {case['op']} {row['shape']}: skipped (budget spent)")
            continue
        name = REF_KERNELS[case["op"]]
        try:
            args, kw = _reference_kernel_args(case)
            if name not in compiled:  # the reference kernel (group_grad: grad_weight as a plain sum)
                compiled[name] = torch.compile(
                    cpu_bench.reference_baseline(name), backend="eager" if SMOKE else "inductor"
                )
            fn = compiled[name]
            row["compiled_ref_ms"] = _bench_plain(lambda f=fn, a=args, k=kw: f(*a, **k))
        except Exception as exc:  # noqa: BLE001 - a baseline failure must not hide the op's numbers
            row["compiled_ref_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            _log(f"  compiled reference unavailable: {row['compiled_ref_error']}")
        _log(f"  compiled reference {case['op']} {row['shape']}: {row['compiled_ref_ms']:.3f} ms")
        save()


# -------------------------------------------------------------------------------------------- main


def _print_table(result: dict) -> None:
    path = "HW_CVT path" if result.get("hw_cvt") else "integer path"
    print(f"\n{result['device']}, {path}  (predicted: sass_budget.py's issue model, serial/overlap bound)")
    header = ("op", "model", "shape", "G", "MB", "ms", "GB/s", "% copy", "pred %", "comp. ref ms", "speedup")
    print("{:<20} {:<14} {:>11} {:>4} {:>8} {:>8} {:>6} {:>7} {:>9} {:>12} {:>8}".format(*header))
    for r in result["bench"]:
        t, ref = r["ms"], r.get("compiled_ref_ms", float("nan"))
        gbs = r["bytes"] / t / 1e6
        pred = f"{r['pred_serial']:.0f}/{r['pred_overlap']:.0f}"
        print(f"{r['op']:<20} {r['model']:<14} {r['shape']:>11} {r['groups']:>4} {r['bytes'] / 1e6:>8.1f} "
              f"{t:>8.4f} {gbs:>6.0f} {r['pct']:>6.1f}% {pred:>9} {ref:>12.4f} {ref / t:>7.1f}x")  # fmt: skip
    ms = {(r["op"], r["model"]): r["ms"] for r in result["bench"]}
    for op in ("bwd_mx e4m3", "fwd_mx e4m3"):
        ratios = [f"{m} x{ms[(op + ' weighted', m)] / t:.3f}" for (o, m), t in ms.items() if o == op
                  and (op + " weighted", m) in ms]  # fmt: skip
        if ratios:
            print(f"routing weight, {op} weighted / unweighted time: {', '.join(ratios)}")


def main(argv=None) -> int:
    global DEVICE, SMOKE
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tune", action="store_true", help="also time launch-configuration variants")
    p.add_argument("--no-check", action="store_true", help="skip the conformance sweep and the big case")
    p.add_argument("--no-baselines", action="store_true", help="skip the compiled reference")
    p.add_argument("--budget", type=float, default=420.0, help="seconds after which baselines are skipped")
    p.add_argument("--json", help="write all results to this file (after every stage)")
    p.add_argument("--sass", help=f"a sass_budget.py --json file (default: {SASS_DEFAULT.name} if present)")
    p.add_argument("--sass-regex", action="store_true", help="print sass_budget.py's --only for the bench")
    p.add_argument("--smoke", action="store_true", help="CPU tensors under TRITON_INTERPRET=1, tiny shapes")
    args = p.parse_args(argv)
    if args.sass_regex:
        print(sass_regex())
        return 0
    if args.smoke:
        from swiglu_ops.backends import triton as tb

        ready, why = tb.is_available("cpu")
        if not ready:
            print(f"bench_triton --smoke: {why}")
            return 2
        DEVICE, SMOKE = "cpu", True
    elif not torch.cuda.is_available():
        print("bench_triton: no CUDA device; the Triton backend benchmark needs an NVIDIA GPU (nothing run).")
        return 0
    import triton

    from swiglu_ops.backends import triton as tb

    if SMOKE:
        device, arch = "cpu (smoke run, Triton interpreter)", 90
    else:
        device, (major, minor) = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
        arch = 10 * major + minor
    path = "HW_CVT (PTX conversions, opt-in)" if tb.HW_CONVERSIONS else "integer (default)"
    _log(f"{device}, torch {torch.__version__}, triton {triton.__version__}, conversion path: {path}")
    result: dict = {
        "device": device, "arch": arch, "torch": torch.__version__, "triton": triton.__version__,
        "hw_cvt": tb.HW_CONVERSIONS,
    }  # fmt: skip

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))

    ok = True
    if not args.no_check:
        _log("check: triton against the reference")
        ok = result["check_ok"] = check()
        save()
        _log("check big (> 2**31 elements)")
        big = result["big_ok"] = check_big()
        ok &= big
        save()
        if not SMOKE:
            torch.cuda.empty_cache()
    _log("bench")
    sass = load_sass(args.sass)
    cases = list(bench_cases(SMOKE_SHAPES if SMOKE else SHAPES))
    copy_ms: dict = {}
    result["bench"] = run_bench(cases, copy_ms, sass, arch)
    save()
    if args.tune:
        _log("tune")
        result["tune"] = run_tune(cases, copy_ms)
        save()
    if not args.no_baselines:
        _log(f"baselines: reference kernels under torch.compile ({cases[0]['model']} shape)")
        run_baselines(cases, result["bench"], args.budget, save)
    save()
    _print_table(result)
    if not args.no_check:
        print("conformance:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
