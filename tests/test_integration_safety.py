"""No silent wrong results at the API (docs/integration.md section 8): group values checked wherever they can
be read without a device synchronisation (compiled too), the two group conventions not confused silently,
out= tensors that overlap an input or each other rejected, inputs that require grad accepted, out= tensors
that require grad refused; plus the smaller integration fixes (CLI, docs of the module, messages)."""

from __future__ import annotations

import pydoc
import warnings

import pytest
import torch

import swiglu_ops
from swiglu_ops import cli

GEN = torch.Generator().manual_seed(5)
X = (torch.randn(128, 128, generator=GEN) * 3).bfloat16()
DY = torch.randn(128, 64, generator=GEN).bfloat16()
W = torch.rand(128, generator=GEN)
XF = torch.randn(128, 96, generator=GEN).bfloat16()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # the tests compile closures of one code object: no recompile limit across them
    yield
    torch._dynamo.reset()


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_bitwise(got, want):
    for g, w in zip(got, want, strict=True):
        assert (g is None and w is None) or torch.equal(_bits(g), _bits(w))


# ------------------------------------------------------------------------------------- group values


MX_OPS = {
    "backward": lambda gi, b="reference": swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, gi, backend=b),
    "forward": lambda gi, b="reference": swiglu_ops.swiglu_mx_quant_dual_axis(XF, gi, backend=b),
}


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("op", MX_OPS)
def test_invalid_ends_are_an_error_under_compile(op, fullgraph, backend):
    """CPU group ends are checked by the custom op's real kernel: [50] for M = 128 (rows past the end would
    come out as zeros) is the same error compiled as eager."""
    fn = torch.compile(lambda gi: MX_OPS[op](gi, backend), backend="aot_eager", fullgraph=fullgraph)
    with pytest.raises(
        ValueError, match=r"group_index \(cumulative row ends\) last value must equal .* M = 128"
    ):
        fn(torch.tensor([50]))
    with pytest.raises(ValueError, match=r"group_index \(cumulative row ends\) must be non-decreasing"):
        fn(torch.tensor([100, 60, 128]))
    assert_bitwise(fn(torch.tensor([60, 128])), MX_OPS[op](torch.tensor([60, 128]), backend))


@pytest.mark.parametrize("op", MX_OPS)
def test_counts_passed_as_ends_are_named(op):
    with pytest.raises(ValueError, match=r"sum is 128 = M: these look like group counts.*counts_to_ends"):
        MX_OPS[op](torch.tensor([64, 64]))
    with pytest.raises(ValueError, match=r"cumulative row ends"):
        MX_OPS[op](torch.tensor([-1, 128]))


COUNT_OPS = {
    "swiglu_group_grad": lambda gi: swiglu_ops.swiglu_group_grad(DY, X, group_index=gi, backend="reference"),
    "clipped_swiglu": lambda gi: swiglu_ops.clipped_swiglu(X, gi, backend="reference"),
    "clipped_swiglu_grad": lambda gi: swiglu_ops.clipped_swiglu_grad(DY, X, gi, backend="reference"),
    "ClampedSwiGLU": lambda gi: swiglu_ops.ClampedSwiGLU(7.0, backend="reference")(X, None, gi),
}


@pytest.mark.parametrize("op", COUNT_OPS)
def test_ends_passed_as_counts_warn(op):
    """Cumulative ends [50, 100] of a 128-row buffer read as counts sum to 150 >= 128: every row would be
    valid and the padding rows 100.. silently unmasked. A GroupConventionWarning says so."""
    with pytest.warns(
        swiglu_ops.GroupConventionWarning, match=r"group counts.*cumulative row ends.*ends_to_counts"
    ):
        COUNT_OPS[op](torch.tensor([50, 100]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # legitimate counts: no warning
        COUNT_OPS[op](torch.tensor([50, 50]))
        COUNT_OPS[op](torch.tensor([0, 0, 128]))
        COUNT_OPS[op](torch.tensor([90, 40]))  # over-full but not non-decreasing: counts, not ends


def test_the_warning_is_raised_under_compile_too():
    fn = torch.compile(COUNT_OPS["swiglu_group_grad"], backend="aot_eager", fullgraph=True)
    with pytest.warns(swiglu_ops.GroupConventionWarning):
        fn(torch.tensor([50, 100]))


def test_errors_name_the_convention():
    with pytest.raises(TypeError, match=r"group_index \(group counts\) must be int64 or int32"):
        COUNT_OPS["swiglu_group_grad"](torch.tensor([1.0]))
    with pytest.raises(TypeError, match=r"group_index \(cumulative row ends\) must be int64 or int32"):
        MX_OPS["backward"](torch.tensor([128.0]))
    with pytest.raises(ValueError, match=r"group_index \(group counts\) must be 1-D"):
        COUNT_OPS["clipped_swiglu"](torch.tensor([[1]]))


def test_conversions_to_and_from_pytorch_offs():
    counts = torch.tensor([3, 0, 5], dtype=torch.int32)
    ends = swiglu_ops.counts_to_ends(counts)
    assert ends.tolist() == [3, 3, 8] and ends.dtype == torch.int32
    assert swiglu_ops.ends_to_counts(ends).tolist() == [3, 0, 5]
    assert swiglu_ops.ends_to_counts(torch.tensor([7])).tolist() == [7]
    # What the conversion is for: PyTorch's offs (ends) drive both conventions to the same rows.
    offs = torch.tensor([40, 40, 100])  # 100 valid rows of 128
    a = swiglu_ops.swiglu_group_grad(DY, X, group_index=swiglu_ops.ends_to_counts(offs), backend="reference")
    assert not a[0][100:].any() and a[0][:100].any()
    with pytest.raises(TypeError, match=r"counts \(group counts\) must be int32 or int64"):
        swiglu_ops.counts_to_ends(torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"ends \(cumulative row ends\) must be 1-D"):
        swiglu_ops.ends_to_counts(torch.tensor(3))


# --------------------------------------------------------------------------------------------- out=


def test_group_grad_out_overlapping_an_input_is_rejected(backend):
    x = X.clone()
    with pytest.raises(ValueError, match=r"out\[0\] \(grad_x\) must not overlap x"):
        swiglu_ops.swiglu_group_grad(DY, x, W, DY, backend=backend, out=(x, torch.empty(128)))
    w = W.clone()
    with pytest.raises(ValueError, match=r"out\[1\] \(grad_weight\) must not overlap weight"):
        swiglu_ops.swiglu_group_grad(DY, X, w, DY, backend=backend, out=(torch.empty_like(X), w))
    buf = torch.empty(2 * X.numel(), dtype=torch.bfloat16)  # grad_weight inside grad_x's bytes
    with pytest.raises(
        ValueError, match=r"out\[0\] \(grad_x\) and out\[1\] \(grad_weight\) must be distinct"
    ):
        swiglu_ops.swiglu_group_grad(
            DY,
            X,
            W,
            DY,
            backend=backend,
            out=(buf[: X.numel()].view(X.shape), buf[64:320].view(torch.float32)),
        )
    # Disjoint parts of one buffer are fine, and give the fresh result.
    gx, gw = buf[: X.numel()].view(X.shape), buf[X.numel() : X.numel() + 256].view(torch.float32)
    swiglu_ops.swiglu_group_grad(DY, X, W, DY, backend=backend, out=(gx, gw))
    assert_bitwise((gx, gw), swiglu_ops.swiglu_group_grad(DY, X, W, DY, backend=backend))


@pytest.mark.parametrize("op", ["backward", "forward"])
def test_mx_out_repeated_or_overlapping_is_rejected(op, backend):
    call = {
        "backward": lambda out: swiglu_ops.swiglu_backward_mx_quant_dual_axis(
            X, DY, backend=backend, out=out
        ),
        "forward": lambda out: swiglu_ops.swiglu_mx_quant_dual_axis(XF, backend=backend, out=out),
    }[op]
    y1, s1, y2, s2 = call(None)
    with pytest.raises(ValueError, match=r"out\[0\] \(y1\) and out\[2\] \(y2\) must be distinct"):
        call((y1, s1, y1, s2))
    fresh = [torch.empty_like(t) for t in (y1, s1, y2, s2)]
    assert_bitwise(call(fresh), (y1, s1, y2, s2))


def test_mx_out_overlapping_x_is_rejected():
    x = torch.empty(128 * 128 + 128 * 64, dtype=torch.bfloat16)
    xv = x[: 128 * 128].view(128, 128).copy_(X)
    y1 = x.view(torch.uint8)[: 128 * 128].view(torch.float8_e4m3fn).view(128, 128)  # inside x's bytes
    _, s1, y2, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, backend="reference")
    with pytest.raises(ValueError, match=r"out\[0\] \(y1\) must not overlap x"):
        swiglu_ops.swiglu_backward_mx_quant_dual_axis(
            xv,
            DY,
            backend="reference",
            out=(y1, torch.empty_like(s1), torch.empty_like(y2), torch.empty_like(s2)),
        )


def test_out_that_requires_grad_is_refused_as_torch_does():
    leaf = torch.empty_like(X, requires_grad=True)
    with pytest.raises(ValueError, match=r"out\[0\] \(grad_x\) requires grad.*no_grad"):
        swiglu_ops.swiglu_group_grad(DY, X, backend="reference", out=(leaf, None))
    y = torch.empty(128, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="out requires grad"):
        swiglu_ops.clipped_swiglu(X, backend="reference", out=y)
    with pytest.raises(ValueError, match="out requires grad"):
        swiglu_ops.clipped_swiglu_grad(
            DY, X, backend="reference", out=torch.empty_like(X, requires_grad=True)
        )
    with torch.no_grad():  # torch allows it there, and so do the operators
        swiglu_ops.swiglu_group_grad(DY, X, backend="reference", out=(leaf, None))
    assert torch.equal(leaf.detach(), swiglu_ops.swiglu_group_grad(DY, X, backend="reference")[0])
    with pytest.raises(ValueError, match="requires grad"):  # compiled: the same rule
        torch.compile(
            lambda: swiglu_ops.swiglu_group_grad(DY, X, backend="reference", out=(leaf, None)),
            backend="aot_eager",
        )()


def test_mx_out_inside_compile_is_a_clear_error():
    y = swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, backend="reference")
    fn = torch.compile(
        lambda: swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, backend="reference", out=y),
        backend="aot_eager",
        fullgraph=True,
    )
    with pytest.raises(Exception, match="out= is not supported inside torch.compile"):
        fn()


# ----------------------------------------------------------------------------------- requires_grad


def test_inputs_that_require_grad_are_accepted(backend):
    """The operators are not differentiable themselves; every backend reads the values (the cpu backend
    used to fail on NumPy's conversion of a weight that requires grad)."""
    rg = [t.clone().requires_grad_() for t in (DY, X, W)]
    got = swiglu_ops.swiglu_group_grad(rg[0], rg[1], rg[2], rg[0], torch.tensor([100]), 7.0, backend=backend)
    assert_bitwise(got, swiglu_ops.swiglu_group_grad(DY, X, W, DY, torch.tensor([100]), 7.0, backend=backend))
    assert not any(t.requires_grad for t in got)
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(rg[1], rg[0], backend=backend)
    assert_bitwise(got, swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, backend=backend))
    xf = XF.clone().requires_grad_()
    assert_bitwise(
        swiglu_ops.swiglu_mx_quant_dual_axis(xf, backend=backend),
        swiglu_ops.swiglu_mx_quant_dual_axis(XF, backend=backend),
    )
    assert torch.equal(
        swiglu_ops.clipped_swiglu_grad(rg[0], rg[1], backend=backend),
        swiglu_ops.clipped_swiglu_grad(DY, X, backend=backend),
    )
    with torch.no_grad():  # clipped_swiglu is differentiable with grad mode on; off, a plain call
        assert torch.equal(
            swiglu_ops.clipped_swiglu(rg[1], backend=backend), swiglu_ops.clipped_swiglu(X, backend=backend)
        )


# ----------------------------------------------------------------------------------------- smaller


def test_cli_unknown_command_says_so(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_cli_verify_on_a_missing_cuda_is_a_clear_message(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["verify", "--device", "cuda"])
    assert exc.value.code == 2
    assert "CUDA is unavailable" in capsys.readouterr().err


def test_help_documents_the_clamped_module():
    text = pydoc.render_doc(swiglu_ops.ClampedSwiGLU)
    for fragment in (
        "clamp_limit",
        "routing weight",
        "group **counts**",
        "ends_to_counts",
        "SwigluGroupGrad",
    ):
        assert fragment in text


def test_dequantize_grouped_scales_without_group_index_says_it_is_missing():
    _, _, y2, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(X, DY, torch.tensor([50, 128]))
    with pytest.raises(ValueError, match="group_index is missing"):
        swiglu_ops.mx_dequantize(y2, s2, axis=-2)
