"""Shared fixtures: every test taking ``backend`` runs once per backend available for CPU tensors.

``swiglu_ops.available_backends("cpu")`` decides: "reference" always, "cpu" once its dependencies import,
"triton" only under ``TRITON_INTERPRET=1``. A new backend joins the whole suite by becoming available.
"""

from __future__ import annotations

import os

import pytest
import torch

# Without a GPU the Triton kernels run on CPU tensors through Triton's interpreter, which must be switched
# on before triton is first imported. This makes the whole conformance suite run against "triton" in CI.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import swiglu_ops  # noqa: E402

BACKENDS = swiglu_ops.available_backends("cpu")

#: Backends that execute their kernels in an interpreter on CPU tensors (the Triton interpreter runs every
#: program instance in Python). Tests whose shapes would take minutes there use ``compiled_backend``.
INTERPRETED = ("triton",)
COMPILED_BACKENDS = [b for b in BACKENDS if b not in INTERPRETED]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; without xdist the suite runs in one process
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto`` (the README's test command): one worker per CPU this process may run on, at most 4. Each
    worker imports torch and Triton (about 1 GB); the >2**31-element test needs about 11 GB on its own."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, 4))


def pytest_collection_modifyitems(config, items) -> None:
    """The tests marked ``slow`` first, longest first (``seconds``: about how long one takes on a 2-core
    CI machine), the order otherwise kept: with several workers (``-n auto --maxschedchunk 2``, so that no
    worker queues more than a few) the longest ones start at once instead of ending the run alone."""

    def key(item):
        slow = item.get_closest_marker("slow")
        return -slow.kwargs.get("seconds", 1) if slow is not None else 0

    items.sort(key=key)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    """Every backend available for CPU tensors (session-scoped so hypothesis tests can use it)."""
    return request.param


@pytest.fixture(scope="session", params=COMPILED_BACKENDS)
def compiled_backend(request) -> str:
    """Every available backend except the interpreted ones, for tests with large shapes."""
    return request.param
