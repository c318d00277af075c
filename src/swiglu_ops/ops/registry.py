"""The backend registry: which implementations exist, per operator, and which one a call runs.

A backend is a module that defines ``BACKEND``, a :class:`Backend`: its name, ``is_available(device)`` and
one function per kernel contract it implements (``kernels``, keyed by the operator table's ``kernel``
names; the contracts are in ``docs/design.md``). The three shipped backends are registered here by module
path and imported on first use, so that ``import swiglu_ops`` loads none of them (Triton is optional) and
the operator layer imports no backend: the backends import the layers below them, never the reverse.
Another package can add one with :func:`register`.

``backend="auto"`` picks by device: ``triton`` for CUDA tensors, ``cpu`` for CPU tensors; where that backend
cannot run (no C compiler at install time, no Triton) it warns once and runs the reference. A named backend
that is unknown, unavailable on the device, or lacks the operator or the dtype is a ``ValueError`` that says
which and why: never a silent fallback.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType

import torch
from torch._subclasses.fake_tensor import is_fake

__all__ = [
    "Backend",
    "register",
    "backend_names",
    "check_backend_name",
    "backend_module",
    "backend_status",
    "available_backends",
    "select",
]


@dataclass(frozen=True)
class Backend:
    """One backend: its ``module`` defines ``is_available(device) -> (ok, why)`` and one function per kernel
    contract named in ``kernels`` (``swiglu_group_grad``, ``swiglu_bwd_mx_quant``, ``swiglu_mx_quant``,
    ``clipped_swiglu``, ``clipped_swiglu_grad``; looked up at each call, so a test may replace one), and
    optionally ``empty(shape, dtype)``, an output allocator on the backend's device (the cpu backend reuses
    freed outputs). ``dtypes`` optionally narrows, per kernel, the data dtypes it runs (absent: every dtype
    the operator accepts)."""

    name: str
    module: ModuleType
    kernels: frozenset[str]
    dtypes: Mapping[str, frozenset] = field(default_factory=dict)

    def is_available(self, device: torch.device) -> tuple[bool, str]:
        return self.module.is_available(device)

    def kernel(self, name: str) -> Callable | None:
        return getattr(self.module, name) if name in self.kernels else None

    @property
    def empty(self) -> Callable | None:
        return getattr(self.module, "empty", None)


#: The kernel contracts (docs/design.md), by name: what the operator table's ``kernel`` fields name.
KERNELS = frozenset(
    ("swiglu_group_grad", "swiglu_bwd_mx_quant", "swiglu_mx_quant", "clipped_swiglu", "clipped_swiglu_grad")
)

#: name -> module that defines ``BACKEND`` (imported on first use), in no particular order.
_MODULES: dict[str, str] = {
    "reference": "swiglu_ops.backends.reference",
    "cpu": "swiglu_ops.backends.cpu",
    "triton": "swiglu_ops.backends.triton",
}
#: ``backend="auto"``: the preferred backend per device type (the reference runs everywhere).
_PREFERRED = {"cuda": "triton", "cpu": "cpu"}
_LOADED: dict[str, Backend] = {}
_WARNED: set[tuple[str, str]] = set()


def register(name: str, module: str) -> None:
    """Make backend ``name`` available: ``module`` (a dotted path) defines ``BACKEND``, imported on first
    use."""
    if not isinstance(name, str) or not isinstance(module, str):
        raise TypeError("register(name, module): both must be strings")
    _MODULES[name] = module
    _LOADED.pop(name, None)


def backend_names() -> tuple[str, ...]:
    """Every registered backend's name."""
    return tuple(_MODULES)


def _load(name: str) -> Backend:
    if name not in _LOADED:
        backend = importlib.import_module(_MODULES[name]).BACKEND
        if backend.name != name:
            raise RuntimeError(f"{_MODULES[name]}.BACKEND is named {backend.name!r}, registered as {name!r}")
        _LOADED[name] = backend
    return _LOADED[name]


def backend_module(name: str) -> ModuleType:
    """The module of a registered backend (for its own extras: the cpu backend's instruction sets, ...)."""
    if name not in _MODULES:
        raise ValueError(f"backend must be one of {tuple(_MODULES)}, got {name!r}")
    return _load(name).module


def backend_status(name: str, device: torch.device | str) -> tuple[bool, str]:
    """Whether backend ``name`` can run on ``device``, and why not."""
    if name not in _MODULES:
        return False, f"no backend named {name!r} is registered"
    try:
        backend = _load(name)
    except ImportError as exc:  # an optional dependency (triton, cffi) is missing
        return False, f"cannot import its dependencies ({exc})"
    except AttributeError:  # a partial install that left a module without BACKEND
        return False, f"{_MODULES[name]} is incomplete (no BACKEND)"
    return backend.is_available(torch.device(device))


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Names of the backends that can run on ``device``, fastest first."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device must be a torch.device or a device string such as 'cpu', got {device!r}"
        ) from exc
    first = _PREFERRED.get(device.type)
    order = (
        ([first] if first else []) + [n for n in _MODULES if n not in (first, "reference")] + ["reference"]
    )
    return [b for b in order if backend_status(b, device)[0]]


def _warn_fallback(name: str, device_type: str, why: str) -> None:
    """``"auto"`` runs the (slow) reference where the fast backend cannot: say so once per process."""
    if (name, device_type) in _WARNED:
        return
    _WARNED.add((name, device_type))
    warnings.warn(
        f"swiglu_ops: backend='auto' runs the reference backend (readable PyTorch, much slower) on "
        f"{device_type} tensors because the {name!r} backend is not available: {why}",
        RuntimeWarning,
        stacklevel=5,
    )


def check_backend_name(backend) -> None:
    """``backend`` is ``"auto"`` or a registered backend's name (``TypeError``/``ValueError`` naming it): what
    modules check at construction, before a device is known."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    if backend != "auto" and backend not in _MODULES:
        raise ValueError(f"backend must be one of {('auto', *_MODULES)}, got {backend!r}")


_FORKED = False


def _mark_forked_child() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_mark_forked_child)


def forked_child() -> bool:
    """Whether this process is a child forked from one that had imported swiglu_ops: what a backend whose
    threads do not survive fork (the cpu backend's use of PyTorch's OpenMP team) checks when it loads,
    since backends load lazily, possibly only in the child."""
    return _FORKED


def check_backend_for(backend, t) -> None:
    """:func:`check_backend_name`, and for a named backend whether it runs on the device of tensor ``t``
    (the ``ValueError`` of a call): what the autograd wrappers check at their forward, so that a backend
    their backward cannot use is an error there. Fake and meta tensors (and tracing under torch.compile)
    run no kernel: not checked."""
    check_backend_name(backend)
    if backend == "auto" or torch.compiler.is_compiling() or not isinstance(t, torch.Tensor):
        return
    if t.device.type == "meta" or is_fake(t):
        return
    _named(backend, t.device)


def _named(backend: str, device: torch.device) -> Backend:
    check_backend_name(backend)
    if backend == "auto":
        preferred = _PREFERRED.get(device.type)
        if preferred is not None:
            ok, why = backend_status(preferred, device)
            if ok:
                return _load(preferred)
            _warn_fallback(preferred, device.type, why)
        return _load("reference")
    ok, why = backend_status(backend, device)
    if not ok:
        raise ValueError(f"backend {backend!r} is not available for {device} tensors: {why}")
    return _load(backend)


def select(backend: str, kernel: str, op: str, device: torch.device, dtype: torch.dtype | None):
    """``(Backend, kernel function)`` for operator ``op`` (its kernel contract ``kernel``) on ``device`` with
    data of ``dtype``. A named backend that lacks the operator or the dtype says so (``ValueError``)."""
    impl = _named(backend, device)
    fn = impl.kernel(kernel)
    if fn is None:
        raise ValueError(f"backend {impl.name!r} does not implement {op}")
    allowed = impl.dtypes.get(kernel)
    if allowed is not None and dtype is not None and dtype not in allowed:
        raise ValueError(
            f"backend {impl.name!r} does not run {op} on {dtype} data (it runs {sorted(allowed)})"
        )
    return impl, fn
