"""The operator layer: :mod:`.table` (one declaration per operator), :mod:`.validate` (the checks and the one
gate to the kernels), :mod:`.registry` (backends per operator), :mod:`.api` (the public functions),
:mod:`.custom_ops` (``torch.ops.swiglu_ops.*``, generated from the table) and :mod:`.groups` (the two group
conventions). Importing it registers the custom ops."""

from . import custom_ops  # noqa: F401  (registers torch.ops.swiglu_ops.*)
