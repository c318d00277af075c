"""The training layer: autograd functions and modules on the operators (:mod:`.nn`), the MXFP8 expert MLP
(:mod:`.expert_mlp`) and the scale layouts that MX GEMMs read (:mod:`.layouts`). Everything here calls the
operators through the public layer (:mod:`swiglu_ops.ops.api`), never a backend."""
