"""The operator matrix, from the table: every operator x every backend x {eager, compiled} x awkward shapes.

Each row of ``swiglu_ops.ops.table`` offers ``EXAMPLE_CASES`` example calls: the usual shape with ragged
groups (an empty one), a one-element call, and a rank-3 call with the other options (GPT-OSS's clipped SwiGLU,
E5M2, FP4 with ``round_mode="floor"``, ``dim=1``, clamp_mode 1, ...). In bf16, fp16 and fp32:

- every backend's outputs against the reference backend's, every element, by the contract's rules
  (``tests/_compare.py``: bit-exact for the reference, near ties / ulps / relative grad_weight elsewhere);
- the call under ``torch.compile(fullgraph=True, dynamic=True)`` (``aot_eager``: the operators are opaque
  custom ops) against the eager call of the same backend, bit for bit;
- the custom op on fake tensors (``FakeTensorMode``) gives the eager outputs' shapes and dtypes.

A new operator joins the matrix by its row; the oracle and golden tests (``test_golden.py``,
``test_mx_*``, ``test_clipped_*``) check the reference itself against the operator documents.
"""

from __future__ import annotations

import pytest
import torch
from _compare import assert_bitwise_equal, assert_matches_reference
from _fwd_oracles import unpacked
from torch._subclasses.fake_tensor import FakeTensorMode

import swiglu_ops
from swiglu_ops.ops import api, checks
from swiglu_ops.ops.table import EXAMPLE_CASES, PUBLIC

OPS = {op.name: op for op in PUBLIC}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _call(name, backend, case, dtype):
    op = OPS[name]
    values = op.example(torch.Generator().manual_seed(case), dtype, torch.device("cpu"), case)
    fn = getattr(api, name)
    return values, (lambda **kw: fn(**values, **kw))


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()


def _magnitude(name, output, values, want):
    """The size an fp32 result's difference is measured at (the cancelling terms, grad_weight's terms), or
    None: the rule of ``swiglu-ops verify`` and the benchmark (:func:`swiglu_ops.ops.checks.error_scale`)."""
    if want.dtype != torch.float32:
        return None
    scale = checks.error_scale(OPS[name], output, checks.with_defaults(OPS[name], values))
    return None if scale is None else scale.reshape(want.shape)


def _comparable(t):
    """FP4 bytes as one code per element (a near tie is one unit of one element)."""
    return unpacked(t, torch.float4_e2m1fn_x2) if t.dtype == torch.float4_e2m1fn_x2 else t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(EXAMPLE_CASES))
@pytest.mark.parametrize("name", OPS)
def test_backend_matches_reference(name, case, dtype, backend):
    values, run = _call(name, backend, case, DTYPES[dtype])
    want, got = _outputs(run(backend="reference")), _outputs(run(backend=backend))
    specs = OPS[name].returned(values)
    assert len(got) == len(want) == len(specs)
    for spec, g, w in zip(specs, got, want, strict=True):
        if w is None:
            assert g is None, spec.name
            continue
        assert_matches_reference(
            _comparable(g), _comparable(w), backend, spec.name, grad_weight=spec.name == "grad_weight",
            magnitude=_magnitude(name, spec.name, values, w),
        )  # fmt: skip


@pytest.mark.parametrize("case", range(EXAMPLE_CASES))
@pytest.mark.parametrize("name", OPS)
def test_compiled_equals_eager(name, case, backend):
    values, run = _call(name, backend, case, torch.bfloat16)
    fn = getattr(api, name)
    want = _outputs(run(backend=backend))
    compiled = torch.compile(
        lambda v: fn(**v, backend=backend), backend="aot_eager", fullgraph=True, dynamic=True
    )
    got = _outputs(compiled(values))
    for spec, g, w in zip(OPS[name].returned(values), got, want, strict=True):
        if w is None:
            assert g is None, spec.name
        else:
            assert_bitwise_equal(_comparable(g), _comparable(w), spec.name)


@pytest.mark.parametrize("case", range(EXAMPLE_CASES))
@pytest.mark.parametrize("name", OPS)
def test_fake_tensors_give_the_output_shapes(name, case):
    values, run = _call(name, "reference", case, torch.bfloat16)
    want = _outputs(run(backend="reference"))
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in values.items()}
        got = _outputs(getattr(swiglu_ops, name)(**fake, backend="cpu"))
    for spec, g, w in zip(OPS[name].returned(values), got, want, strict=True):
        if w is None:
            assert g is None, spec.name
        else:
            assert (g.shape, g.dtype) == (w.shape, w.dtype), spec.name
