"""benchmarks/bench_triton.py (the GPU check and benchmark) stays runnable without a GPU: ``--smoke`` runs
every step (check, big, bench with the issue model's prediction, one tune variant per list, the compiled
reference) on CPU tensors under Triton's interpreter, tiny shapes, in a child process (Triton fixes the
interpreter mode at import). Also: benchmarks/run_gpu_checks.sh parses, and the SASS spec regex it hands to
sass_budget.py matches exactly the specs the bench looks up."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_triton.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("_bench_triton_smoke", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_gpu_checks_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "run_gpu_checks.sh")], check=True)


@pytest.mark.slow(seconds=30)
def test_bench_triton_smoke(tmp_path):
    bench = _bench_module()
    regex = re.compile(bench.sass_regex())
    assert all(regex.search(n) for n in bench.SASS_SPECS)
    assert not regex.search("mx_quant[bf16,grouped=1,e4m3,unaligned]")
    # A sass_budget.py --json table for every spec the bench may look up (values are placeholders).
    rows = [
        {"name": n, "arch": 90, "hw_cvt": hw, "pred_serial": 40.0 + hw, "pred_overlap": 80.0}
        for n in bench.SASS_SPECS
        for hw in (False, True)
    ]
    (tmp_path / "sass.json").write_text(json.dumps({"rows": rows, "summary": {}}))
    out = tmp_path / "bench.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "SWIGLU_OPS_TRITON_HW_CVT": "0"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(BENCH), "--smoke", "--tune", "--sass", str(tmp_path / "sass.json")]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["check_ok"] and result["big_ok"]
    assert result["hw_cvt"] is False and ", integer path" in proc.stdout  # which path the numbers are of
    assert "routing weight, bwd_mx e4m3 weighted / unweighted time: tiny x" in proc.stdout
    assert [r["op"] for r in result["bench"]] == list(bench.OPS)
    for r in result["bench"]:
        assert r["bytes"] > 0 and math.isfinite(r["ms"]) and r["pct"] > 0, r
        assert r["spec"] in bench.SASS_SPECS and r["pred_serial"] == 40.0, r
        assert math.isfinite(r["compiled_ref_ms"]), r
    assert {t["op"] for t in result["tune"]} == set(bench.OPS) - {"clipped_swiglu", "clipped_swiglu_grad"}
    assert all(t["ok"] for t in result["tune"])
    assert "conformance: ok" in proc.stdout
