"""The x86 instruction budgets of the MX operators' hot loops (benchmarks/x86_budget.py), held without timing.

Disassembles the built library's phase functions of every instruction set with objdump (no llvm-mca: the
limits are on deterministic counts) and holds benchmarks/x86_budget_limits.json: instructions per element
(per iteration for a row's tail step) and stack vector loads/stores per iteration of each hot loop. Every
phase symbol and hot loop must be found, and the analyzer itself is checked on a synthetic disassembly with
known counts, so the test fails rather than passing on an empty analysis.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import x86_budget as xb  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    assert shutil.which("objdump"), "objdump (binutils) is needed to count the kernels' instructions"
    lib = xb.library_path()
    return xb.analyse(lib, mca=False)


@pytest.mark.slow(seconds=6)
def test_every_hot_loop_within_its_limits(rows):
    want = {
        (isa, phase, spec.name) for isa in xb.ISAS for phase, specs in xb.PHASES.items() for spec in specs
    }
    assert {(r["isa"], r["phase"], r["loop"]) for r in rows} == want
    missing = [(r["isa"], r["phase"], r["loop"]) for r in rows if not r["found"]]
    assert not missing, f"phase symbols or hot loops not found in the library: {missing}"
    for r in rows:
        assert 0 < r["min"] <= r["instr"], r
        assert r["induction"], f"{r['isa']}/{r['phase']}/{r['loop']}: no increment of the C loop's step"
    limits = json.loads(xb.LIMITS.read_text())
    no_min = [
        (i, p, lp)
        for i, ph in limits.items()
        for p, lps in ph.items()
        for lp, lim in lps.items()
        if "min" not in lim
    ]
    assert not no_min, f"limits without a shortest-path limit: {no_min}"
    problems = xb.check(rows, limits)
    assert not problems, "\n".join(problems) + "\n\n" + xb.table(rows)


def test_the_library_is_the_one_the_package_loads():
    spec = importlib.util.find_spec("swiglu_ops.backends.cpu._kernels")
    assert spec is not None and xb.library_path() == spec.origin


# A synthetic disassembly: the codes loop of codes_run (inlined through store_codes_x32's non-special call),
# 9 instructions per iteration on its longest path (8 when the branch skips the reload), one spill store
# (the whole ymm register to the stack) and one reload (a folded operand); the broadcast from the stack and
# the stores to memory elsewhere are not spills.
def _synthetic(spec: xb.CLoop, step: int = 0x20, reload: str = "vpaddw 0x20(%rsp),%ymm0,%ymm0") -> str:
    lines, via = xb.loop_lines(spec)
    return f"""
0000000000001000 <swiglu_mx_quantise_BF16_0_test>:
codes_run():
/src/csrc/mx.h:{lines.start}
inlined by /src/csrc/mx.h:{via} (store_codes_x32)
inlined by /src/csrc/mx.h:400 (mx_quantise)
    1000:\txor    %eax,%eax
    1002:\tvmovdqu (%rdi,%rax,1),%ymm0
    1007:\tvmovdqu %ymm0,0x20(%rsp)
    100d:\ttest   %rdx,%rdx
    1010:\tje     1018 <swiglu_mx_quantise_BF16_0_test+0x18>
    1012:\t{reload}
    1018:\tvpbroadcastw 0x40(%rsp),%ymm1
    101e:\tadd    ${step:#x},%rax
    1022:\tcmp    %rsi,%rax
    1025:\tjl     1002 <swiglu_mx_quantise_BF16_0_test+0x2>
    1027:\tvmovdqu %ymm1,(%rdi)
    102b:\tret
"""


CODES = next(s for s in xb.PHASES["mx_quantise_BF16_0"] if s.name == "codes")


def _analyse(text: str) -> dict:
    cfg = xb.build_cfg(tuple(xb.parse_objdump(text)))
    return {
        "isa": "avx2",
        "phase": "mx_quantise_BF16_0",
        **xb.analyse_loop(xb.Counter(None), cfg, CODES, "avx2", False, False),
    }


def test_the_analyzer_counts_a_known_loop():
    r = _analyse(_synthetic(CODES))
    assert r["found"] and r["induction"]
    assert (r["instr"], r["min"], r["elements"]) == (9, 8, 32)
    assert r["per_element"] == round(9 / 32, 3)
    assert (r["spill_stores"], r["spill_loads"]) == (1, 1)


def test_the_analyzer_fails_over_a_limit_and_on_a_missing_loop():
    r = _analyse(_synthetic(CODES))
    tight = {"avx2": {"mx_quantise_BF16_0": {"codes": {"instr": 0.25, "spills": 1}}}}
    assert any("over the limit 0.25" in p for p in xb.check([r], tight))
    assert any(
        "spills/iteration over" in p
        for p in xb.check(
            [r], {**tight, "avx2": {"mx_quantise_BF16_0": {"codes": {"instr": 1, "spills": 1}}}}
        )
    )
    assert xb.check([r], {"avx2": {"mx_quantise_BF16_0": {"codes": {"instr": 0.29, "spills": 2}}}}) == []
    # the shortest path (8 instructions: 0.25 per element) has a limit of its own
    short = {"avx2": {"mx_quantise_BF16_0": {"codes": {"instr": 0.29, "min": 0.2, "spills": 2}}}}
    assert any("shortest path over the limit 0.2" in p for p in xb.check([r], short))
    # a loop whose step is not the C loop's, and a disassembly without the loop's source line
    assert not _analyse(_synthetic(CODES, step=0x10))["induction"]
    gone = _analyse(_synthetic(CODES).replace(f"mx.h:{xb.loop_lines(CODES)[0].start}", "mx.h:1"))
    assert not gone["found"]
    assert any("not found" in p for p in xb.check([gone], {}))
    # a limit without its row
    assert any("limited but not analysed" in p for p in xb.check([], tight))
