"""The reference backend: the contract in readable PyTorch, one file per rule family, built from the rules
of :mod:`swiglu_ops.numerics`. The oracle of the test suite; reached, like every backend, only through the
registry (``backend="reference"``).

Every kernel runs in the contract's floating-point environment, whatever the caller set, and leaves the
caller's as it was (:func:`_contract_fp_env`): subnormals kept (a caller's ``torch.set_flush_denormal(True)``
is lifted for the call and set again after it), and MKL's vector math settled on one thread before the
first ``torch.exp`` of the process (a race in MKL's CPU detection otherwise lets the first parallel
``exp`` of a process compute some elements with another kernel: docs/cpu_backend.md, "Floating-point
environment")."""

import functools
import sys

import torch

from ...ops.registry import KERNELS, Backend
from . import bwd_mx_quant, clipped, fwd_mx_quant, group_grad

NAME = "reference"

_VML_SETTLED = False


def _flushes_denormals() -> bool:
    """Whether the calling thread flushes fp32 subnormal results or inputs to zero (FTZ or DAZ: one-element
    tensor operations run on the calling thread). PyTorch has a setter only, ``torch.set_flush_denormal``,
    which sets or clears both."""
    tiny = torch.tensor([2.0**-126], dtype=torch.float32, device="cpu")
    return bool((tiny * 0.5 == 0).item() or (tiny * 0.5 * 2.0 == 0).item())


def _contract_fp_env(fn):
    """``fn`` run with subnormals kept and MKL's vector math settled (module docstring)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        global _VML_SETTLED
        if not _VML_SETTLED:
            torch.exp(
                torch.zeros(16, device="cpu")
            )  # one VML call on one thread (below PyTorch's parallel grain)
            _VML_SETTLED = True
        if not _flushes_denormals():
            return fn(*args, **kwargs)
        torch.set_flush_denormal(False)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_flush_denormal(True)

    return run


swiglu_group_grad = _contract_fp_env(group_grad.swiglu_group_grad)
swiglu_bwd_mx_quant = _contract_fp_env(bwd_mx_quant.swiglu_bwd_mx_quant)
swiglu_mx_quant = _contract_fp_env(fwd_mx_quant.swiglu_mx_quant)
clipped_swiglu = _contract_fp_env(clipped.clipped_swiglu)
clipped_swiglu_grad = _contract_fp_env(clipped.clipped_swiglu_grad)


def is_available(device) -> tuple[bool, str]:
    return True, ""


BACKEND = Backend(NAME, sys.modules[__name__], KERNELS)  # every kernel contract, by its name here


__all__ = [
    "BACKEND",
    "NAME",
    "is_available",
    "swiglu_group_grad",
    "swiglu_bwd_mx_quant",
    "swiglu_mx_quant",
    "clipped_swiglu",
    "clipped_swiglu_grad",
]
