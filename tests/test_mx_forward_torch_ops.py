"""``torch.ops.swiglu_ops.swiglu_mx_quant_dual_axis``: schema (the destination format travels as its name,
a string), opcheck (fake vs real kernels), eager parity with the public function, torch.compile."""

from __future__ import annotations

import pytest
import torch
from _compare import MX_NAMES, assert_bitwise_equal
from torch._subclasses.fake_tensor import FakeTensorMode

import swiglu_ops

OP = torch.ops.swiglu_ops.swiglu_mx_quant_dual_axis.default
E1M2 = swiglu_ops.float4_e1m2fn_x2


def u8(t):
    return t.view(torch.uint8)


def assert_same(actual, expected):
    assert len(actual) == len(expected) == 4
    for a, e, name in zip(actual, expected, MX_NAMES, strict=True):
        assert (a.dtype, a.shape) == (e.dtype, e.shape), name
        assert_bitwise_equal(u8(a), u8(e), name)


def test_schema():
    schema = str(OP._schema)
    for fragment in (
        "Tensor x",
        "Tensor? group_index=None",
        "bool activate_left=True",
        'str round_mode="rint"',
        "int? scale_alg=None",
        'str dst_dtype="float8_e4m3fn"',
        "float max_dtype_value=0.",
        "float? limit=None",
        "float? alpha=None",
        "float? bias=None",
        "bool interleaved=False",
        'str backend="auto"',
        "-> (Tensor, Tensor, Tensor, Tensor)",
    ):
        assert fragment in schema, fragment
    assert not OP._schema.is_mutable


def cases():
    gen = torch.Generator().manual_seed(1)

    def t(*shape, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=gen) * 2).to(dtype)

    yield "plain", (t(40, 64),), {}
    yield (
        "n20-e5m2-ocp",
        (t(70, 40), torch.tensor([30, 30, 70])),
        {"scale_alg": 0, "dst_dtype": "float8_e5m2"},
    )
    yield (
        "e2m1-floor",
        (t(33, 72, dtype=torch.float16),),
        {"dst_dtype": "float4_e2m1fn_x2", "round_mode": "floor"},
    )
    yield (
        "e1m2-groups",
        (t(70, 36), torch.tensor([10, 70], dtype=torch.int32)),
        {"dst_dtype": "float4_e1m2fn_x2"},
    )
    yield "batch-fp32-right", (t(2, 33, 66, dtype=torch.float32),), {"activate_left": False}
    yield (
        "gpt-oss",
        (t(40, 64),),
        {"limit": 7.0, "alpha": 1.702, "bias": 1.0, "interleaved": True, "dst_dtype": "float4_e2m1fn_x2"},
    )


CASES = list(cases())
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize(("name", "args", "kwargs"), CASES, ids=IDS)
def test_opcheck(name, args, kwargs, backend):
    torch.library.opcheck(OP, args, {**kwargs, "backend": backend})


@pytest.mark.parametrize(("name", "args", "kwargs"), CASES, ids=IDS)
def test_op_equals_public_function(name, args, kwargs):
    """The op takes the format's name; the function takes the torch dtype (or the E1M2 sentinel)."""
    public = dict(kwargs)
    if "dst_dtype" in public:
        public["dst_dtype"] = swiglu_ops.mx.dst_from_name(public["dst_dtype"])
    actual = OP(*args, **kwargs, backend="reference")
    assert_same(actual, swiglu_ops.swiglu_mx_quant_dual_axis(*args, **public, backend="reference"))


def test_fake_kernel_validates_at_trace_time():
    with FakeTensorMode():
        with pytest.raises(TypeError, match="dst_dtype"):
            OP(torch.empty(4, 8), dst_dtype="float8_e4m3fnuz")
        with pytest.raises(TypeError, match="dst_dtype"):
            OP(torch.empty(4, 8), dst_dtype="torch.float8_e4m3fn")
        with pytest.raises(ValueError, match="multiple of 4"):
            OP(torch.empty(4, 6), dst_dtype="float4_e2m1fn_x2")
        with pytest.raises(ValueError, match="scale_alg"):
            OP(torch.empty(4, 8), dst_dtype="float4_e1m2fn_x2", scale_alg=1)
        with pytest.raises(ValueError, match="round_mode"):
            OP(torch.empty(4, 8), round_mode="floor")
        # group_index values cannot be read from a fake tensor: only its metadata is checked here...
        outs = OP(torch.empty(70, 40), torch.empty(3, dtype=torch.int64), dst_dtype="float4_e1m2fn_x2")
        assert [(tuple(t.shape), t.dtype) for t in outs] == [
            ((70, 10), torch.uint8),
            ((70, 1, 2), torch.float8_e8m0fnu),
            ((70, 10), torch.uint8),
            ((70 // 64 + 3, 20, 2), torch.float8_e8m0fnu),
        ]
        outs = OP(torch.empty(5, 70, 200), dst_dtype="float4_e2m1fn_x2")
        assert [tuple(t.shape) for t in outs] == [(5, 70, 50), (5, 70, 2, 2), (5, 70, 50), (5, 2, 100, 2)]
        assert outs[0].dtype == torch.float4_e2m1fn_x2
    # ...and the values by the real kernel.
    with pytest.raises(ValueError, match="last value must equal"):
        OP(torch.zeros(70, 40), torch.tensor([10, 20]), backend="reference")


def test_compile_fullgraph_matches_eager():
    """The op and the public function (which calls the op while compiling) under torch.compile
    (fullgraph, dynamic shapes), equal to eager bit for bit; compiling first must not break eager."""

    def fn(x, ends):
        fp8 = OP(x, ends, scale_alg=0, backend="reference")
        fp4 = swiglu_ops.swiglu_mx_quant_dual_axis(
            x * 2, ends, dst_dtype=torch.float4_e2m1fn_x2, round_mode="round", backend="reference"
        )
        e1m2 = swiglu_ops.swiglu_mx_quant_dual_axis(x, dst_dtype=E1M2, limit=7.0, alpha=1.702, bias=1.0)
        return (*fp8, *fp4, *e1m2)

    gen = torch.Generator().manual_seed(2)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for rows in (40, 70):
        x = torch.randn(rows, 72, generator=gen).bfloat16()
        ends = torch.tensor([rows // 3, rows])
        got = compiled(x, ends)
        want = fn(x, ends)
        for i in range(0, 12, 4):
            assert_same(got[i : i + 4], want[i : i + 4])


def test_compiled_public_function_rejects_out():
    """``out=`` inside torch.compile is a clear error (Inductor cannot copy into float8_e8m0fnu / float4
    buffers); eager ``out=`` is tested in test_mx_forward.py."""
    x = torch.randn(40, 72).bfloat16()
    out = tuple(swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="reference"))  # the right shapes and dtypes

    def fn(x, out):
        return swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="reference", out=out)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="out= is not supported inside torch.compile"):
        torch.compile(fn, fullgraph=True)(x, out)
