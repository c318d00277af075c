"""The SASS instruction budgets of the Triton kernels (benchmarks/sass_budget.py --ci), in a child process.

Compiles the CI subset of kernel specializations for sm_90 and sm_100 on the budgeted path (the PTX
conversions, HW_CVT) and holds: no spills, every kernel at or under its ceiling (``CEILINGS``: the counts
measured when they were last lowered), issue 14's targets (35 instructions per quantized element, 50 per
pair; the CI subset holds each kernel's largest count; the MX kernels with a routing weight only their
ceilings) and the script's summary line.
Like tests/test_triton_compile.py, the child runs without TRITON_INTERPRET (compiled mode).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "sass_budget.py"


@pytest.mark.slow(seconds=25)
def test_sass_instruction_budgets(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "budget.json"
    cmd = [sys.executable, str(SCRIPT), "--ci", "--json", str(out), "--workers", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-8000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"quantizers max \d+\.\d instr/element \(weighted \d+\.\d\), "
        r"elementwise max \d+\.\d instr/pair, spills \d+",
        last,
    ), last
    report = json.loads(out.read_text())
    rows, summary = report["rows"], report["summary"]
    # every CI spec on both targets, each counted on its hot path
    assert {r["arch"] for r in rows} == {90, 100}
    assert {r["kind"] for r in rows} == {"group_grad", "clipped_swiglu", "mx_quant", "bwd_mx_quant"}
    assert all(r["hw_cvt"] and r["count"] > 0 and r["per_unit"] > 0 for r in rows)
    assert summary["spills"] == 0, [(r["name"], r["arch"], r["spills"]) for r in rows if r["spills"]]
    assert not summary["over_ceiling"], summary["over_ceiling"]
    assert not summary["over_budget"], summary["over_budget"]
    assert f"spills {summary['spills']}" in last
