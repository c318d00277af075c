"""Huge-page advice for freshly allocated outputs.

A large ``torch.empty`` result is fresh anonymous memory: the kernel's first write to every 4 KiB page
takes a page fault, which costs more than the write itself (measured in ``docs/cpu_backend.md``: filling a
new 67 MB tensor takes ~2.5x as long as filling a reused one). Advising transparent huge pages before the
first write makes each fault map 2 MiB instead. This is only advice: without Linux THP it does nothing,
and on memory that is already mapped it only allows a later collapse into huge pages.
"""

from __future__ import annotations

import ctypes
import sys

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
