"""Routing weights through the two dual-axis MX kernels (spec README 7.1), at the backend entry points.

``swiglu_mx_quant(..., weight=w)`` and ``swiglu_bwd_mx_quant(..., weight=w, grad_weight=g)`` of every
backend (the kernel contracts in ``docs/design.md``), called directly: the reference, the cpu backend
under every instruction set this machine runs, and the Triton kernels (under the interpreter on CPU
tensors: a reduced matrix of small shapes, the interpreter is slow). Shapes are awkward on purpose: M not a
multiple of 32, uneven groups with an empty one and rows past the last group end (the kernels clamp the
ends; those rows are zeros in every output and still get a grad_weight), and a forward N that is not a
multiple of 32.

Checked for every output, elementwise:
- weight None and weight ones give the unweighted call's bytes;
- powers of two (one per 32-row block) change only the scales: the codes are the unweighted ones, the
  scale codes shifted by log2(w) (except all-zero and NaN blocks, and where the shift would saturate);
- the reference's grad_weight is bitwise ``swiglu_group_grad``'s for ``y_origin = act16`` (the reference
  forward's unweighted stage 1);
- fast backends against the reference: codes and scales within the near-tie rule, grad_weight within
  ``1e-5 * max(|ref|, ||dy * act16||_2) + sum |dy| * |diff of act16|`` (the act16 term bounded by the span
  of the near-tie roundings); deterministic (cpu: the same bits for 1 and 2 threads and for rows cut into
  several tasks).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and "swiglu_ops.backends.triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (see conftest.py)

from _compare import assert_near_ties  # noqa: E402

from swiglu_ops.numerics import mx  # noqa: E402
from swiglu_ops.numerics.glu import GluParams, split_columns  # noqa: E402


def _backend(name: str):
    """The backend module ``name`` ("reference", "cpu", "triton"), or None where it cannot be imported: the
    one place that knows where the backends live."""
    try:
        return importlib.import_module(f"swiglu_ops.backends.{name}")
    except ImportError:
        return None


REFERENCE = _backend("reference")
CPU = _backend("cpu")
TRITON = _backend("triton")
# the reference's pieces used as oracles: its forward stage 1 (act16) and swiglu_group_grad
_REF_FWD = importlib.import_module(REFERENCE.__name__ + ".fwd_mx_quant")
_REF_GLU = importlib.import_module("swiglu_ops.numerics.glu")

HOST = torch.device("cpu")
TRITON_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU_OK = CPU is not None and CPU.is_available(torch.device("cpu"))[0]
TRITON_OK = TRITON is not None and TRITON.is_available(TRITON_DEVICE)[0]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GLUS = {
    "plain": GluParams(),
    "gpt_oss_interleaved": GluParams(interleaved=True, clipped=True, alpha=1.702, limit=7.0, bias=1.0),
    "gpt_oss_chunked": GluParams(clipped=True, alpha=1.702, limit=7.0, bias=1.0),
}
FORMATS = {"e4m3": mx.E4M3FN, "e2m1": mx.E2M1}
WEIGHTS = ("none", "ones", "pow2", "random")

M = 40  # two 32-row blocks of the slice, not a multiple of 32
ENDS = (7, 7, 30)  # uneven groups, an empty one, and rows 30..39 past the last end
FWD_COLS = 160  # N = 80: not a multiple of 32 (a partial block and a pad slot)
BWD_COLS = 128


# ------------------------------------------------------------------------------------------ inputs


@functools.cache
def _data(backward: bool, dtype: str, grouped: bool):
    """``(x, dy, group_ends)``: x with a few exact zeros; grouped [1, M, C] or two slices [2, 33, C]."""
    gen = torch.Generator().manual_seed(1 + 2 * backward + 4 * grouped)
    shape = (1, M) if grouped else (2, 33)
    cols = BWD_COLS if backward else FWD_COLS
    x = (torch.randn(*shape, cols, generator=gen) * 3).to(DTYPES[dtype])
    x[0, 5, : cols // 2] = 0.0  # a row whose activation is all zeros (zero blocks keep scale 0)
    dy = torch.randn(*shape, cols // 2, generator=gen).to(DTYPES[dtype])
    ends = torch.tensor(ENDS, dtype=torch.int64) if grouped else None
    return x, dy, ends


def _row_blocks(rows_per_slice: int, batch: int, ends):
    """Each flattened row's 32-row column block (a running index over the blocks of every group and
    slice), and the blocks' (batch, mxscale2 row, slot) in block order; rows past the last end: -1."""
    ranges, bases = mx.column_block_groups(ends, rows_per_slice)
    block = torch.full((batch * rows_per_slice,), -1, dtype=torch.int64)
    where = []
    for b in range(batch):
        for (start, end), base in zip(ranges, bases, strict=True):
            for t, r0 in enumerate(range(start, end, mx.BLOCK)):
                block[b * rows_per_slice + r0 : b * rows_per_slice + min(r0 + mx.BLOCK, end)] = len(where)
                where.append((b, base + t // 2, t % 2))
    return block, where


@functools.cache
def _weight(kind: str, backward: bool, dtype: str, grouped: bool):
    """The routing weight (fp32, one per flattened row) of ``kind``, and for "pow2" the log2 per row."""
    x, _, ends = _data(backward, dtype, grouped)
    rows = x.shape[0] * x.shape[1]
    if kind == "none":
        return None, None
    if kind == "ones":
        return torch.ones(rows), None
    if kind == "pow2":  # one power of two per column block: both axes' blocks scale as a whole
        block, where = _row_blocks(x.shape[1], x.shape[0], ends)
        shifts = torch.tensor([-2, 3, 1, -1, 2] if dtype != "fp16" else [3, 1, 2])  # fp16: no new subnormals
        log2 = shifts[block.clamp(min=0) % len(shifts)]
        return torch.exp2(log2.float()), log2
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(rows, generator=gen) * 2
    w[::6] = 0.0
    w[1::9] = -0.0
    return w, None


# ------------------------------------------------------------------------------------------- calls


def _fwd(module, x, ends, glu, fmt, weight, device=HOST):
    """The forward entry point's (y1, s1, y2, s2), every byte pre-filled with 0xAB."""
    batch, m, cols = x.shape
    n = cols // 2
    width = n // 2 if fmt.packed else n
    rows = mx.mxscale2_rows(m, None if ends is None else ends.numel())
    shapes = ((batch, m, width), (batch, m, mx.mxscale1_slots(n)), (batch, m, width), (batch, rows, n, 2))
    outs = [torch.full(s, 0xAB, dtype=torch.uint8, device=device) for s in shapes]
    kwargs = {} if weight is None else {"weight": weight.to(device)}
    scale_alg = 0 if fmt.packed else 1
    dev = [None if t is None else t.to(device) for t in (x, ends)]
    module.swiglu_mx_quant(dev[0], dev[1], glu, scale_alg, fmt, "rint", *outs, **kwargs)
    return [t.cpu() for t in outs]


def _bwd(module, x, dy, ends, glu, weight, device=HOST):
    """The backward entry point's (y1, s1, y2, s2) and grad_weight (None without weight)."""
    batch, m, cols = x.shape
    rows = mx.mxscale2_rows(m, None if ends is None else ends.numel())
    shapes = ((batch, m, cols), (batch, m, mx.mxscale1_slots(cols)), (batch, m, cols), (batch, rows, cols, 2))
    outs = [torch.full(s, 0xAB, dtype=torch.uint8, device=device) for s in shapes]
    kwargs, gw = {}, None
    if weight is not None:
        gw = torch.full((batch * m,), float("nan"), device=device)
        kwargs = {"weight": weight.to(device), "grad_weight": gw}
    dev = [None if t is None else t.to(device) for t in (x, dy, ends)]
    module.swiglu_bwd_mx_quant(*dev, glu, 1, mx.E4M3FN, *outs, **kwargs)
    return [t.cpu() for t in outs], None if gw is None else gw.cpu()


@functools.cache
def _reference(backward: bool, dtype: str, glu: str, fmt: str, weight: str, grouped: bool = True):
    x, dy, ends = _data(backward, dtype, grouped)
    w = _weight(weight, backward, dtype, grouped)[0]
    if backward:
        return _bwd(REFERENCE, x, dy, ends, GLUS[glu], w)
    return _fwd(REFERENCE, x, ends, GLUS[glu], FORMATS[fmt], w), None


# ------------------------------------------------------------------------------------------ checks

NAMES = ("y1", "mxscale1", "y2", "mxscale2")


def _same_bytes(got, want, what: str) -> None:
    for g, e, name in zip(got, want, NAMES, strict=True):
        bad = (g != e).nonzero()
        assert bad.numel() == 0, f"{what}: {name} differs at {bad.shape[0]} places, first {bad[:4].tolist()}"


def _check_pow2(got, unweighted, log2, backward: bool, dtype: str, grouped: bool, what: str) -> None:
    """Codes equal to the unweighted call; scale codes shifted by log2(w) of their block (mxscale1: the
    row's, mxscale2: the column block's), except codes 0 (all-zero blocks), 0xFF (NaN) and saturation."""
    x, _, ends = _data(backward, dtype, grouped)
    batch, m = x.shape[:2]
    for i in (0, 2):
        assert torch.equal(got[i], unweighted[i]), f"{what}: {NAMES[i]} changed by a power-of-two weight"

    def shifted(w_codes, u_codes, k, name):
        u, w = u_codes.to(torch.int64), w_codes.to(torch.int64)
        k = k.expand_as(u)
        keep = (u == 0) | (u == 0xFF)
        want = torch.where(keep, u, u + k)
        check = keep | ((want >= 1) & (want <= 254))
        bad = (w != want) & check
        assert not bad.any(), f"{what}: {name} not shifted by log2(w) at {bad.nonzero()[:4].tolist()}"

    s1_k = log2.reshape(batch, m, 1)
    shifted(got[1], unweighted[1], s1_k, "mxscale1")
    block, where = _row_blocks(m, batch, ends)
    for idx, (b, r, slot) in enumerate(where):
        k = log2[(block == idx).nonzero()[0, 0]]
        shifted(got[3][b, r, :, slot], unweighted[3][b, r, :, slot], k, "mxscale2")


def _act16(x, glu):
    """The forward operator's unweighted stage 1 in x's dtype, [rows, N] (the reference's)."""
    return _REF_FWD.stage1(x, glu).reshape(-1, x.shape[-1] // 2)


def _check_grad_weight_reference(gw, backward_inputs, glu) -> None:
    """Bitwise ``swiglu_group_grad``'s grad_weight for y_origin = act16."""
    x, dy = backward_inputs
    act16 = _act16(x, glu)
    dy2 = dy.reshape(act16.shape)
    rows, n = act16.shape
    grad_x, want = torch.empty(rows, 2 * n, dtype=x.dtype), torch.empty(rows)
    REFERENCE.swiglu_group_grad(dy2, x.reshape(rows, 2 * n), torch.ones(rows), act16, None, 0.0, grad_x, want)
    bad = gw.view(torch.int32) != want.view(torch.int32)
    assert not bad.any(), f"grad_weight differs from swiglu_group_grad's at rows {bad.nonzero()[:5].tolist()}"


def _check_grad_weight_fast(gw, ref, backward_inputs, glu, what: str) -> None:
    """``|gw - ref| <= 1e-5 * max(|ref|, ||dy * act16||) + sum |dy| * |act16 near-tie span|``."""
    x, dy = backward_inputs
    xf = x.float()
    a_cols, b_cols = split_columns(x.shape[-1], glu)
    act32 = _REF_GLU.forward(xf[..., a_cols], xf[..., b_cols], glu).reshape(gw.numel(), -1).double()
    act16 = _act16(x, glu).double()
    d = dy.reshape(act16.shape).double()
    eps = 8 * 2.0**-24  # a few ulp of the fast backends' exp
    hi = (act32 * (1 + eps)).float().to(x.dtype).double()
    lo = (act32 * (1 - eps)).float().to(x.dtype).double()
    slack = (d.abs() * (hi - lo).abs()).nan_to_num(0.0).sum(-1)
    l2 = (d * act16).norm(dim=-1)
    r, g = ref.double(), gw.double()
    bound = 1e-5 * torch.maximum(r.abs(), l2) + slack
    nan = torch.isnan(r)
    assert torch.equal(torch.isnan(g), nan), f"{what}: grad_weight NaN positions differ"
    bad = ~nan & ~((g - r).abs() <= bound)
    assert not bad.any(), f"{what}: grad_weight out of bound at rows {bad.nonzero()[:5].flatten().tolist()}"


def _near(got, want, what: str) -> None:
    for g, e, name in zip(got, want, NAMES, strict=True):
        assert_near_ties(g, e, f"{what}: {name}")


# ------------------------------------------------------------------------------------ the backends


def _isas():
    return CPU.LIBRARY.supported_isas() if CPU_OK else []


def _run_fast(backend: str, backward: bool, dtype, glu, fmt, weight, grouped=True):
    """The backend's outputs for every variant it runs: {variant name: (outs, grad_weight)}."""
    x, dy, ends = _data(backward, dtype, grouped)
    w = _weight(weight, backward, dtype, grouped)[0]
    if backend == "reference":
        return {"reference": _reference(backward, dtype, glu, fmt, weight, grouped)}
    if backend == "triton":
        if backward:
            return {"triton": _bwd(TRITON, x, dy, ends, GLUS[glu], w, TRITON_DEVICE)}
        return {"triton": (_fwd(TRITON, x, ends, GLUS[glu], FORMATS[fmt], w, TRITON_DEVICE), None)}
    results = {}
    for isa in _isas():
        with CPU.instruction_set(isa):
            if backward:
                results[f"cpu/{isa}"] = _bwd(CPU, x, dy, ends, GLUS[glu], w)
            else:
                results[f"cpu/{isa}"] = (_fwd(CPU, x, ends, GLUS[glu], FORMATS[fmt], w), None)
    return results


def _check_all_weights(backend: str, backward: bool, dtype: str, glu: str, fmt: str, weights, grouped=True):
    x, dy, _ = _data(backward, dtype, grouped)
    runs = {kind: _run_fast(backend, backward, dtype, glu, fmt, kind, grouped) for kind in weights}
    for variant, (unweighted, gw_none) in runs["none"].items():
        assert gw_none is None
        if backend != "reference":  # the unweighted call against the reference (as the existing tests do)
            _near(unweighted, _reference(backward, dtype, glu, fmt, "none", grouped)[0], f"{variant} none")
        for kind in weights[1:]:
            outs, gw = runs[kind][variant]
            what = f"{variant} weight={kind}"
            if grouped:  # rows past the last group end: zeros whatever their weight
                for i in (0, 1, 2):
                    assert not outs[i][:, ENDS[-1] :].any(), f"{what}: {NAMES[i]} rows past the last end"
            if kind == "ones":
                _same_bytes(outs, unweighted, what)
            elif kind == "pow2":
                log2 = _weight(kind, backward, dtype, grouped)[1]
                _check_pow2(outs, unweighted, log2, backward, dtype, grouped, what)
            elif backend != "reference":
                _near(outs, _reference(backward, dtype, glu, fmt, kind, grouped)[0], what)
            if backward:
                assert gw is not None and not gw.isnan().all()
                if backend == "reference":
                    _check_grad_weight_reference(gw, (x, dy), GLUS[glu])
                else:
                    ref_gw = _reference(backward, dtype, glu, fmt, kind, grouped)[1]
                    _check_grad_weight_fast(gw, ref_gw, (x, dy), GLUS[glu], what)


# -------------------------------------------------------------------------------------------- tests

COMBOS = [(d, g) for d in DTYPES for g in GLUS]
needs_cpu = pytest.mark.skipif(not CPU_OK, reason="cpu backend unavailable")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="triton backend unavailable")
# the interpreter's NaN arithmetic in masked-off lanes
quiet_interpreter = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype,glu", COMBOS)
@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=needs_cpu)])
def test_forward(backend, dtype, glu, fmt):
    _check_all_weights(backend, False, dtype, glu, fmt, WEIGHTS)


@pytest.mark.parametrize("dtype,glu", COMBOS)
@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=needs_cpu)])
def test_backward(backend, dtype, glu):
    _check_all_weights(backend, True, dtype, glu, "e4m3", WEIGHTS)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=needs_cpu)])
def test_batch_slices_without_groups(backend, backward):
    """[2, 33, C] without groups: w[row] = weight[b * M + m]."""
    _check_all_weights(backend, backward, "bf16", "gpt_oss_interleaved", "e4m3", WEIGHTS, grouped=False)


@needs_triton
@quiet_interpreter
@pytest.mark.parametrize("dtype,glu", COMBOS)
def test_triton_forward(dtype, glu):
    """Small shapes (the interpreter): every weight with FP8, None and random weights with FP4."""
    _check_all_weights("triton", False, dtype, glu, "e4m3", WEIGHTS)
    _check_all_weights("triton", False, dtype, glu, "e2m1", ("none", "random"))


@needs_triton
@quiet_interpreter
@pytest.mark.parametrize("dtype,glu", COMBOS)
def test_triton_backward(dtype, glu):
    _check_all_weights("triton", True, dtype, glu, "e4m3", WEIGHTS)


def _unaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` that is not 16-byte aligned (the Triton kernels' masked loads)."""
    out = torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)
    return out.copy_(t)


@quiet_interpreter
@pytest.mark.parametrize(
    "backend", [pytest.param("cpu", marks=needs_cpu), pytest.param("triton", marks=needs_triton)]
)
def test_glu_whose_padding_is_not_zero(backend):
    """A clipped GLU whose padding values are not +0.0 (bias -9: clip(B) + bias; the Triton kernels select
    the padding away, ``PAD_SELECT``), on aligned and unaligned tensors (Triton: plain and masked loads,
    whose rows past the last group end the weighted backward loads for grad_weight): the weighted outputs
    match the reference's."""
    glu = GluParams(clipped=True, alpha=1.0, limit=7.0, bias=-9.0)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(M, generator=gen)
    ends = torch.tensor(ENDS)
    module, device = (CPU, HOST) if backend == "cpu" else (TRITON, TRITON_DEVICE)
    x = (torch.randn(1, M, FWD_COLS, generator=gen) * 3).to(torch.bfloat16)
    ref = _fwd(REFERENCE, x, ends, glu, mx.E4M3FN, w)
    for xs in (x, _unaligned(x)):
        _near(_fwd(module, xs, ends, glu, mx.E4M3FN, w, device), ref, backend)
    x = (torch.randn(1, M, BWD_COLS, generator=gen) * 3).to(torch.bfloat16)
    dy = torch.randn(1, M, BWD_COLS // 2, generator=gen).to(torch.bfloat16)
    ref, ref_gw = _bwd(REFERENCE, x, dy, ends, glu, w)
    for xs, dys in ((x, dy), (_unaligned(x), _unaligned(dy))):
        outs, gw = _bwd(module, xs, dys, ends, glu, w, device)
        _near(outs, ref, backend)
        _check_grad_weight_fast(gw, ref_gw, (x, dy), glu, backend)


@needs_cpu
@pytest.mark.parametrize("glu", ["plain", "gpt_oss_interleaved"])
def test_cpu_grad_weight_is_deterministic(glu):
    """The same bits for 1 and 2 threads and for rows cut into several tasks (block sums through the
    scratch array), on a row of 4 grad_weight blocks."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 37, 1024, generator=gen).to(torch.bfloat16)
    dy = torch.randn(1, 37, 512, generator=gen).to(torch.bfloat16)
    w = torch.randn(37, generator=gen)
    ends = torch.tensor([5, 37])
    base = _bwd(CPU, x, dy, ends, GLUS[glu], w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _bwd(CPU, x, dy, ends, GLUS[glu], w)
    finally:
        torch.set_num_threads(threads)
    with CPU.mx_tile_pairs(1):
        cut = _bwd(CPU, x, dy, ends, GLUS[glu], w)
    for other in (one, cut):
        _same_bytes(other[0], base[0], "cpu")
        assert torch.equal(other[1].view(torch.int32), base[1].view(torch.int32))
    ref = _bwd(REFERENCE, x, dy, ends, GLUS[glu], w)
    _check_grad_weight_fast(base[1], ref[1], (x, dy), GLUS[glu], "cpu")
