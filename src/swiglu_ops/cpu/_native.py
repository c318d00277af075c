"""The AVX-512 kernels of ``_simd.c`` for 16-bit storage (bf16, fp16): loading, the sigmoid table, calls.

``_simd.c`` is built by the package's own build (``setup.py``, an optional extension: where it cannot be
built, or on a CPU without AVX-512, the cpu backend runs its Numba kernels for every dtype). It is a plain
C library: ``swiglu_group_grad_16`` is called through :mod:`ctypes` (which releases the GIL) and starts its
own threads; the two stages of a dual-axis task are called from inside the Numba kernel as external
symbols (:data:`MX_STAGE1`, :data:`MX_QUANTISE`), which keeps that kernel cacheable. ``SWIGLU_OPS_CPU_SIMD``
chooses: ``0`` no library, ``avx512`` the plain build, unset or ``1`` the best build the CPU runs.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import platform
import warnings
from pathlib import Path

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import njit, types

from ._numerics import BF16, FP16, SOURCE_TAG, sigmoid_f32, widen

#: Elements (pairs) per thread below which fewer threads are started (a thread start costs ~20 us).
_MIN_ELEMENTS_PER_THREAD = 1 << 16

_P, _I64, _F32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


#: The builds of ``_simd.c`` (``setup.py``), best first, with the CPU features each needs.
BUILDS = {
    "_simd_bf16": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "f16c", "avx512bf16"),
    "_simd": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "f16c"),
}


def simd_from_env(value: str | None) -> tuple[str, ...]:
    """The builds ``SWIGLU_OPS_CPU_SIMD`` allows, best first: unset or ``1`` any, ``0`` none, ``avx512``
    the plain AVX-512 build only (to compare the builds on a CPU that has AVX512-BF16)."""
    choice = "1" if value is None else value.strip()
    if choice in ("0", "1", "avx512"):
        return {"0": (), "1": tuple(BUILDS), "avx512": ("_simd",)}[choice]
    raise ValueError(f"SWIGLU_OPS_CPU_SIMD must be 0, 1 or avx512, got {value!r}")


def host_supported(build: str = "_simd") -> bool:
    """Whether this CPU runs ``build`` (by default the plain AVX-512 one, which every other needs)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features = llvm.get_host_cpu_features()
    return all(features.get(f, False) for f in BUILDS[build])


def source_hash(path: Path) -> str:
    """What ``setup.py`` compiles into the library: the first 16 hex digits of the source's sha256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _load(builds: tuple[str, ...]):
    """The ctypes handle and name of the best built library among ``builds`` this CPU runs, or (None, "")."""
    for build in builds:
        spec = importlib.util.find_spec(f"{__package__}.{build}")
        if spec is not None and spec.origin is not None and host_supported(build):
            break
    else:
        return None, ""
    lib = ctypes.CDLL(spec.origin)
    source = Path(__file__).with_name("_simd.c")  # present in a source tree (editable install)
    built = (ctypes.c_char * 17).in_dll(lib, "swiglu_simd_source_hash").value.decode()
    if source.exists() and built != source_hash(source):
        warnings.warn(
            f"{spec.origin} was built from another version of {source.name}; the cpu backend runs its Numba "
            "kernels until it is rebuilt (pip install -e .)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None, ""
    llvm.load_library_permanently(spec.origin)  # Numba links MX_STAGE1 by name, also from its disk cache
    fn = lib.swiglu_group_grad_16
    fn.argtypes = (_P, _P, _P, _P, _I64, _I64, _I64, _F32, _F32, _P, _P, _P, _I64, _P, _P, _INT, _INT)
    fn.restype = None
    return lib, build


#: The loaded library (None: the Numba kernels run) and which build of ``_simd.c`` it is.
LIB, BUILD = _load(simd_from_env(os.environ.get("SWIGLU_OPS_CPU_SIMD")))
#: The widest task (columns of one half) ``swiglu_mx_quantise_16`` takes (its scratch is on the stack).
MX_MAX_WIDTH = ctypes.c_int.in_dll(LIB, "swiglu_mx_max_width").value if LIB is not None else 0


_U, _I = types.uintp, types.int64
#: ``swiglu_mx_stage1_16`` (see ``_simd.c``) for Numba code; pointers are passed as integers.
MX_STAGE1 = types.ExternalFunction(
    "swiglu_mx_stage1_16", types.void(_U, _U, _U, _I, _I, _I, _I, _U, _U, _I, _I, _U, types.int32)
)
_I32 = types.int32
#: ``swiglu_mx_quantise_16`` (see ``_simd.c``) for Numba code.
MX_QUANTISE = types.ExternalFunction(
    "swiglu_mx_quantise_16",
    types.void(
        _U, _U, _I, _I, _I, _U, _U, _U, _U, _I, _I, _I32, _I32, _I32, _I32, _I32, _I32, _I32, types.float32
    ),
)


def available(kind: int) -> bool:
    return LIB is not None and kind in (BF16, FP16)


@functools.cache
def _sigmoid_kernels():
    """Numba's ``sigmoid_f32`` over all 16-bit patterns of a kind, and of one fp32 value. Closures over
    ``SOURCE_TAG`` like the kernels: it is part of Numba's cache key, so an edit of ``_numerics.py`` (whose
    sigmoid is inlined here) rebuilds them instead of loading a stale table."""
    source_tag = SOURCE_TAG

    @njit(cache=True, error_model="numpy")
    def table(kind, out):
        _ = source_tag
        for bits in range(out.shape[0]):
            out[bits] = sigmoid_f32(widen(np.uint16(bits), kind))

    @njit(cache=True, error_model="numpy")
    def scalar(value):
        _ = source_tag
        return sigmoid_f32(value)

    return table, scalar


@functools.cache
def sigmoid_table(kind: int) -> np.ndarray:
    """``sigmoid_f32`` of every 16-bit pattern of ``kind``: the Numba kernels' sigmoid, so that both
    kernels agree bit for bit."""
    out = np.empty(1 << 16, dtype=np.float32)
    _sigmoid_kernels()[0](kind, out)
    return out


def sigmoid_scalar(value: np.float32) -> np.float32:
    """``sigmoid_f32(value)`` (for a clamp limit, which need not be a 16-bit value)."""
    return _sigmoid_kernels()[1](np.float32(value))


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _threads(elements: int) -> int:
    return max(1, min(numba.get_num_threads(), elements // _MIN_ELEMENTS_PER_THREAD))


def group_grad(kind, dy, x, weighted, valid_rows, clamp, leaves, merges, grad_x) -> None:
    """``swiglu_group_grad`` on C-contiguous storage-bit arrays (see ``cpu.swiglu_group_grad``);
    ``weighted`` is (weight, y_origin, grad_weight) or None."""
    rows, hidden = dy.shape
    weight, y_origin, grad_weight = (None, None, None) if weighted is None else weighted
    clamp = np.float32(clamp)
    s_clamp = sigmoid_scalar(clamp) if clamp > 0 else np.float32(0.0)
    LIB.swiglu_group_grad_16(
        _ptr(dy), _ptr(x), _ptr(weight), _ptr(y_origin), rows, hidden, valid_rows, clamp, s_clamp,
        _ptr(sigmoid_table(kind)), _ptr(leaves), _ptr(merges), leaves.shape[0], _ptr(grad_x),
        _ptr(grad_weight), 0 if kind == BF16 else 1, _threads(rows * hidden),
    )  # fmt: skip
