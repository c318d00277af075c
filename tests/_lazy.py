"""An optional integration must not be imported by ``import swiglu_ops``: checked in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import swiglu_ops


def assert_imported_only_on_access(attribute: str, package: str) -> None:
    """``import swiglu_ops`` leaves ``package`` unimported; ``swiglu_ops.integrations.<attribute>`` (first
    access) imports it."""
    src = str(Path(swiglu_ops.__file__).parents[1])
    code = (
        "import sys, swiglu_ops; assert swiglu_ops.__file__.startswith(sys.argv[1]), swiglu_ops.__file__; "
        f"bad = [m for m in sys.modules if m.split('.')[0] == {package!r}]; assert not bad, bad[:5]; "
        f"swiglu_ops.integrations.{attribute}; assert {package!r} in sys.modules"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", code, src], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
