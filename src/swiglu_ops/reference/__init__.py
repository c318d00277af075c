"""The reference backend: the contract in readable PyTorch. The oracle of the test suite."""

from .bwd_mx_quant import swiglu_bwd_mx_quant
from .clipped import clipped_swiglu, clipped_swiglu_grad
from .fwd_mx_quant import swiglu_mx_quant
from .group_grad import swiglu_group_grad

NAME = "reference"


def is_available(device) -> tuple[bool, str]:
    return True, ""


__all__ = [
    "NAME",
    "is_available",
    "swiglu_group_grad",
    "swiglu_bwd_mx_quant",
    "swiglu_mx_quant",
    "clipped_swiglu",
    "clipped_swiglu_grad",
]
