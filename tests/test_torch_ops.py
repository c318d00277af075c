"""The torch.library registration: schema, opcheck (fake vs real kernels), eager parity, torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import swiglu_ops

ops = torch.ops.swiglu_ops
GROUP_GRAD = ops.swiglu_group_grad.default
MX_QUANT = ops.swiglu_backward_mx_quant_dual_axis.default
BACKENDS = ("reference", "auto")


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_same(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert torch.equal(_bits(a), _bits(e))


def test_schemas_carry_the_attributes():
    group_grad = str(GROUP_GRAD._schema)
    for fragment in (
        "Tensor grad_y",
        "Tensor x",
        "Tensor? weight",
        "Tensor? y_origin",
        "Tensor? group_index",
        "float clamp_limit",
        "str backend",
        "-> (Tensor, Tensor)",
    ):
        assert fragment in group_grad
    mx_quant = str(MX_QUANT._schema)
    for fragment in (
        "Tensor x",
        "Tensor y_grad",
        "Tensor? group_index",
        "bool activate_left",
        "str round_mode",
        "int? scale_alg",
        "ScalarType dst_dtype",
        "float max_dtype_value",
        "float? limit",
        "float? alpha",
        "float? bias",
        "bool interleaved",
        "Tensor? weight",  # the routing weight, positional (torch.library has no keyword-only tensors)
        "str backend",
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",  # y1, mxscale1, y2, mxscale2, grad_weight
    ):
        assert fragment in mx_quant
    assert not GROUP_GRAD._schema.is_mutable and not MX_QUANT._schema.is_mutable


def group_grad_cases():
    gen = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(dtype)

    yield "plain", (t(6, 32), t(6, 64)), {}
    yield (
        "all-optional",
        (
            t(6, 32),
            t(6, 64),
            torch.rand(6, 1, generator=gen),
            t(6, 32),
            torch.tensor([2, 3], dtype=torch.int32),
            3.0,
        ),
        {},
    )
    yield (
        "3d-fp16",
        (t(2, 3, 16, dtype=torch.float16), t(2, 3, 32, dtype=torch.float16)),
        {"clamp_limit": 1.0},
    )
    yield (
        "fp32-weight",
        (
            t(5, 8, dtype=torch.float32),
            t(5, 8 * 2, dtype=torch.float32),
            torch.rand(5, generator=gen),
            t(5, 8, dtype=torch.float32),
        ),
        {},
    )


def mx_cases():
    gen = torch.Generator().manual_seed(1)

    def t(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(dtype)

    yield "plain", (t(40, 64), t(40, 32)), {}
    yield (
        "groups-e5m2-ocp",
        (t(100, 128), t(100, 64), torch.tensor([30, 30, 100])),
        {"scale_alg": 0, "dst_dtype": torch.float8_e5m2},
    )
    yield (
        "batch-fp16-right",
        (t(2, 33, 64, dtype=torch.float16), t(2, 33, 32, dtype=torch.float16)),
        {"activate_left": False},
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("name", "args", "kwargs"), list(group_grad_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_opcheck_group_grad(name, args, kwargs, backend):
    torch.library.opcheck(GROUP_GRAD, args, {**kwargs, "backend": backend})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("name", "args", "kwargs"), list(mx_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_opcheck_mx_quant(name, args, kwargs, backend):
    torch.library.opcheck(MX_QUANT, args, {**kwargs, "backend": backend})


@pytest.mark.parametrize(
    ("name", "args", "kwargs"), list(group_grad_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_group_grad_op_equals_public_function(name, args, kwargs):
    grad_x, grad_weight = GROUP_GRAD(*args, **kwargs, backend="reference")
    expected_x, expected_w = swiglu_ops.swiglu_group_grad(*args, **kwargs, backend="reference")
    assert_same([grad_x], [expected_x])
    if expected_w is None:  # documented: the op returns an empty fp32 tensor where the function returns None
        assert grad_weight.shape == (0,) and grad_weight.dtype == torch.float32
    else:
        assert_same([grad_weight], [expected_w])


@pytest.mark.parametrize(
    ("name", "args", "kwargs"), list(mx_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_mx_op_equals_public_function(name, args, kwargs):
    actual = MX_QUANT(*args, **kwargs, backend="reference")
    expected = swiglu_ops.swiglu_backward_mx_quant_dual_axis(*args, **kwargs, backend="reference")
    assert_same(actual[:4], expected)
    # documented: without weight the op's grad_weight is an empty fp32 tensor, the function returns 4 outputs
    assert len(expected) == 4 and actual[4].shape == (0,) and actual[4].dtype == torch.float32


def test_fake_kernels_validate_at_trace_time():
    with FakeTensorMode():
        dy, x = torch.empty(4, 8), torch.empty(4, 16)
        with pytest.raises(TypeError, match="x must have the dtype"):
            GROUP_GRAD(dy, x.half())
        with pytest.raises(ValueError, match="backend must be one of"):
            GROUP_GRAD(dy, x, backend="gpu")
        with pytest.raises(ValueError, match="multiple of 64"):
            MX_QUANT(torch.empty(4, 32), torch.empty(4, 16))
        # group_index values cannot be read from a fake tensor: only its metadata is checked here...
        outs = MX_QUANT(
            torch.empty(70, 64), torch.empty(70, 32), torch.empty(3, dtype=torch.int64), backend="reference"
        )
        shapes = [t.shape for t in outs]
        assert shapes == [(70, 64), (70, 1, 2), (70, 64), (70 // 64 + 3, 64, 2), (0,)]
    # ...and the values by the real kernel.
    with pytest.raises(ValueError, match="last value must equal"):
        MX_QUANT(torch.zeros(70, 64), torch.zeros(70, 32), torch.tensor([10, 20]), backend="reference")


def test_ops_compile_fullgraph_and_match_eager():
    def chain(dy, x, weight, y_origin, counts, ends):
        grad_x, grad_weight = ops.swiglu_group_grad(dy, x, weight, y_origin, counts, 3.0, backend="reference")
        return (
            grad_x,
            grad_weight,
            *ops.swiglu_backward_mx_quant_dual_axis(grad_x, dy, ends, backend="reference"),
        )

    gen = torch.Generator().manual_seed(2)
    args = (
        torch.randn(40, 32, generator=gen),
        torch.randn(40, 64, generator=gen),
        torch.rand(40, generator=gen),
        torch.randn(40, 32, generator=gen),
        torch.tensor([20, 10]),
        torch.tensor([16, 40]),
    )
    torch._dynamo.reset()
    compiled = torch.compile(chain, fullgraph=True)
    assert_same(compiled(*args), chain(*args))
