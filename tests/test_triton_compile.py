"""Build proof for sm_90 and sm_100 (tests/_triton_compile_checks.py), in a child pytest process.

The rest of the CPU suite runs Triton's interpreter (TRITON_INTERPRET=1, set by conftest before triton is
imported), and Triton fixes interpreter or compiled mode at import time, so compiling needs a fresh process
without that variable (and without conftest, which would set it again).
"""

from __future__ import annotations

import os
import pathlib
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
