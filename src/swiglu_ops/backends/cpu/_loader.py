"""Loads the cpu backend's C library and chooses the instruction set its kernels run with.

The library (``csrc/``, built by ``setup.py`` as the optional extension ``swiglu_ops.backends.cpu._kernels``)
is plain C without the Python API. Its interface is declared once, in ``csrc/swiglu_cpu.h``, which cffi reads
here: the structs, constants and prototypes below come from that file, not from a Python copy. cffi
releases the GIL around every call.

``SWIGLU_OPS_CPU_SIMD`` chooses the kernels' instruction set: unset or ``auto`` the best this CPU runs
(AVX-512 with AVX512-BF16, AVX-512, AVX2, portable); ``portable``, ``avx2``, ``avx512`` or ``avx512_bf16``
one of them (all give the same bits: the tests compare every instruction set this CPU runs, in process).

``SWIGLU_OPS_CPU_GATHER`` chooses how the AVX-512 kernels read their activation tables (one entry per 16-bit
input bit pattern): ``auto`` (default) the hardware gather where it is fast (:func:`fast_gather`), else
scalar loads; ``1``/``0`` force one. Both give the same bits; the AVX2 and portable kernels always use
scalar loads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from ...ops import registry

_CSRC = Path(__file__).with_name("csrc")
_HEADER = _CSRC / "swiglu_cpu.h"

#: ``SWIGLU_OPS_CPU_SIMD`` values and the instruction sets (best first) they allow.
ISAS = ("avx512_bf16", "avx512", "avx2", "portable")


def isa_choice_from_env(value: str | None) -> tuple[str, ...]:
    """The instruction sets ``SWIGLU_OPS_CPU_SIMD`` allows, best first."""
    choice = "auto" if value is None or value.strip() == "" else value.strip().lower()
    if choice == "auto":
        return ISAS
    if choice in ISAS:
        return (choice,)
    raise ValueError(f"SWIGLU_OPS_CPU_SIMD must be auto or one of {', '.join(ISAS)}, got {value!r}")


#: ``SWIGLU_OPS_CPU_POOL`` values: where jobs run (docs/cpu_backend.md, Parallel).
POOLS = ("auto", "own")


def pool_choice_from_env(value: str | None) -> str:
    """``SWIGLU_OPS_CPU_POOL``: ``auto`` (PyTorch's OpenMP team where GNU OpenMP is loaded, else the library's
    pool) or ``own`` (always the library's pool)."""
    choice = "auto" if value is None or value.strip() == "" else value.strip().lower()
    if choice not in POOLS:
        raise ValueError(f"SWIGLU_OPS_CPU_POOL must be auto or own, got {value!r}")
    return choice


#: ``SWIGLU_OPS_CPU_GATHER`` values.
GATHERS = ("auto", "1", "0")


def gather_choice_from_env(value: str | None) -> str:
    choice = "auto" if value is None or value.strip() == "" else value.strip().lower()
    if choice not in GATHERS:
        raise ValueError(f"SWIGLU_OPS_CPU_GATHER must be auto, 1 or 0, got {value!r}")
    return choice


def fast_gather(
    cpuinfo: Path = Path("/proc/cpuinfo"),
    gds: Path = Path("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling"),
) -> bool:
    """Whether vgatherdps beats scalar loads for the activation-table lookups on this CPU: an Intel core that
    the kernel reports "Not affected" by gather data sampling (its mitigation makes every gather slow). AMD
    cores run vgatherdps as a long microcoded sequence, and unknown ones keep the scalar loads, which are
    never slow. Measured on a Sapphire-Rapids-class Xeon (1 thread, M=8192, 2H=4096 bf16, A/B in one
    process): MX forward 12.2 -> 10.3 ms, backward 23.8 -> 21.9 ms with the gather."""
    try:
        vendor_intel = "GenuineIntel" in cpuinfo.read_text(errors="replace")[:4096]
        return vendor_intel and gds.read_text().strip() == "Not affected"
    except OSError:
        return False


def source_hash(folder: Path = _CSRC) -> str | None:
    """What ``setup.py`` compiles into the library: the first 16 hex digits of the sha256 of the C sources,
    or None where the sources are not next to the package (an installed wheel)."""
    files = sorted(folder.glob("*.[ch]"))
    if not any(f.suffix == ".c" for f in files):
        return None
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


class Library:
    """The loaded library, or why there is none (``lib`` None and ``why`` set)."""

    def __init__(self):
        self.ffi = None
        self.lib = None
        self.isa = ""  # the instruction set the kernels run with
        self.isa_code = -1
        self.gather = 0  # 1: the activation tables are read with the hardware gather (swiglu_glu.gather)
        self.why = ""
        try:
            self._load()
        except Exception as exc:  # noqa: BLE001 - any failure means "unavailable, because ..."
            self.lib, self.why = None, f"{type(exc).__name__}: {exc}"

    def _load(self) -> None:
        try:
            import cffi
        except ImportError:
            self.why = "cffi is not installed (pip install cffi)"
            return
        spec = importlib.util.find_spec(f"{__package__}._kernels")
        if spec is None or spec.origin is None:
            self.why = (
                "its C library was not built (no C compiler when the package was installed?): install a C "
                "compiler (gcc or clang) and reinstall swiglu-ops"
            )
            return
        ffi = cffi.FFI()
        ffi.cdef(_HEADER.read_text())
        lib = ffi.dlopen(spec.origin)
        if lib.swiglu_cpu_abi_version() != lib.SWIGLU_ABI_VERSION:
            self.why = f"{spec.origin} was built for another interface version; reinstall swiglu-ops"
            return
        built, expected = ffi.string(lib.swiglu_cpu_source_hash()).decode(), source_hash()
        if expected is not None and built != expected:
            self.why = (
                f"{spec.origin} was built from other C sources than those in {_CSRC}: rebuild it "
                "(pip install -e .)"
            )
            return
        allowed = isa_choice_from_env(os.environ.get("SWIGLU_OPS_CPU_SIMD"))
        own = pool_choice_from_env(os.environ.get("SWIGLU_OPS_CPU_POOL")) == "own"
        lib.swiglu_cpu_use_own_pool(own or registry.forked_child())  # (a forked child: its own pool)
        codes = {name: getattr(lib, f"SWIGLU_ISA_{name.upper()}") for name in ISAS}
        usable = [name for name in allowed if lib.swiglu_cpu_isa_supported(codes[name])]
        if not usable:
            self.why = f"SWIGLU_OPS_CPU_SIMD={allowed[0]}, which this CPU does not run"
            return
        gather = gather_choice_from_env(os.environ.get("SWIGLU_OPS_CPU_GATHER"))
        self.gather = int(fast_gather() if gather == "auto" else gather == "1")
        self.ffi, self.lib, self.isa, self.isa_code = ffi, lib, usable[0], codes[usable[0]]

    def supported_isas(self) -> list[str]:
        """Every instruction set this library and CPU run (for tests comparing them)."""
        if self.lib is None:
            return []
        return [
            n for n in ISAS if self.lib.swiglu_cpu_isa_supported(getattr(self.lib, f"SWIGLU_ISA_{n.upper()}"))
        ]


def load() -> Library:
    return Library()
