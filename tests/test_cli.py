"""The command line: ``swiglu-ops demo`` (the main job), ``verify`` and the usage text."""

from __future__ import annotations

import re
import subprocess
import sys

from swiglu_ops import cli


def test_demo_reports_mxfp8_errors_and_times(capsys):
    assert (
        cli.main(["demo", "--tokens", "70", "0", "33", "--d-model", "64", "--hidden", "64", "--repeats", "1"])
        == 0
    )
    out = capsys.readouterr().out
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)$", out, flags=re.M)
    assert [(e, n) for e, n, _, _ in rows] == [("0", "70"), ("2", "33")]  # the empty expert is skipped
    for _, _, dgrad, wgrad in rows:  # MXFP8 (E4M3, 32-blocks) stays within a few percent of bf16
        assert 0.0 < float(dgrad) < 0.06 and 0.0 < float(wgrad) < 0.06
    assert re.search(r"^\s+reference\s+[0-9.]+ ms\s+1x", out, flags=re.M)


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
