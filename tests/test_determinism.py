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
