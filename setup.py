"""The package's one compiled part: the cpu backend's C library (``src/swiglu_ops/backends/cpu/csrc``).

Everything else is in ``pyproject.toml``. The library holds every kernel once per instruction set (portable
C for the build's baseline, and on x86-64 also AVX2 and AVX-512 builds selected by function-level target
pragmas); ``swiglu_ops.backends.cpu._loader`` picks the best one the CPU runs. The extension is optional:
where it cannot be built (no C compiler, a compiler without GNU C vector extensions) the install still
succeeds, ``backend="cpu"`` says why it is unavailable and ``"auto"`` uses the reference backend.
"""

import hashlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_CSRC = Path("src/swiglu_ops/backends/cpu/csrc")
_SOURCES = sorted(_CSRC.glob("*.c"))
# Compiled in; swiglu_ops.cpu._loader compares it with the sources next to the package, so an editable
# install whose C sources changed after the build is refused (with the reason) instead of running stale code.
_SOURCE_HASH = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(_CSRC.glob("*.[ch]")))).hexdigest()[:16]


class ParallelBuildExt(build_ext):
    """Compiles the extension's C files in parallel, one compiler process per core (setuptools runs them one
    after another: the four instruction-set builds took about 105 s on one core of a Zen 3; on two, 73 s)."""

    def build_extension(self, ext):
        compile_one = self.compiler.compile
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

        def compile_all(sources, *args, **kwargs):
            if len(sources) < 2 or cores < 2:
                return compile_one(sources, *args, **kwargs)
            with ThreadPoolExecutor(min(cores, len(sources))) as pool:
                objects = pool.map(lambda source: compile_one([source], *args, **kwargs), sources)
                return [obj for objs in objects for obj in objs]

        self.compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_one


setup(
    cmdclass={"build_ext": ParallelBuildExt},
    ext_modules=[
        Extension(
            "swiglu_ops.backends.cpu._kernels",
            sources=[str(p) for p in _SOURCES],
            depends=[str(p) for p in sorted(_CSRC.glob("*.h"))],
            define_macros=[("SWIGLU_SOURCE_HASH", f'"{_SOURCE_HASH}"')],
            extra_compile_args=[
                "-O3",
                "-std=c11",
                "-ffp-contract=off",  # the operators' multiplies and adds are never fused into FMAs
                "-fno-math-errno",
                "-Wno-psabi",
                "-pthread",
            ],
            extra_link_args=["-pthread"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],  # dlopen (glibc < 2.34)
            optional=True,
        )
    ],
)
