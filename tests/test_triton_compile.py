"""Build proof for sm_90 and sm_100 (tests/_triton_compile_checks.py), in a child pytest process; and the
budgeted specializations built with the oldest Triton the package supports (``OLDEST_TRITON``).

The rest of the CPU suite runs Triton's interpreter (TRITON_INTERPRET=1, set by conftest before triton is
imported), and Triton fixes interpreter or compiled mode at import time, so compiling needs a fresh process
without that variable (and without conftest, which would set it again).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

CHECKS = pathlib.Path(__file__).with_name("_triton_compile_checks.py")


@pytest.mark.slow(seconds=240)
def test_every_kernel_specialization_compiles_for_sm90_and_sm100():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "--noconftest", "-p", "no:cacheprovider", str(CHECKS)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-12000:])  # the registers / spills / shared-memory table
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout and "no tests ran" not in proc.stdout


#: The oldest Triton that pyproject.toml accepts (``triton>=``): torch 2.9's. Triton's front end changes
#: between releases (3.6 refused a float beside a pointer among inline-asm operands, which 3.9 accepts; 3.5
#: refused the builtin ``max`` of two constexprs), so the kernels are built with it too. .ci/run installs it
#: into a folder of its own and names that folder in ``SWIGLU_OPS_OLDEST_TRITON``.
OLDEST_TRITON = "3.5.1"

_OLD_BUILD = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import _triton_compile_checks as cc
from sass_budget import CI_SPECS
from swiglu_ops.backends import triton as backend
assert triton.__version__ == sys.argv[1], triton.__version__
names = CI_SPECS + tuple(sys.argv[2:])
built = 0
for name in names:
    fn, sig, _consts, attrs, options, _expect = cc.SPECS[name]
    launch = {**options, **backend.LAUNCH_OPTIONS}
    for hw in (False, True):
        for arch in (90, 100):
            src = ASTSource(fn, sig, cc.spec_consts(name, hw), attrs)
            triton.compile(src, target=GPUTarget("cuda", arch, 32), options=launch)
            built += 1
print("built", built, "of", 4 * len(names), "with triton", triton.__version__)
"""

#: Beside CI_SPECS (FP8 E4M3 only): E5M2 and the FP4 encoder's round modes.
_EXTRA_SPECS = (
    "mx_quant[bf16,grouped=1,e5m2]",
    "bwd_mx_quant[bf16,grouped=1,e5m2]",
    "mx_quant[bf16,grouped=1,e2m1,round=rint]",
    "mx_quant[bf16,grouped=1,e2m1,round=floor,interleaved,clipped]",
)


@pytest.mark.slow(seconds=150)
def test_budgeted_specializations_build_with_the_oldest_supported_triton():
    """CI_SPECS of benchmarks/sass_budget.py (per kernel and direction the largest specialization, and the
    CANN and GPT-OSS layouts) and E5M2 / FP4 specializations, both conversion paths, sm_90 and sm_100,
    built by the oldest supported Triton (its front end and its bundled ptxas) in a child process."""
    folder = os.environ.get("SWIGLU_OPS_OLDEST_TRITON")
    if not folder:
        pytest.skip(
            f"SWIGLU_OPS_OLDEST_TRITON names no folder with triton=={OLDEST_TRITON} (.ci/run sets it)"
        )
    from swiglu_ops.backends.triton import MIN_TRITON

    floor = ".".join(map(str, MIN_TRITON))
    pyproject = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert OLDEST_TRITON.startswith(floor + ".") and f'"triton>={floor}"' in pyproject, "the floor moved"
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the old Triton first on the path, then the tests' and benchmarks' helpers and the package
    env["PYTHONPATH"] = os.pathsep.join(
        [folder, str(root / "tests"), str(root / "benchmarks"), str(root / "src")]
    )
    cmd = [sys.executable, "-c", _OLD_BUILD, OLDEST_TRITON, *_EXTRA_SPECS]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    built = re.search(r"built (\d+) of (\d+) with triton (\S+)", proc.stdout)
    assert built and built[1] == built[2] and int(built[1]) >= 40 and built[3] == OLDEST_TRITON, proc.stdout
