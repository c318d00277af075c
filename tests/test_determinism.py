"""Determinism (contract section 3): bitwise identical outputs on every run and for any thread count."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from _compare import MX_NAMES, assert_bitwise_equal
from conftest import INTERPRETED

import swiglu_ops


@contextlib.contextmanager
def threads(n: int):
    """Run with ``n`` torch threads (the cpu backend's thread count too)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


THREAD_COUNTS = sorted({1, 2, 3, os.cpu_count() or 1})


def inputs(seed: int, rows: int = 70, hidden: int = 160):
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(rows, hidden, generator=gen).bfloat16()
    x = (torch.randn(rows, 2 * hidden, generator=gen) * 3).bfloat16()
    x[5, 7] = float("nan")
    x[9, hidden + 10] = float("inf")
    w = torch.rand(rows, 1, generator=gen)
    y_origin = torch.randn(rows, hidden, generator=gen).bfloat16()
    return dy, x, w, y_origin


def thread_counts(backend: str) -> list[int]:
    """The thread counts to compare against one thread: all of them for the backends that run threads; for
    an interpreted one (Triton's interpreter runs its programs one after another in Python, whatever
    torch's thread count) only the largest, which still checks that repeated runs give the same bits."""
    return [THREAD_COUNTS[-1]] if backend in INTERPRETED else THREAD_COUNTS


def test_group_grad_is_deterministic(backend):
    dy, x, w, y_origin = inputs(0)
    args = (dy, x, w, y_origin, torch.tensor([60]), 3.0)
    with threads(1):
        first = swiglu_ops.swiglu_group_grad(*args, backend=backend)
    for n_threads in thread_counts(backend):
        with threads(n_threads):
            for _ in range(2):
                again = swiglu_ops.swiglu_group_grad(*args, backend=backend)
                assert_bitwise_equal(again[0], first[0], f"grad_x, {n_threads} threads")
                assert_bitwise_equal(again[1], first[1], f"grad_weight, {n_threads} threads")


@pytest.mark.parametrize("group_index", [None, torch.tensor([3, 64, 64, 70])], ids=["no_groups", "groups"])
def test_mx_quant_is_deterministic(backend, group_index):
    dy, x, _, _ = inputs(1)
    with threads(1):
        first = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, group_index, backend=backend)
    for n_threads in thread_counts(backend):
        with threads(n_threads):
            for _ in range(2):
                again = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, group_index, backend=backend)
                for a, e, name in zip(again, first, MX_NAMES, strict=True):
                    assert_bitwise_equal(a, e, f"{name}, {n_threads} threads")


# --------------------------------------------------------------- the reference's floating-point environment

_X86 = __import__("platform").machine() in ("x86_64", "AMD64")


def _ftz_cases(backend: str):
    """Calls whose inputs, scalar attributes or results hold fp32 subnormals (inputs made here, before any
    flushing)."""
    gen = torch.Generator().manual_seed(11)
    tiny = torch.randn(64, 128, generator=gen) * 2.0**-126  # fp32 subnormals and small normals
    big = torch.randn(64, 128, generator=gen)
    sub_bf16 = (torch.randn(64, 128, generator=gen) * 1e-19).bfloat16()  # stage-1 values near 2**-126
    near = torch.randn(64, 128, generator=gen) * 1e-40  # around a subnormal limit
    sub = dict(limit=1e-40, alpha=1.0, bias=0.0)  # a subnormal fp32 attribute (cffi converts on the caller)
    return {
        "clipped_swiglu": lambda: (swiglu_ops.clipped_swiglu(tiny, backend=backend),),
        "swiglu_group_grad": lambda: swiglu_ops.swiglu_group_grad(tiny[:, :64], big, backend=backend),
        "swiglu_mx_quant_dual_axis": lambda: swiglu_ops.swiglu_mx_quant_dual_axis(sub_bf16, backend=backend),
        "swiglu_backward_mx_quant_dual_axis": lambda: swiglu_ops.swiglu_backward_mx_quant_dual_axis(
            sub_bf16, sub_bf16[:, :64], backend=backend
        ),
        "clipped_swiglu, subnormal limit": lambda: (
            swiglu_ops.clipped_swiglu(near, limit=1e-40, backend=backend),
        ),
        "swiglu_group_grad, subnormal clamp": lambda: swiglu_ops.swiglu_group_grad(
            near[:, :64], near, clamp_limit=1e-40, backend=backend
        ),
        "swiglu_mx_quant_dual_axis, subnormal limit": lambda: swiglu_ops.swiglu_mx_quant_dual_axis(
            near, **sub, backend=backend
        ),
        "swiglu_backward_mx_quant_dual_axis, subnormal limit": lambda: (
            swiglu_ops.swiglu_backward_mx_quant_dual_axis(near, near[:, :64] * 1e40, **sub, backend=backend)
        ),
    }


@pytest.mark.skipif(not _X86, reason="torch.set_flush_denormal sets the x86 MXCSR")
@pytest.mark.parametrize("name", sorted(_ftz_cases("reference")))
@pytest.mark.parametrize("cpu_backend", ["reference", "cpu"])  # (the caller's MXCSR: the host's backends)
def test_subnormals_are_kept_whatever_the_caller_flushes(cpu_backend, name):
    """The host's backends compute the contract (subnormals kept) under a caller's
    ``torch.set_flush_denormal(True)`` and hand the setting back: the oracle used to flush on the calling
    thread's share, and the cpu backend received a subnormal limit or clamp as 0 (cffi converted it to fp32
    under the caller's flush-to-zero)."""
    if cpu_backend not in swiglu_ops.available_backends("cpu"):
        pytest.skip(f"backend {cpu_backend!r} is not available here")
    backend = cpu_backend
    run = _ftz_cases(backend)[name]  # the inputs are made before the flushing starts
    plain = [t for t in run() if t is not None]
    assert torch.set_flush_denormal(True)
    try:
        flushed = [t for t in run() if t is not None]
        still_flushing = bool((torch.tensor([2.0**-126]) * 0.5 == 0).item())
    finally:
        torch.set_flush_denormal(False)
    assert still_flushing, "the caller's flush-to-zero setting was not restored"
    for i, (a, b) in enumerate(zip(flushed, plain, strict=True)):
        assert_bitwise_equal(a, b, f"{name} output {i}")


def test_reference_settles_mkl_vector_math_on_one_thread_first(monkeypatch):
    """MKL picks its vector-math kernels at a process's first call, racily when two threads enter together
    (docs/cpu_backend.md, "Floating-point environment"): the reference backend's first call makes one
    exp of 16 elements (one thread) before any of its own, and only the first call."""
    from swiglu_ops.backends import reference

    monkeypatch.setattr(reference, "_VML_SETTLED", False)
    sizes, real_exp = [], torch.exp
    monkeypatch.setattr(torch, "exp", lambda t, *a, **k: sizes.append(t.numel()) or real_exp(t, *a, **k))
    x = torch.randn(40, 256)
    for _ in range(2):
        swiglu_ops.clipped_swiglu_grad(torch.randn(40, 128), x, backend="reference")
    assert sizes[0] == 16 and sizes.count(16) == 1 and len(sizes) >= 3, sizes
