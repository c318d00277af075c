"""What the autograd wrappers share: their backward is not differentiable, and says so.

``torch.autograd.function.once_differentiable`` raises on a second backward only where the backward's
incoming gradients require grad; with ``create_graph=True`` on a loss such as ``y.sum()`` they do not, and
the returned gradients then came back detached although they depend on the inputs: a gradient penalty
``||dL/dx||^2`` added to the loss was silently dropped. :func:`no_double_backward` also looks at the
forward's inputs (``ctx.needs_input_grad``): a second backward through such gradients raises.
"""

from __future__ import annotations

import functools

import torch
from torch._C import _functions

_MESSAGE = b"no double backward: the swiglu_ops operators have no derivative of their backward (second order)"


def no_double_backward(backward):
    """Decorator of an ``autograd.Function.backward``: runs it without recording, and where a graph is being
    built (``create_graph=True``) and its results depend on something that requires grad, returns them
    behind a node that raises when differentiated."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled():
            return outputs
        depends = any(ctx.needs_input_grad) or any(
            isinstance(g, torch.Tensor) and g.requires_grad for g in grads
        )
        if not depends:
            return outputs
        single = not isinstance(outputs, tuple)
        outputs = (outputs,) if single else outputs
        tensors = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)]
        guarded = _functions.DelayedError(_MESSAGE, len(tensors))(
            *[outputs[i].detach().requires_grad_() for i in tensors]
        )
        guarded = (guarded,) if isinstance(guarded, torch.Tensor) else guarded
        result = list(outputs)
        for i, g in zip(tensors, guarded, strict=True):
            result[i] = g
        return result[0] if single else tuple(result)

    return wrapper
