"""The command line: ``swiglu-ops demo`` (the main job), ``verify`` and the usage text."""

from __future__ import annotations

import re
import subprocess
import sys

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
    assert cli.main(["verify"]) == 0
    assert "verify: ok" in capsys.readouterr().out


def test_usage_and_unknown_command(capsys):
    assert cli.main(["--help"]) == 0
    assert cli.main(["frobnicate"]) == 2
    assert "demo" in capsys.readouterr().out


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "swiglu_ops", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "swiglu-ops {demo,verify,bench}" in proc.stdout
