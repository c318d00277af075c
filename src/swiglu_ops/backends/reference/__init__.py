"""The reference backend: the contract in readable PyTorch, one file per rule family, built from the rules
of :mod:`swiglu_ops.numerics`. The oracle of the test suite; reached, like every backend, only through the
registry (``backend="reference"``)."""

import sys

from ...ops.registry import KERNELS, Backend
from .bwd_mx_quant import swiglu_bwd_mx_quant
from .clipped import clipped_swiglu, clipped_swiglu_grad
from .fwd_mx_quant import swiglu_mx_quant
from .group_grad import swiglu_group_grad

NAME = "reference"


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
