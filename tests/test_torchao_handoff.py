"""The torchao hand-off (:mod:`swiglu_ops.integrations.torchao`): the dual-axis MX outputs wrapped as torchao
``MXTensor`` s share the data's storage, ``dequantize()`` equals :func:`swiglu_ops.mx_dequantize` bit for bit
(E4M3, E5M2, E2M1; plain and blocked scales; groups, uneven and empty), torchao's emulated MX matmul (the one
that runs on CPU) consumes them, and what torchao cannot represent is a clear ValueError."""

from __future__ import annotations

import pytest
import torch
import torchao  # noqa: F401  (torchao is a test dependency: never skipped)
from _lazy import assert_imported_only_on_access
from torchao.prototype.mx_formats.mx_tensor import MXTensor

import swiglu_ops
from swiglu_ops.integrations import torchao as ti

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2]
FP8 = FORMATS[:2]
M = 192
ENDS = torch.tensor([64, 64, 96, 192])  # uneven groups (64, 0, 32, 96 rows), one empty
BOUNDS = [(0, 64), (64, 64), (64, 96), (96, 192)]
_BITS = {torch.bfloat16: torch.int16, torch.float32: torch.int32}


def assert_bitwise(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    assert torch.equal(got.view(_BITS[got.dtype]), want.view(_BITS[want.dtype]))


def shares(t: MXTensor, data: torch.Tensor) -> bool:
    return (
        t.qdata.data_ptr() == data.data_ptr()
        and t.qdata.untyped_storage().data_ptr() == data.untyped_storage().data_ptr()
    )


def forward(n: int, dst, *, transpose_y2: bool = False, ends=ENDS):
    x = torch.randn(M, 2 * n, generator=torch.Generator().manual_seed(0), dtype=torch.bfloat16) * 4
    return swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, dst_dtype=dst, transpose_y2=transpose_y2)


@pytest.mark.parametrize("blocked", [False, True], ids=["plain", "blocked"])
@pytest.mark.parametrize("n", [128, 96], ids=["N%64=0", "N%64=32"])
@pytest.mark.parametrize("dst", FORMATS, ids=lambda d: str(d).split(".")[-1])
def test_rowwise_shares_storage_and_dequantizes_bitwise(dst, n, blocked):
    y1, s1, _, _ = forward(n, dst)
    t = ti.rowwise_mxtensor(y1, s1, blocked=blocked)
    assert isinstance(t, MXTensor) and t.shape == (M, n) and t.dtype == torch.bfloat16
    assert t.is_swizzled_scales == blocked and t.kernel_preference == ti.KernelPreference.EMULATED
    assert shares(t, y1)
    # Plain scales are a view of mxscale1 exactly when the paired layout has no pad slot.
    assert (t.scale.data_ptr() == s1.data_ptr()) == (not blocked and n % 64 == 0)
    for dtype in (torch.bfloat16, torch.float32):
        assert_bitwise(t.dequantize(dtype), swiglu_ops.mx_dequantize(y1, s1, dtype=dtype))


def test_rowwise_backward_outputs():
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(M, 128, generator=g), torch.randn(M, 64, generator=g)
    y1, s1, _, _ = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, ENDS)
    t = ti.rowwise_mxtensor(y1, s1, orig_dtype=torch.float32)
    assert shares(t, y1) and t.shape == (M, 128)
    assert_bitwise(t.dequantize(), swiglu_ops.mx_dequantize(y1, s1))


@pytest.mark.parametrize("blocked", [False, True], ids=["plain", "blocked"])
@pytest.mark.parametrize("dst", FP8, ids=lambda d: str(d).split(".")[-1])
def test_tokenwise_whole_shares_storage_and_dequantizes_bitwise(dst, blocked):
    _, _, y2t, s2 = forward(96, dst, transpose_y2=True)
    _, _, y2, s2_cann = forward(96, dst)
    want = swiglu_ops.mx_dequantize(y2, s2_cann, axis=-2, group_index=ENDS, dtype=torch.bfloat16)
    t = ti.tokenwise_mxtensor(y2t, s2, ENDS, blocked=blocked)
    assert t.shape == (96, M) and shares(t, y2t)
    assert_bitwise(t.dequantize(), want.t())


@pytest.mark.parametrize("blocked", [False, True], ids=["plain", "blocked"])
@pytest.mark.parametrize("dst", FP8, ids=lambda d: str(d).split(".")[-1])
def test_tokenwise_per_group(dst, blocked):
    _, _, y2, s2 = forward(64, dst)
    want = swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=ENDS)
    _, _, y2t, s2t = forward(64, dst, transpose_y2=True)
    # Several non-empty groups: a group's columns of y2t are strided; torchao cannot read them in place.
    with pytest.raises(ValueError, match="copy_data=True"):
        ti.tokenwise_mxtensors(y2t, s2t, ENDS)
    with pytest.raises(ValueError, match="strided axis"):
        ti.tokenwise_mxtensors(y2, s2, ENDS, transposed=False)
    for data, scale, transposed in ((y2t, s2t, True), (y2, s2, False)):
        ts = ti.tokenwise_mxtensors(data, scale, ENDS, transposed=transposed, copy_data=True, blocked=blocked)
        assert len(ts) == len(BOUNDS)
        for t, (s, e) in zip(ts, BOUNDS, strict=True):
            assert t.shape == (64, e - s)
            assert_bitwise(t.dequantize(torch.float32), want[s:e].t())
    # One group holding every row (the others empty): each group's view is contiguous, shared, no copy.
    ends = torch.tensor([0, M, M])
    _, _, y2t, s2t = forward(64, dst, transpose_y2=True, ends=ends)
    _, _, y2, s2 = forward(64, dst, ends=ends)
    want = swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=ends)
    ts = ti.tokenwise_mxtensors(y2t, s2t, ends, blocked=blocked)
    assert [t.shape[1] for t in ts] == [0, M, 0] and shares(ts[1], y2t)
    assert_bitwise(ts[1].dequantize(torch.float32), want.t())
    assert ts[0].dequantize().numel() == 0


def test_emulated_mx_matmul_on_cpu():
    """The docs' example: torchao's emulated MX mm (KernelPreference.EMULATED, CPU) on the wrapped outputs:
    the down projection ``y1 @ w2`` (FP8 and FP4) and the wgrad ``y2t @ dy`` (all groups, and per group)."""
    kp = ti.KernelPreference.EMULATED
    g = torch.Generator().manual_seed(3)
    w2 = torch.randn(64, 48, generator=g, dtype=torch.bfloat16)
    for dst in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2):
        y1, s1, _, _ = forward(64, dst)
        a = ti.rowwise_mxtensor(y1, s1)
        b = MXTensor.to_mx(w2.t().contiguous(), dst, kernel_preference=kp).t()  # [64, 48], blocks along K
        out = torch.mm(a, b)
        assert type(out) is torch.Tensor and out.dtype == torch.bfloat16 and out.shape == (M, 48)
        ref = swiglu_ops.mx_dequantize(y1, s1, dtype=torch.bfloat16) @ b.dequantize()
        assert torch.equal(out, ref)
    dy = torch.randn(M, 48, generator=g, dtype=torch.bfloat16)
    _, _, y2t, s2 = forward(64, torch.float8_e4m3fn, transpose_y2=True)
    b = MXTensor.to_mx(dy.t().contiguous(), torch.float8_e4m3fn, kernel_preference=kp).t()  # [M, 48]
    a = ti.tokenwise_mxtensor(y2t, s2, ENDS)
    dw = torch.mm(a, b)
    assert dw.shape == (64, 48) and torch.equal(dw, a.dequantize() @ b.dequantize())
    for t, (s, e) in zip(ti.tokenwise_mxtensors(y2t, s2, ENDS, copy_data=True), BOUNDS, strict=True):
        if e > s:
            bg = MXTensor.to_mx(dy[s:e].t().contiguous(), torch.float8_e4m3fn, kernel_preference=kp).t()
            assert torch.equal(torch.mm(t, bg), t.dequantize() @ bg.dequantize())


def test_what_cannot_be_wrapped():
    y1, s1, y2, s2 = forward(48, torch.float8_e4m3fn)  # N = 48: a partial last block
    with pytest.raises(ValueError, match="not a multiple of 32"):
        ti.rowwise_mxtensor(y1, s1)
    y1, s1, y2, s2 = forward(64, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="mxscale1 must have shape"):
        ti.rowwise_mxtensor(y1, s1[:-1])
    with pytest.raises(ValueError, match="E1M2"):
        ti.rowwise_mxtensor(y1.view(torch.uint8), s1)
    with pytest.raises(ValueError, match="write it with transpose_y2=True"):  # a [M, N] y2
        ti.tokenwise_mxtensor(y2, s2, ENDS)
    _, _, y2f, s2f = forward(64, torch.float4_e2m1fn_x2)
    with pytest.raises(ValueError, match="FP4 y2"):
        ti.tokenwise_mxtensors(y2f, s2f, ENDS, transposed=False, copy_data=True)
    x = torch.randn(M, 128, dtype=torch.bfloat16)
    ends = torch.tensor([40, M])  # a group of 40 rows: a partial token block
    _, _, y2t, s2t = swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, transpose_y2=True)
    for wrap in (ti.tokenwise_mxtensor, lambda *a: ti.tokenwise_mxtensors(*a, copy_data=True)):
        with pytest.raises(ValueError, match="group 0 has 40 rows"):
            wrap(y2t, s2t, ends)
    with pytest.raises(ValueError, match="counts"):  # counts passed for ends: the operators' message
        ti.tokenwise_mxtensor(y2t, s2t, torch.tensor([96, 96]))


def test_options_of_the_wrong_type_name_themselves():
    """Flags are bools and kernel_preference a KernelPreference: a string flag used to be taken for its truth
    (copy_data="no" copied, blocked="no" swizzled and became the MXTensor's is_swizzled_scales) and a bad
    kernel_preference failed only inside torchao's matmul."""
    y1, s1, _, _ = forward(64, torch.float8_e4m3fn)
    _, _, y2t, s2t = forward(64, torch.float8_e4m3fn, transpose_y2=True)
    calls = {
        "blocked": lambda: ti.rowwise_mxtensor(y1, s1, blocked="no"),
        "kernel_preference": lambda: ti.rowwise_mxtensor(y1, s1, kernel_preference="foo"),
        "copy_data": lambda: ti.tokenwise_mxtensors(y2t, s2t, ENDS, copy_data="no"),
        "transposed": lambda: ti.tokenwise_mxtensors(y2t, s2t, ENDS, transposed=None),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"{name} must be"):
            call()
    with pytest.raises(TypeError, match="blocked must be"):
        ti.tokenwise_mxtensor(y2t, s2t, ENDS, blocked=1)


@pytest.mark.parametrize("dst", FP8, ids=lambda d: str(d).split(".")[-1])
def test_square_y2_is_checked_against_its_scales(dst):
    """M == N: the shapes cannot tell CANN's [M, N] y2 from the transposed one, so the data is checked
    against the scales. The right layout passes (backward and forward, both scale algorithms, groups, a
    routing weight, tiny and NaN blocks); the wrong one in either direction is a ValueError (it used to give
    an MXTensor that dequantised wrong)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(M, 2 * M, generator=gen, dtype=torch.bfloat16) * 4
    x[:32, :8] *= 2.0**-100  # blocks whose values are tiny (scale code at or near the smallest)
    x[40, 3] = float("nan")  # a NaN block (scale code 255)
    dy = torch.randn(M, M, generator=gen, dtype=torch.bfloat16)
    w = torch.rand(M, generator=gen) * 2 - 1
    for backward, scale_alg, weight in ((False, None, None), (False, None, w), (True, 0, None), (True, 1, w)):
        kw = dict(dst_dtype=dst, weight=weight)
        if backward:  # x [M, M] and dy [M, M/2]: y2 [M, M]
            outs = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
                x[:, :M], dy[:, : M // 2], ENDS, scale_alg=scale_alg, **kw
            )
            t_outs = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
                x[:, :M], dy[:, : M // 2], ENDS, scale_alg=scale_alg, transpose_y2=True, **kw
            )
        else:
            outs = swiglu_ops.swiglu_mx_quant_dual_axis(x, ENDS, **kw)
            t_outs = swiglu_ops.swiglu_mx_quant_dual_axis(x, ENDS, transpose_y2=True, **kw)
        y2, s2, y2t, s2t = outs[2], outs[3], t_outs[2], t_outs[3]
        assert y2.shape == y2t.shape == (M, M)
        assert_bitwise(ti.tokenwise_mxtensor(y2t, s2t, ENDS).dequantize(torch.float32).t(),
                       swiglu_ops.mx_dequantize(y2, s2, axis=-2, group_index=ENDS))  # fmt: skip
        ti.tokenwise_mxtensors(y2t, s2t, ENDS, copy_data=True)
        ti.tokenwise_mxtensors(y2, s2, ENDS, transposed=False, copy_data=True)
        with pytest.raises(ValueError, match="y2 does not fit mxscale2"):
            ti.tokenwise_mxtensor(y2, s2, ENDS)
        with pytest.raises(ValueError, match="y2 does not fit mxscale2"):
            ti.tokenwise_mxtensors(y2t, s2t, ENDS, transposed=False, copy_data=True)


def test_lazy_attribute_and_import_swiglu_ops_does_not_import_torchao():
    import swiglu_ops.integrations as integrations

    assert integrations.torchao is ti and "torchao" not in integrations.__all__
    assert_imported_only_on_access("torchao", "torchao")
