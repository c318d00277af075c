"""The package's one compiled part: the cpu backend's AVX-512 kernels (``src/swiglu_ops/cpu/_simd.c``).

Everything else is in ``pyproject.toml``. The extension is optional: where it cannot be built (no C
compiler, not x86-64) the install still succeeds and the cpu backend runs its Numba kernels only. It is
compiled for AVX-512 and used only on CPUs that have it (``swiglu_ops.cpu._native`` checks), so the
package installs and runs anywhere.
"""

import hashlib
import os
import platform
from pathlib import Path

from setuptools import Extension, setup

_SOURCE = "src/swiglu_ops/cpu/_simd.c"
_X86_64 = platform.machine().lower() in ("x86_64", "amd64") and os.name == "posix"
# Compiled in; swiglu_ops.cpu._native compares it with the source next to the package, so an editable
# install whose _simd.c changed after the build runs Numba (and warns) instead of stale C.
_SOURCE_HASH = hashlib.sha256((Path(__file__).parent / _SOURCE).read_bytes()).hexdigest()[:16]

_FLAGS = [
    "-O3",
    "-std=c11",
    "-ffp-contract=off",  # the kernels' operations are never fused into FMAs
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512dq",
    "-mf16c",
    "-pthread",
]


def _build(name: str, extra_flags: list[str]) -> Extension:
    return Extension(
        f"swiglu_ops.cpu.{name}",
        sources=[_SOURCE],
        define_macros=[("SWIGLU_SIMD_SOURCE_HASH", f'"{_SOURCE_HASH}"')],
        extra_compile_args=_FLAGS + extra_flags,
        extra_link_args=["-pthread"],
        optional=True,
    )


# Two builds of the same source: AVX-512 (F/BW/VL/DQ), and the same plus AVX512-BF16 (one-instruction bf16
# rounding) for the CPUs that have it; _native loads the best one the CPU runs.
setup(ext_modules=[_build("_simd", []), _build("_simd_bf16", ["-mavx512bf16"])] if _X86_64 else [])
