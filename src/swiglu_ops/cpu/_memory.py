"""Memory for outputs: huge-page advice for fresh allocations, and a cache that reuses freed outputs.

A large ``torch.empty`` result is fresh anonymous memory: the kernel's first write to every 4 KiB page
takes a page fault, which costs more than the write itself (measured in ``docs/cpu_backend.md``: filling a
new 67 MB tensor takes ~2.5x as long as filling a reused one). Advising transparent huge pages before the
first write makes each fault map 2 MiB instead. This is only advice: without Linux THP it does nothing,
and on memory that is already mapped it only allows a later collapse into huge pages.
"""

from __future__ import annotations

import collections
import ctypes
import math
import sys
import threading
import weakref

import numpy as np
import torch

_HUGE_PAGE = 1 << 21
_MADV_HUGEPAGE = 14
_MIN_BYTES = 4 * _HUGE_PAGE


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


def advise_huge_pages(*tensors: torch.Tensor | None) -> None:
    """Ask for transparent huge pages over the 2 MiB-aligned interior of each large tensor (best effort)."""
    if _madvise is None:
        return
    for t in tensors:
        if t is None or t.numel() * t.element_size() < _MIN_BYTES:
            continue
        start = (t.data_ptr() + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
        end = (t.data_ptr() + t.numel() * t.element_size()) & ~(_HUGE_PAGE - 1)
        if end > start:
            _madvise(start, end - start, _MADV_HUGEPAGE)  # failure only means no huge pages


class OutputCache:
    """Reuses the memory of freed large outputs, as PyTorch's CUDA caching allocator does on the GPU.

    A large ``torch.empty`` is fresh ``mmap`` memory whose every page faults on first write, so an op that
    allocates its outputs pays for those faults on every call (glibc never keeps allocations above 32 MiB
    around). Instead, :meth:`empty` hands out tensors over NumPy buffers, notices (through a weakref
    finalizer on a per-tensor array object) when the tensor and all its views are gone, and keeps the
    buffer for the next request of the same size, already mapped. At most ``max_bytes`` of *free* buffers
    are kept (oldest dropped first); buffers in use are never counted or touched. Small requests go to
    ``torch.empty``. Tensors from the cache are ordinary CPU tensors (``share_memory_`` and pickling work),
    except that their storage cannot grow (``resize_`` beyond it raises), as with ``torch.from_numpy``.
    """

    def __init__(self, max_bytes: int, min_bytes: int = _MIN_BYTES):
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._order: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # oldest first
        self._free_bytes = 0
        self._lock = threading.Lock()

    @property
    def free_bytes(self) -> int:
        """Bytes held in free buffers, ready for reuse."""
        return self._free_bytes

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor, from a cached buffer when one of its size is free."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return torch.empty(shape, dtype=dtype)
        if self.max_bytes <= 0:  # cache off: fresh memory every time, at least in huge pages
            out = torch.empty(shape, dtype=dtype)
            advise_huge_pages(out)
            return out
        buf = None
        with self._lock:
            bufs = self._free.get(nbytes)
            if bufs:
                buf = bufs.pop()
                del self._order[id(buf)]
                self._free_bytes -= nbytes
        if buf is None:
            buf = np.empty(nbytes, dtype=np.uint8)
            advise_huge_pages(torch.from_numpy(buf))
        handle = buf[:]  # its own array object: finalised when the last tensor over it is freed
        weakref.finalize(handle, self._release, buf)
        return torch.from_numpy(handle).view(dtype).view(shape)

    def _release(self, buf: np.ndarray) -> None:
        with self._lock:
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
