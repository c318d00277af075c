"""The ``cpu`` backend: fused C kernels for CPU tensors, one pass over memory, all cores.

Every operator is one C entry point (``csrc/swiglu_cpu.h``) that owns its arguments, threads and task
loop; this module only fills the entry point's argument struct from the kernel contract
(``docs/design.md``) and calls it (``_loader`` loads the library and picks the
instruction set). The design, the measurements and the numbers are in ``docs/cpu_backend.md``.

Threads: ``torch.get_num_threads()`` at the time of the call (``torch.set_num_threads`` changes it). The
results do not depend on it.

Outputs: operators called without ``out=`` get their outputs from :data:`OUTPUT_CACHE`, which reuses the
memory of freed outputs (the CPU counterpart of PyTorch's CUDA caching allocator; see :class:`OutputCache`).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import math
import os
import sys
import threading
import weakref

import numpy as np
import torch

from ...numerics.glu import GluParams, fp32_bits
from ...ops.registry import KERNELS, Backend
from . import _loader

NAME = "cpu"

#: The C library (``LIBRARY.lib`` is None when it is unavailable, ``LIBRARY.why`` says why).
LIBRARY = _loader.load()


# ---------------------------------------------------------------------------------------------- memory

_HUGE_PAGE = 1 << 21
_MADV_HUGEPAGE = 14


def _load_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_madvise = _load_madvise()


def _advise_huge_pages(t: torch.Tensor) -> None:
    """Ask for transparent huge pages over the 2 MiB-aligned interior of a fresh buffer (best effort): its
    first writes then fault once per 2 MiB instead of once per 4 KiB."""
    start = (t.data_ptr() + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
    end = (t.data_ptr() + t.numel() * t.element_size()) & ~(_HUGE_PAGE - 1)
    if _madvise is not None and end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)  # failure only means no huge pages


class OutputCache:
    """Reuses the memory of freed large outputs, as PyTorch's CUDA caching allocator does on the GPU.

    A large ``torch.empty`` is fresh ``mmap`` memory whose every page faults on first write (glibc never
    keeps allocations above 32 MiB around), so an operator that allocates its outputs would pay for those
    faults on every call: measured at M=8192, 2H=4096 bf16 in ``docs/cpu_backend.md``, they cost more than
    huge-page advice saves. :meth:`empty` hands out tensors over NumPy buffers, notices (a weakref finalizer
    on a per-tensor array object) when the tensor and all its views are gone, and keeps the buffer for the
    next request of the same size, already mapped. At most ``max_bytes`` of *free* buffers are kept (oldest
    dropped first); buffers in use are never counted or touched. Requests under ``min_bytes`` (256 KiB) go
    to ``torch.empty``: the cache's bookkeeping costs about 3 us a tensor more than ``torch.empty``, and a
    256 KiB buffer that faults again costs about 64 faults. The 1 MiB scale outputs of the MX operators at
    M=8192, 2H=4096 are cached: from ``torch.empty`` they faulted on every call in the benchmark (glibc gave
    their pages back between calls), 0.3-0.7 ms of the backward's 10 ms.

    A finalizer may run inside garbage collection, at any allocation, also while this cache holds its lock:
    it therefore never takes the lock, it only appends the buffer to a queue, which the next call under the
    lock empties.
    """

    def __init__(self, max_bytes: int, min_bytes: int = 256 << 10):
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._order: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # oldest first
        self._free_bytes = 0
        self._released: collections.deque[np.ndarray] = collections.deque()  # from finalizers, lock-free
        self._lock = threading.Lock()

    @property
    def free_bytes(self) -> int:
        """Bytes held in free buffers, ready for reuse."""
        with self._lock:
            self._collect()
            return self._free_bytes

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor, from a cached buffer when one of its size is free."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return torch.empty(shape, dtype=dtype, device="cpu")
        if self.max_bytes <= 0:  # cache off: fresh memory every time, at least in huge pages
            out = torch.empty(shape, dtype=dtype, device="cpu")
            _advise_huge_pages(out)
            return out
        buf = None
        with self._lock:
            self._collect()
            bufs = self._free.get(nbytes)
            if bufs:
                buf = bufs.pop()
                del self._order[id(buf)]
                self._free_bytes -= nbytes
        if buf is None:
            buf = np.empty(nbytes, dtype=np.uint8)
            _advise_huge_pages(torch.from_numpy(buf))
        handle = buf[:]  # its own array object: finalised when the last tensor over it is freed
        weakref.finalize(handle, self._released.append, buf)
        return torch.from_numpy(handle).view(dtype).view(shape)

    def _collect(self) -> None:
        """Move released buffers to the free lists, dropping the oldest beyond ``max_bytes`` (lock held)."""
        while self._released:
            buf = self._released.popleft()
            self._free.setdefault(buf.nbytes, []).append(buf)
            self._order[id(buf)] = buf
            self._free_bytes += buf.nbytes
        while self._free_bytes > self.max_bytes:
            _, old = self._order.popitem(last=False)
            same = self._free[old.nbytes]
            same[:] = [b for b in same if b is not old]  # by identity: == on arrays is elementwise
            self._free_bytes -= old.nbytes

    def clear(self) -> None:
        """Drop every free buffer (their memory goes back to the system)."""
        with self._lock:
            self._collect()
            self._free.clear()
            self._order.clear()
            self._free_bytes = 0


def cache_bytes_from_env(value: str | None) -> int:
    """The output cache's byte cap from ``SWIGLU_OPS_CPU_CACHE_MB`` (MiB, default 1024, 0 disables)."""
    if value is None or value.strip() == "":
        return 1024 << 20
    try:
        mib = int(value)
    except ValueError:
        mib = -1
    if mib < 0:
        raise ValueError(f"SWIGLU_OPS_CPU_CACHE_MB must be a non-negative integer (MiB), got {value!r}")
    return mib << 20


def _cache_setting() -> tuple[int, str]:
    """The cache's byte cap from the environment, and why the backend is unavailable when the setting is
    bad (as for ``SWIGLU_OPS_CPU_SIMD`` / ``_POOL``: "auto" then warns and runs the reference)."""
    try:
        return cache_bytes_from_env(os.environ.get("SWIGLU_OPS_CPU_CACHE_MB")), ""
    except ValueError as exc:
        return 0, f"ValueError: {exc}"


_CACHE_BYTES, _SETTING_WHY = _cache_setting()
#: Freed outputs kept for reuse, at most this many MiB of them (``SWIGLU_OPS_CPU_CACHE_MB``, 0 disables).
OUTPUT_CACHE = OutputCache(max_bytes=_CACHE_BYTES)
# A fork while another thread holds the cache's lock would leave it held forever in the child: a new one.
os.register_at_fork(after_in_child=lambda: setattr(OUTPUT_CACHE, "_lock", threading.Lock()))


def empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """Output allocation for the kernel contracts (``docs/design.md``): large outputs reuse the memory of
    freed ones."""
    return OUTPUT_CACHE.empty(shape, dtype)


def empty_cache() -> None:
    """Release the memory of every freed output kept for reuse."""
    OUTPUT_CACHE.clear()


# ------------------------------------------------------------------------------------------ operators


def is_available(device) -> tuple[bool, str]:
    if torch.device(device).type != "cpu":
        return False, "the cpu backend runs on CPU tensors only"
    if _SETTING_WHY:
        return False, _SETTING_WHY
    if LIBRARY.lib is None:
        return False, LIBRARY.why
    return True, ""


def _dtype(t: torch.Tensor) -> int:
    lib = LIBRARY.lib
    return {torch.bfloat16: lib.SWIGLU_BF16, torch.float16: lib.SWIGLU_FP16, torch.float32: lib.SWIGLU_FP32}[
        t.dtype
    ]


def _ptr(t: torch.Tensor | None, ctype: str = "void *"):
    return LIBRARY.ffi.NULL if t is None else LIBRARY.ffi.cast(ctype, t.data_ptr())


def _set_fp32(dst, field: str, value: float) -> None:
    """``dst.field = value`` for a C float field, written as its bits: a C conversion to float (cffi's,
    struct's, torch's) obeys the calling thread's flush-to-zero, which would turn a subnormal limit or clamp
    into 0 before the kernels, which run with the default floating-point environment, ever see it."""
    LIBRARY.ffi.cast("uint32_t *", LIBRARY.ffi.addressof(dst, field))[0] = fp32_bits(value)


def _fill_glu(dst, glu: GluParams) -> None:
    dst.interleaved = glu.interleaved
    dst.a_index = glu.a_index
    dst.clipped = glu.clipped
    dst.clamp_mode = glu.clamp_mode
    for field in ("alpha", "limit", "bias"):
        _set_fp32(dst, field, getattr(glu, field))
    dst.gather = LIBRARY.gather


def _run(entry: str, args) -> None:
    rc = getattr(LIBRARY.lib, entry)(args, LIBRARY.isa_code, torch.get_num_threads())
    if rc == -2:
        raise MemoryError(f"swiglu_ops cpu backend: {entry} could not allocate its working memory")
    if rc != 0:  # the API validated the arguments: this is a bug
        raise RuntimeError(f"swiglu_ops cpu backend: {entry} refused its arguments (rc {rc}); please report")


def _glu_args(op: int, x: torch.Tensor, valid_rows, out: torch.Tensor, dy=None, glu: GluParams | None = None):
    args = LIBRARY.ffi.new("swiglu_glu_args *")
    args.op = op
    args.dtype = _dtype(x)
    args.rows, args.cols = x.shape
    args.valid_rows = x.shape[0] if valid_rows is None else int(valid_rows)
    args.x = _ptr(x)
    args.dy = _ptr(dy)
    args.out = _ptr(out)
    _fill_glu(args.glu, glu or GluParams())
    return args


def swiglu_group_grad(dy, x, weight, y_origin, valid_rows, clamp, grad_x, grad_weight) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes grad_x/grad_weight."""
    args = _glu_args(LIBRARY.lib.SWIGLU_OP_GROUP_GRAD, x, valid_rows, grad_x, dy)
    args.weight = _ptr(weight, "float *")
    args.y_origin = _ptr(y_origin)
    args.grad_weight = _ptr(grad_weight, "float *")
    _set_fp32(args, "clamp", clamp)
    _run("swiglu_glu_run", args)


def clipped_swiglu(x, valid_rows, glu, y) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y (+0.0 on rows past the valid
    count)."""
    _run("swiglu_glu_run", _glu_args(LIBRARY.lib.SWIGLU_OP_CLIPPED_FWD, x, valid_rows, y, glu=glu))


def clipped_swiglu_grad(dy, x, valid_rows, glu, grad_x) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes grad_x (+0.0 on rows past the
    valid count)."""
    _run("swiglu_glu_run", _glu_args(LIBRARY.lib.SWIGLU_OP_CLIPPED_BWD, x, valid_rows, grad_x, dy, glu))


def _format(fmt) -> int:
    lib = LIBRARY.lib
    codes = {"e4m3fn": lib.SWIGLU_FMT_E4M3, "e5m2": lib.SWIGLU_FMT_E5M2, "e2m1": lib.SWIGLU_FMT_E2M1}
    codes["e1m2"] = lib.SWIGLU_FMT_E1M2
    return codes[fmt.name]


def _round_mode(round_mode: str) -> int:
    lib = LIBRARY.lib
    return {"rint": lib.SWIGLU_ROUND_RINT, "round": lib.SWIGLU_ROUND_ROUND, "floor": lib.SWIGLU_ROUND_FLOOR}[
        round_mode
    ]


def _mx(
    backward: bool,
    x,
    dy,
    group_ends,
    glu,
    scale_alg,
    fmt,
    round_mode,
    y1,
    s1,
    y2,
    s2,
    transpose_y2,
    weight=None,
    grad_weight=None,
) -> None:
    args = LIBRARY.ffi.new("swiglu_mx_args *")
    args.backward = backward
    args.dtype = _dtype(x)
    args.batch, args.m, args.cols = x.shape
    args.n_groups = 0 if group_ends is None else group_ends.numel()
    args.s2_rows = s2.shape[1]
    args.x = _ptr(x)
    args.dy = _ptr(dy)
    args.group_ends = _ptr(group_ends, "int64_t *")
    args.y1, args.s1, args.y2, args.s2 = (_ptr(t, "uint8_t *") for t in (y1, s1, y2, s2))
    args.format = _format(fmt)
    args.scale_alg = scale_alg
    args.round_mode = _round_mode(round_mode)
    args.transpose_y2 = transpose_y2
    args.tile_pairs = _mx_tile_pairs
    args.weight = _ptr(weight, "float *")
    args.grad_weight = _ptr(grad_weight, "float *")
    _fill_glu(args.glu, glu)
    _run("swiglu_mx_run", args)


def swiglu_bwd_mx_quant(
    x, dy, group_ends, glu, scale_alg, fmt, y1, s1, y2, s2, transpose_y2=False, weight=None, grad_weight=None
) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y1, s1, y2, s2 and,
    with ``weight`` (fp32 [B*M], spec 7.1), ``grad_weight`` (fp32 [B*M], fused in the same pass)."""
    if (weight is None) != (grad_weight is None):
        raise ValueError("weight and grad_weight come together or not at all")
    outs = (y1, s1, y2, s2)
    _mx(True, x, dy, group_ends, glu, scale_alg, fmt, "rint", *outs, transpose_y2, weight, grad_weight)


def swiglu_mx_quant(
    x, group_ends, glu, scale_alg, fmt, round_mode, y1, s1, y2, s2, transpose_y2=False, weight=None
) -> None:
    """Backend entry point (the kernel contract: ``docs/design.md``). Writes y1, s1, y2, s2;
    ``weight`` (fp32 [B*M] or None, spec 7.1) multiplies stage 1 per row."""
    _mx(False, x, None, group_ends, glu, scale_alg, fmt, round_mode, y1, s1, y2, s2, transpose_y2, weight)


BACKEND = Backend(NAME, sys.modules[__name__], KERNELS)  # every kernel contract, by its name here


@contextlib.contextmanager
def instruction_set(name: str):
    """Run this backend's kernels with instruction set ``name`` (one of ``LIBRARY.supported_isas()``) inside
    the ``with`` block (for comparisons and benchmarks; ``SWIGLU_OPS_CPU_SIMD`` sets the default)."""
    if name not in LIBRARY.supported_isas():
        raise ValueError(f"instruction set {name!r} is not one of {LIBRARY.supported_isas()} on this machine")
    saved = LIBRARY.isa, LIBRARY.isa_code
    LIBRARY.isa, LIBRARY.isa_code = name, getattr(LIBRARY.lib, f"SWIGLU_ISA_{name.upper()}")
    try:
        yield
    finally:
        LIBRARY.isa, LIBRARY.isa_code = saved


#: The MX operators' pairs per task at most (0: the library's choice); see ``mx_tile_pairs``.
_mx_tile_pairs = 0


@contextlib.contextmanager
def mx_tile_pairs(pairs: int):
    """Cut every row of the MX operators into tasks of at most ``pairs`` pairs (a multiple of 32 is used)
    inside the ``with`` block: for tests, which thus run the several-tasks-per-row paths at small shapes (the
    bits do not depend on the cut). Not thread-safe."""
    global _mx_tile_pairs
    if not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs must be a positive int, got {pairs!r}")
    saved, _mx_tile_pairs = _mx_tile_pairs, pairs
    try:
        yield
    finally:
        _mx_tile_pairs = saved


def act_table(
    kind: int, dtype: torch.dtype, alpha: float = 1.0, limit: float = math.inf, isa: str = ""
) -> torch.Tensor:
    """The activation table of a 16-bit dtype as the kernels of ``isa`` (default: the running one) build
    it; for tests comparing instruction sets. SWIGLU_ACT_SILU_DERIV's table and the pair tables
    (SWIGLU_ACT_SIGMOID_GLU, SWIGLU_ACT_GLU_SIG_GLU) hold two floats per bit pattern (interleaved:
    [65536, 2])."""
    lib = LIBRARY.lib
    width = 2 if kind >= lib.SWIGLU_ACT_SILU_DERIV else 1  # kernel.h's ACT_WIDTH: the pair tables too
    out = torch.empty((1 << 16) * width, dtype=torch.float32, device="cpu")
    code = getattr(lib, f"SWIGLU_ISA_{isa.upper()}") if isa else LIBRARY.isa_code
    lib.swiglu_act_table(
        kind, _dtype(torch.empty(0, dtype=dtype, device="cpu")), alpha, limit, _ptr(out, "float *"), code
    )
    return out


__all__ = [
    "BACKEND",
    "NAME",
    "LIBRARY",
    "OUTPUT_CACHE",
    "OutputCache",
    "empty",
    "empty_cache",
    "instruction_set",
    "is_available",
    "mx_tile_pairs",
    *sorted(KERNELS),
]
