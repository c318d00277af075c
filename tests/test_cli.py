"""The command line: ``swiglu-ops demo`` (the main job), ``verify`` and the usage text."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from swiglu_ops import cli


def test_demo_trains_bf16_and_mxfp8_and_reports_errors_and_times(capsys):
    argv = ["demo", "--tokens", "70", "0", "33", "--d-model", "32", "--hidden", "64", "--steps", "6"]
    assert cli.main([*argv, "--repeats", "1", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "== SwiGLU ==" in out and "== GPT-OSS" in out
    errors = re.findall(r"^\s+(out|dx|dW1|dW2)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", out, flags=re.M)
    assert [e[0] for e in errors] == ["out", "dx", "dW1", "dW2"] * 2  # both variants, the whole MLP
    for _, mx_vs_bf16, bf16_vs_exact, mx_vs_exact in errors:
        assert 0.005 < float(mx_vs_bf16) < 0.08 and 0.005 < float(mx_vs_exact) < 0.08  # E4M3: a few %
        assert float(bf16_vs_exact) < 0.01
    curves = re.findall(r"^\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+[-+][0-9.]+%$", out, flags=re.M)
    assert [int(c[0]) for c in curves] == [1, 2, 3, 4, 5, 6] * 2
    for first, last in ((curves[0], curves[5]), (curves[6], curves[11])):
        for col in (1, 2):  # bf16 and MXFP8 losses both fall
            assert float(last[col]) < float(first[col])
    assert re.search(r"^\s+reference\s+[0-9.]+ ms\s+1x\s+[0-9.]+ ms\s+1x$", out, flags=re.M)
    assert re.search(r"^\s+cpu\s+[0-9.]+ ms", out, flags=re.M)


def test_verify_passes_for_every_available_backend(capsys):
    """Every example case of every operator in bf16, fp16 and fp32 (whose results are held to 4 ulp, at the
    cancelling terms' size), on each backend but the reference; the weighted MX backward's grad_weight among
    them."""
    from swiglu_ops.ops import api
    from swiglu_ops.ops.table import EXAMPLE_CASES, PUBLIC

    assert cli.main(["verify"]) == 0
    out = capsys.readouterr().out
    assert "verify: ok" in out
    backends = [b for b in api.available_backends("cpu") if b != "reference"]
    assert out.count("-> ok") == len(PUBLIC) * EXAMPLE_CASES * 3 * len(backends) > 0
    assert re.search(r"swiglu_backward_mx_quant_dual_axis 2 .*grad_weight max rel", out)
    assert re.search(r"clipped_swiglu_grad 0 .* float32: grad_x max [0-9.]+ ulp -> ok", out)


def test_fp32_results_are_measured_in_ulps_at_the_cancelling_terms_size():
    """fp32 results: within 4 ulp of the reference's, measured where a gradient cancels at its terms' size
    (the verify and benchmark checks used to demand the near-tie rule of fp32, which another exp breaks
    wherever it rounds differently: the benchmark's fp32 cases all failed)."""
    import torch

    from swiglu_ops.ops import api, checks
    from swiglu_ops.ops.table import PUBLIC

    op = next(o for o in PUBLIC if o.name == "swiglu_group_grad")
    x = torch.tensor([[-1.2785, 0.5, 1.0, 3.0]])  # a gate where silu' crosses zero, and an ordinary one
    dy = torch.ones(1, 2)
    values = checks.call_values(api.swiglu_group_grad, (dy, x), {})
    want = api.swiglu_group_grad(dy, x, backend="reference")
    ulp = lambda v: torch.finfo(torch.float32).eps * abs(v)  # noqa: E731
    cases = (
        (0, 10 * ulp(want[0][0, 0].item()), True),
        (0, 0.1, False),
        (1, 10 * ulp(want[0][0, 1].item()), False),
    )
    for k, off, ok in cases:
        got = (want[0].clone(), None)
        got[0][0, k] += off  # 10 ulp of the cancelled result are within 4 of its terms' size
        assert checks.compare_outputs(op, values, got, want)[0][1] is ok, (k, off)


def test_verify_measures_grad_weight_at_the_summed_terms_size():
    """A grad_weight row whose terms cancel is only reproducible, in another summation order, relative to
    its terms' size (the contract; the test comparators' rule): verify and the benchmark measure it there,
    not at the sum."""
    import torch

    from swiglu_ops.numerics.tolerances import GRAD_WEIGHT_RTOL, relative_error
    from swiglu_ops.ops import checks
    from swiglu_ops.ops.table import PUBLIC

    grad_y = torch.tensor([[1.0, -1.0, 0.5], [2.0, 1.0, 1.0]], dtype=torch.bfloat16)
    y_origin = torch.tensor([[3.0, 2.9990234375, 0.0], [1.0, 1.0, 1.0]], dtype=torch.bfloat16)
    values = {"grad_y": grad_y, "y_origin": y_origin}
    want = (grad_y.double() * y_origin.double()).sum(-1).float()  # row 0: 3 - 2.999 = 0.00098 (terms ~6)
    magnitude = torch.tensor([6.0, 4.0], dtype=torch.float64)
    off_by = lambda rel: (want.double() + rel * magnitude).float()  # noqa: E731
    # 1.2e-2 of row 0's sum, 2e-6 of its terms
    op = next(o for o in PUBLIC if o.name == "swiglu_group_grad")

    def close(got, values):
        return relative_error(got, want, checks.error_scale(op, "grad_weight", values)) <= GRAD_WEIGHT_RTOL

    assert close(off_by(2e-6), values)
    assert not close(off_by(5e-5), values)
    assert not close(off_by(2e-6), {"grad_y": grad_y, "y_origin": None})


def test_grad_weight_error_counts_equal_specials_as_equal_and_other_specials_as_failures():
    """relative_error (verify's grad_weight measure): 0 for equal values, equal infinities and NaN against
    NaN; inf where one side is not finite and the other differs; empty tensors 0; a zero sum reproduced
    exactly is no error (0/0)."""
    import torch

    from swiglu_ops.numerics.tolerances import GRAD_WEIGHT_RTOL, relative_error

    inf, nan = float("inf"), float("nan")
    t = lambda *v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    assert relative_error(t(inf, 1.0, 0.0, nan), t(inf, 1.0, 0.0, nan)) == 0.0
    assert relative_error(t(-inf), t(inf)) == inf and relative_error(t(nan), t(1.0)) == inf
    assert relative_error(t(1.0), t(nan)) == inf and relative_error(t(1e-30), t(0.0)) == inf
    assert relative_error(t(), t()) == 0.0
    assert relative_error(t(1.0 + 2**-20), t(1.0)) <= GRAD_WEIGHT_RTOL < relative_error(t(1.0001), t(1.0))


def test_usage_and_unknown_command(capsys):
    assert cli.main(["--help"]) == 0
    assert cli.main(["frobnicate"]) == 2
    assert "demo" in capsys.readouterr().out


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "swiglu_ops", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "swiglu-ops {demo,verify,bench}" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--steps", "0"], "--steps: must be >= 1"),
        (["demo", "--repeats", "0"], "--repeats: must be >= 1"),
        (["demo", "--train-threads", "0"], "--train-threads: must be >= 1"),
        (["demo", "--tokens", "-3", "5"], "--tokens: must be >= 0"),
        (["demo", "--tokens", "0", "0"], "--tokens: at least one expert needs a token"),
        (["demo", "--lr", "-1"], "--lr: must be a positive number"),
        (["demo", "--backend", "nope"], "--backend: backend must be one of"),
        (["demo", "--plot", "curves.txt"], "--plot: 'curves.txt': matplotlib cannot write .txt"),
        (["bench", "--quick", "--repeats", "-5"], "--repeats must be >= 1"),
        (["bench", "--quick", "--only", "nosuchlabel"], "--only: no case labelled ['nosuchlabel']"),
    ],
)
def test_bad_options_are_usage_errors_before_any_work(argv, message, capsys):
    """Each is argparse's usage error (exit status 2) before anything runs: these used to be tracebacks,
    some after the whole demo had trained (--plot, --repeats), or an empty CSV (--only)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_demo_refuses_a_backend_that_cannot_run_here(monkeypatch, capsys):
    """A backend that exists but cannot run the demo's CPU tensors (Triton without its interpreter) is a
    usage error with the reason, before any work (it used to fail mid-run with a traceback)."""
    monkeypatch.setattr(
        cli, "backend_status", lambda name, device: (False, "CPU tensors need TRITON_INTERPRET=1")
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--backend", "triton"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--backend: 'triton' cannot run the demo's CPU tensors: CPU tensors need TRITON_INTERPRET=1" in err
    assert "swiglu_ops demo" not in capsys.readouterr().out


def test_demo_makes_the_folder_of_its_picture(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "new" / "folder" / "curves.png"
    assert cli.main(["demo", "--tokens", "40", "9", "--d-model", "32", "--hidden", "32", "--steps", "2",
                     "--repeats", "1", "--backend", "cpu", "--plot", str(path)]) == 0  # fmt: skip
    assert path.stat().st_size > 10_000


def test_verify_refuses_a_device_without_values(capsys):
    """verify on meta tensors compares nothing: an error, not "verify: ok"."""
    with pytest.raises(SystemExit) as info:
        cli.main(["verify", "--device", "meta"])
    assert info.value.code != 0
    assert "--device meta" in capsys.readouterr().err


def test_the_check_rule_is_the_contracts_on_every_format():
    """verify's and the benchmark's comparator (ops.checks over numerics.tolerances) compared raw bit
    patterns as integers: a NaN against +0 (0xFFFF vs 0x0000 in int16) or an E4M3 NaN against -0 (0x7F vs
    0x80) passed as one unit apart, a canonical NaN against another NaN failed, FP4 was counted per packed
    byte (two elements changed in one byte passed), fp32 ulps were measured at |want| (7 steps passed as
    3.5), and a wrong shape or dtype or a missing output passed or crashed. Now: the contract's rule, per
    element."""
    import torch

    from swiglu_ops.numerics.tolerances import ulp_differences, within_near_ties
    from swiglu_ops.ops import api, checks
    from swiglu_ops.ops.table import PUBLIC

    def bits(values, dtype, view):
        return torch.tensor(values, dtype=view).view(dtype)

    bf16, i16 = torch.bfloat16, torch.int16
    zeros = bits([0] * 100, bf16, i16)
    assert not within_near_ties(bits([-1] + [0] * 99, bf16, i16), zeros)  # NaN (0xFFFF) against +0
    assert not within_near_ties(bits([1] + [0] * 99, bf16, i16), zeros)  # a subnormal against +0
    assert within_near_ties(bits([0x7FC0] + [0] * 99, bf16, i16), bits([-1] + [0] * 99, bf16, i16))  # NaNs
    assert within_near_ties(bits([0x3F81] + [0] * 99, bf16, i16), bits([0x3F80] + [0] * 99, bf16, i16))
    e4m3, u8 = torch.float8_e4m3fn, torch.uint8
    assert not within_near_ties(bits([0x7F] + [0] * 99, e4m3, u8), bits([0x80] + [0] * 99, e4m3, u8))
    fp4 = torch.float4_e2m1fn_x2
    base = bits([0xDF] + [0x11] * 99, fp4, u8)  # low element -6.0 (0xF), high element -0.5 (0xD)
    assert not within_near_ties(bits([0xE0] + [0x11] * 99, fp4, u8), base)  # two elements changed
    assert within_near_ties(bits([0xCF] + [0x11] * 99, fp4, u8), base)  # one element one code apart
    want = torch.tensor([1.9999999, 1.0])
    got = want.clone()
    got.view(torch.int32)[0] -= 7
    assert ulp_differences(got, want) == (1, 7.0)

    op = next(o for o in PUBLIC if o.name == "swiglu_group_grad")
    gy, x = torch.zeros(4, 8, dtype=bf16), torch.ones(4, 16, dtype=bf16)
    w = torch.ones(4)
    values = checks.call_values(api.swiglu_group_grad, (gy, x), {"weight": w, "y_origin": gy})
    want = api.swiglu_group_grad(gy, x, weight=w, y_origin=gy, backend="reference")
    for got in ((want[0][:1], want[1]), (want[0].half(), want[1]), (want[0], None)):
        assert not all(ok for _, ok in checks.compare_outputs(op, values, got, want))
    assert all(ok for _, ok in checks.compare_outputs(op, values, want, want))
