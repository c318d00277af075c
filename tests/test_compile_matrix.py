"""Every public function under torch.compile, equal to eager bit for bit (spec README 6.3).

The matrix: out= and inputs that require grad, the helpers (mx_dequantize, layouts) x {compile, compile
fullgraph, compile fullgraph dynamic} x {cpu, reference, triton (under the interpreter)} against the eager
call of the same function and backend (each operator itself: tests/test_operator_matrix.py); the autograd
functions and modules (forward and gradients) also under the default Inductor backend (fullgraph, static and
dynamic). Compiles use ``aot_eager`` elsewhere: the operators are opaque custom ops, so Inductor would add
nothing but compile time to the check (the autograd functions' own math is where Inductor generates code).
Plus the order of calls: compiling before any eager call, in a fresh process, leaves eager calls intact.

Shapes are tiny (70 rows, ragged groups including an empty one) so that the whole file stays affordable.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import swiglu_ops
from swiglu_ops import layouts

MODES = {
    "compile": dict(backend="aot_eager"),
    "fullgraph": dict(backend="aot_eager", fullgraph=True),
    "dynamic": dict(backend="aot_eager", fullgraph=True, dynamic=True),
}
INDUCTOR_MODES = {"inductor": dict(fullgraph=True), "inductor-dynamic": dict(fullgraph=True, dynamic=True)}

M = 70
ENDS = torch.tensor([20, 20, 70])  # cumulative row ends (MX operators, layouts): an empty group, ragged
COUNTS = torch.tensor([30, 20])  # group counts (group grad, clipped SwiGLU): rows 50.. masked


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # every test compiles its own functions; no cache-size limit across the matrix
    yield
    torch._dynamo.reset()


def _data():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(M, 128, generator=gen) * 3).bfloat16()
    return dict(
        x=x,
        dy=torch.randn(M, 64, generator=gen).bfloat16(),
        w=torch.rand(M, generator=gen),
        xf=(torch.randn(M, 80, generator=gen) * 2).bfloat16(),  # forward MX op: N = 40 (a pad slot)
    )


DATA = _data()


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_bitwise(got, want):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_bitwise(g, w)
        return
    if want is None:
        assert got is None
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(_bits(got), _bits(want))


# ----------------------------------------------------------------------------------------------- operators


def op_cases(b):
    d = DATA
    return {
        "swiglu_group_grad": lambda dy, x, w: swiglu_ops.swiglu_group_grad(
            dy, x, w, dy, COUNTS, 7.0, backend=b
        ),
        "swiglu_backward_mx_quant_dual_axis": lambda dy, x, w: swiglu_ops.swiglu_backward_mx_quant_dual_axis(
            x, dy, ENDS, backend=b
        ),
        "swiglu_mx_quant_dual_axis": lambda dy, x, w: swiglu_ops.swiglu_mx_quant_dual_axis(
            d["xf"], ENDS, backend=b
        ),
        "swiglu_mx_quant_dual_axis-fp4": lambda dy, x, w: swiglu_ops.swiglu_mx_quant_dual_axis(
            d["xf"], ENDS, dst_dtype=torch.float4_e2m1fn_x2, backend=b
        ),
        "clipped_swiglu": lambda dy, x, w: swiglu_ops.clipped_swiglu(x, COUNTS, backend=b),
        "clipped_swiglu_grad": lambda dy, x, w: swiglu_ops.clipped_swiglu_grad(dy, x, COUNTS, backend=b),
    }


OPS = list(op_cases("reference"))


# Each operator compiled against eager, on every backend and on awkward shapes: tests/test_operator_matrix.py
# (from the operator table). Here: out=, inputs that require grad, the helpers and the autograd wrappers.


@pytest.mark.parametrize("mode", MODES)
def test_out_and_requires_grad_inputs_compiled_equal_eager(mode):
    """out= (group grad, clipped SwiGLU) and inputs that require grad trace too."""

    def fn(dy, x, w):
        gx = torch.empty_like(x)
        gw = torch.empty_like(w)
        swiglu_ops.swiglu_group_grad(dy, x, w, dy, COUNTS, 7.0, backend="reference", out=(gx, gw))
        y = torch.empty_like(dy)
        swiglu_ops.clipped_swiglu(x, COUNTS, backend="reference", out=y)
        return gx, gw, y, swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, backend="reference")

    args = (DATA["dy"], DATA["x"], DATA["w"].clone().requires_grad_())
    with torch.no_grad():
        want = fn(*args)
    got = torch.compile(fn, **MODES[mode])(*args)
    assert_bitwise(got, want)
    assert not any(t.requires_grad for t in got[:3])


def _bad_outs(dy, x, w):
    gx, gw = torch.empty_like(x), torch.empty_like(w)
    return {  # out= of swiglu_group_grad: (with weight?, out) -> the eager error
        "grad_weight None": (True, (gx, None), TypeError, "grad_weight"),
        "one of two": (True, (gx,), TypeError, "out must be a"),
        "three of two": (True, (gx, gw, torch.empty_like(w)), TypeError, "out must be a"),
        "absent output given": (False, (gx, torch.empty(0)), ValueError, "must be None"),
    }


@pytest.mark.parametrize("case", list(_bad_outs(torch.ones(1), torch.ones(1), torch.ones(1))))
def test_bad_out_tuples_are_the_eager_error_inside_torch_compile(case):
    """A malformed out= tuple is refused while tracing as in eager (it used to be zipped loosely: a None
    entry dropped grad_weight, extra or missing entries passed)."""

    def fn(dy, x, w):
        weighted, out, _, _ = _bad_outs(dy, x, w)[case]
        if weighted:
            return swiglu_ops.swiglu_group_grad(dy, x, w, dy, COUNTS, 7.0, backend="reference", out=out)
        return swiglu_ops.swiglu_group_grad(dy, x, None, None, COUNTS, 7.0, backend="reference", out=out)

    args = (DATA["dy"], DATA["x"], DATA["w"])
    _, _, error, match = _bad_outs(*args)[case]
    with pytest.raises(error, match=match):
        fn(*args)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=match):
        torch.compile(fn, fullgraph=True)(*args)


# ----------------------------------------------------------------------------- dequantisation and layouts


def _mx_outputs():
    return swiglu_ops.swiglu_backward_mx_quant_dual_axis(DATA["x"], DATA["dy"], ENDS, backend="reference")


MXOUT = _mx_outputs()
FWDOUT = swiglu_ops.swiglu_mx_quant_dual_axis(DATA["xf"], ENDS, backend="reference")

HELPERS = {
    "mx_dequantize-rows": lambda y1, s1, y2, s2: swiglu_ops.mx_dequantize(y1, s1, axis=-1),
    "mx_dequantize-tokens": lambda y1, s1, y2, s2: swiglu_ops.mx_dequantize(
        y2, s2, axis=-2, group_index=ENDS, dtype=torch.bfloat16
    ),
    "to_blocked": lambda y1, s1, y2, s2: layouts.to_blocked(s1.flatten(-2)),
    "mxscale1_to_plain": lambda y1, s1, y2, s2: layouts.mxscale1_to_plain(FWDOUT[1], 40),
    "mxscale2_to_plain": lambda y1, s1, y2, s2: layouts.mxscale2_to_plain(s2, M, ENDS),
    "mxscale1_to_blocked": lambda y1, s1, y2, s2: layouts.mxscale1_to_blocked(s1, ENDS),
    "mxscale1_to_blocked-forward": lambda y1, s1, y2, s2: layouts.mxscale1_to_blocked(FWDOUT[1]),
    "mxscale2_to_blocked": lambda y1, s1, y2, s2: layouts.mxscale2_to_blocked(s2, M, ENDS),
    "mxscale2_to_blocked-forward": lambda y1, s1, y2, s2: layouts.mxscale2_to_blocked(FWDOUT[3], M, ENDS),
    "counts_to_ends": lambda y1, s1, y2, s2: swiglu_ops.counts_to_ends(COUNTS),
    "ends_to_counts": lambda y1, s1, y2, s2: swiglu_ops.ends_to_counts(ENDS.to(torch.int32)),
}


#: Under the default Inductor backend too (where float8_e8m0fnu used to fail Inductor's code generation); the
#: other helpers go through the same custom-op mechanism, so aot_eager suffices for them.
INDUCTOR_HELPERS = ("mx_dequantize-tokens", "mxscale1_to_plain", "mxscale2_to_blocked")
HELPER_CELLS = [(n, m) for n in HELPERS for m in MODES] + [(n, "inductor") for n in INDUCTOR_HELPERS]


@pytest.mark.parametrize(("name", "mode"), HELPER_CELLS)
def test_helper_compiled_equals_eager(name, mode):
    fn = HELPERS[name]
    want = fn(*MXOUT)
    kwargs = MODES.get(mode, dict(fullgraph=True))
    assert_bitwise(torch.compile(fn, **kwargs)(*MXOUT), want)


# ----------------------------------------------------------------------------- autograd functions, modules


def autograd_cases(b):
    return {
        "clamped_swiglu": (lambda x, w: swiglu_ops.clamped_swiglu(x, w, COUNTS, 7.0, backend=b), "xw"),
        "ClampedSwiGLU": (swiglu_ops.ClampedSwiGLU(3.0, backend=b), "xwc"),
        "ClippedSwiGLU": (swiglu_ops.ClippedSwiGLU(backend=b), "xc"),
        "clipped_swiglu": (lambda x: swiglu_ops.clipped_swiglu(x, COUNTS, backend=b), "x"),
        "ClippedSwiGLU-mode1": (swiglu_ops.ClippedSwiGLU(interleaved=False, clamp_mode=1, backend=b), "x"),
        "swiglu_mx_backward": (lambda x: swiglu_ops.swiglu_mx_backward(x, ENDS, backend=b), "x"),
        "swiglu_mx_backward-gpt-oss": (
            lambda x: swiglu_ops.swiglu_mx_backward(
                x, ENDS, limit=7.0, alpha=1.702, bias=1.0, interleaved=True, backend=b
            ),
            "x",
        ),
    }


AUTOGRAD = list(autograd_cases("reference"))


def forward_backward(fn, spec):
    x = DATA["x"].clone().requires_grad_()
    w = DATA["w"].clone().requires_grad_()
    args = {"x": (x,), "xw": (x, w), "xwc": (x, w, COUNTS), "xc": (x, COUNTS)}[spec]
    y = fn(*args)
    y.backward(DATA["dy"])
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", AUTOGRAD)
def test_autograd_compiled_equals_eager(name, mode, backend):
    fn, spec = autograd_cases(backend)[name]
    want = forward_backward(fn, spec)
    assert_bitwise(forward_backward(torch.compile(fn, **MODES[mode]), spec), want)


@pytest.mark.parametrize("mode", INDUCTOR_MODES)
@pytest.mark.parametrize("name", AUTOGRAD)
def test_autograd_under_inductor_equals_eager(name, mode):
    fn, spec = autograd_cases("cpu" if "cpu" in swiglu_ops.available_backends() else "reference")[name]
    want = forward_backward(fn, spec)
    assert_bitwise(forward_backward(torch.compile(fn, **INDUCTOR_MODES[mode]), spec), want)


def test_capture_under_fullgraph_is_a_clear_error():
    capture = swiglu_ops.MXGradient()
    fn = torch.compile(
        lambda x: swiglu_ops.swiglu_mx_backward(x, ENDS, backend="reference", capture=capture), fullgraph=True
    )
    with pytest.raises(Exception, match="capture"):
        fn(DATA["x"].clone().requires_grad_())
    # Without fullgraph the call runs eagerly (graph break) and fills the capture.
    torch._dynamo.reset()
    x = DATA["x"].clone().requires_grad_()
    torch.compile(lambda x: swiglu_ops.swiglu_mx_backward(x, ENDS, backend="reference", capture=capture))(
        x
    ).backward(DATA["dy"])
    assert capture.y1 is not None and capture.y1.dtype == torch.float8_e4m3fn


# ------------------------------------------------------------------------------------ order of the calls

_ORDER_SCRIPT = """
import os
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch, swiglu_ops
from swiglu_ops import layouts

def bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t

def same(a, b):
    if isinstance(a, (tuple, list)):
        return all(same(u, v) for u, v in zip(a, b, strict=True))
    return a is None and b is None or bits(a).shape == bits(b).shape and torch.equal(bits(a), bits(b))

gen = torch.Generator().manual_seed(0)
x = torch.randn(70, 128, generator=gen).bfloat16()
dy = torch.randn(70, 64, generator=gen).bfloat16()
w = torch.rand(70, generator=gen)
ends, counts = torch.tensor([20, 20, 70]), torch.tensor([30, 20])

def grads(fn):
    xx = x.clone().requires_grad_()
    y = fn(xx)
    y.backward(dy)
    return y.detach(), xx.grad

calls, forwards = {}, {}  # calls: no arguments; forwards: x -> y, checked with their gradients
for b in BACKENDS:
    calls[b + " group_grad"] = lambda b=b: swiglu_ops.swiglu_group_grad(dy, x, w, dy, counts, 7.0, backend=b)
    calls[b + " bwd mx"] = lambda b=b: swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend=b)
    calls[b + " fwd mx"] = lambda b=b: swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, backend=b)
    calls[b + " clipped"] = lambda b=b: swiglu_ops.clipped_swiglu(x, counts, backend=b)
    calls[b + " clipped grad"] = lambda b=b: swiglu_ops.clipped_swiglu_grad(dy, x, counts, backend=b)
    forwards[b + " mx backward"] = lambda t, b=b: swiglu_ops.swiglu_mx_backward(t, ends, backend=b)
    forwards[b + " clamped"] = lambda t, b=b: swiglu_ops.ClampedSwiGLU(7.0, backend=b)(t, w, counts)
    forwards[b + " clipped module"] = lambda t, b=b: swiglu_ops.ClippedSwiGLU(backend=b)(t, counts)
y1, s1, y2, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ends, backend="reference")
calls["dequantize"] = lambda: swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=ends)
calls["layouts"] = lambda: (layouts.mxscale1_to_blocked(s1, ends), layouts.mxscale2_to_blocked(s2, 70, ends),
                            layouts.mxscale2_to_plain(s2, 70, ends), layouts.to_blocked(s1.flatten(-2)))

def run_all(compile_kwargs):
    out = {k: (torch.compile(f, **compile_kwargs) if compile_kwargs else f)() for k, f in calls.items()}
    for k, f in forwards.items():
        out[k] = grads(torch.compile(f, **compile_kwargs) if compile_kwargs else f)
    return out

compiled = run_all(dict(fullgraph=True))  # before any eager call
eager = run_all(None)
again = run_all(dict(backend="aot_eager", fullgraph=True, dynamic=True))
bad = [k for k in eager if not (same(compiled[k], eager[k]) and same(again[k], eager[k]))]
print("ORDER-OK" if not bad else f"MISMATCH {bad}")
"""


@pytest.mark.slow(seconds=55)
def test_compile_before_any_eager_call_in_a_fresh_process():
    from conftest import BACKENDS

    script = f"BACKENDS = {list(BACKENDS)!r}\n" + textwrap.dedent(_ORDER_SCRIPT)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ORDER-OK" in proc.stdout, proc.stdout[-2000:]
