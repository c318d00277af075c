"""The Triton backend against the reference, elementwise, on small awkward shapes.

Without a GPU the kernels run on CPU tensors under Triton's interpreter. Triton decides interpreter or
compiled mode when ``@triton.jit`` runs, i.e. when ``swiglu_ops.triton`` is first imported; tests/conftest.py
sets ``TRITON_INTERPRET=1`` before anything imports it (and so does this module, for runs without conftest).
"""

from __future__ import annotations

import functools
import os
import sys

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA and "swiglu_ops.backends.triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import swiglu_ops  # noqa: E402
from swiglu_ops.backends import reference as reference_backend  # noqa: E402
from swiglu_ops.backends import triton as triton_backend  # noqa: E402
from swiglu_ops.backends.reference import swiglu_bwd_mx_quant as reference_bwd_mx_quant  # noqa: E402
from swiglu_ops.backends.triton._kernels import ROUND_MODES, _fp4_code, _fp8_code  # noqa: E402
from swiglu_ops.numerics import mx  # noqa: E402
from swiglu_ops.numerics.glu import SWIGLU  # noqa: E402
from swiglu_ops.ops import registry  # noqa: E402

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
IN_PROCESS, WHY_NOT = triton_backend.is_available(DEVICE)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def test_backend_is_available():
    """Every other test here needs the backend: say clearly why when it is not (e.g. triton was imported
    in compiled mode before TRITON_INTERPRET=1 was set)."""
    assert IN_PROCESS, f"triton backend unavailable on {DEVICE}: {WHY_NOT}"


def _equal_codes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got, want = got.view(torch.uint8), want.view(torch.uint8)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} of {want.numel()} codes differ, first at {bad[:5].tolist()}"
    )


def _ulp_distance(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Units in the last place between same-dtype floats (0 where both are NaN)."""
    bits = {
        torch.float32: (torch.int32, 31),
        torch.float16: (torch.int16, 15),
        torch.bfloat16: (torch.int16, 15),
    }
    ints, top = bits[want.dtype]

    def ordered(t):
        b = t.view(ints).to(torch.int64)
        mag = b & ((1 << top) - 1)
        return torch.where(b < 0, -mag, mag)

    dist = (ordered(got) - ordered(want)).abs()
    return torch.where(got.isnan() & want.isnan(), 0, torch.where(got.isnan() | want.isnan(), 1 << 40, dist))


def _close_values(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Contract section 3 for a backend with its own exp. fp32: within 4 ulp, except where silu'(g) =
    s + f - f*s cancels (g near -1.28) and amplifies any exp difference; there within 1e-5 relative of
    the operands' scale. bf16/fp16: identical except rare near-tie positions one unit apart (1 in 10,000,
    at least 2 allowed on these small shapes)."""
    dist = _ulp_distance(got, want)
    if want.dtype == torch.float32:
        far = dist > 4
        assert int(far.sum()) <= max(2, want.numel() // 100), f"{what}: {int(far.sum())} values > 4 ulp apart"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, msg=what)
        return
    assert dist.max() <= 1, f"{what}: {int(dist.max())} units apart at {(dist > 1).nonzero()[:5].tolist()}"
    allowed = max(2, want.numel() // 10_000)
    assert int((dist > 0).sum()) <= allowed, f"{what}: {int((dist > 0).sum())} near-tie differences"


def _randn(*shape, dtype, scale=1.0, gen):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


# ------------------------------------------------------------------------- swiglu_backward_mx_quant


def _check_mx(x, y_grad, group_index=None, **kw):
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, y_grad, group_index, backend="triton", **kw)
    want = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x.cpu(), y_grad.cpu(), None if group_index is None else group_index.cpu(), backend="reference", **kw
    )
    for name, g, w in zip(("y1", "mxscale1", "y2", "mxscale2"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        _equal_codes(g.cpu(), w, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "c", "groups"),
    [
        (1, 64, None),
        (33, 192, None),
        (100, 128, [10, 10, 70, 100]),
        (130, 64, [64, 128, 130]),
        (70, 320, [0, 5, 5, 70]),
    ],
)
def test_mx_quant_matches_reference(dtype, m, c, groups):
    gen = torch.Generator().manual_seed(m * c)
    x = _randn(m, c, dtype=dtype, scale=3.0, gen=gen)
    y_grad = _randn(m, c // 2, dtype=dtype, gen=gen)
    gi = None if groups is None else torch.tensor(groups, device=DEVICE)
    _check_mx(x, y_grad, gi)


@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("activate_left", [True, False])
def test_mx_quant_options(dst_dtype, scale_alg, activate_left):
    gen = torch.Generator().manual_seed(7)
    x = _randn(77, 192, dtype=torch.bfloat16, scale=4.0, gen=gen)
    y_grad = _randn(77, 96, dtype=torch.bfloat16, scale=100.0, gen=gen)
    gi = torch.tensor([3, 40, 77], dtype=torch.int32, device=DEVICE)
    _check_mx(x, y_grad, gi, dst_dtype=dst_dtype, scale_alg=scale_alg, activate_left=activate_left)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mx_quant_special_values(dtype):
    """NaN/inf blocks, signed zeros, subnormal gradients, fp16 overflow to inf (then a NaN/inf block)."""
    gen = torch.Generator().manual_seed(3)
    x = _randn(65, 128, dtype=dtype, scale=2.0, gen=gen).cpu()
    y_grad = _randn(65, 64, dtype=dtype, gen=gen).cpu()
    x[0, 0] = torch.nan
    x[5, 70] = torch.inf
    x[9, 3] = -torch.inf
    y_grad[40:, 32:] = -0.0
    y_grad[20, :] = 1e-38  # subnormal (bf16/fp32) or zero (fp16) gradients
    x[30, 64:] = 60000.0 if dtype == torch.float16 else 3e38  # fp16: |grad| > 65504 -> inf
    y_grad[30, :] = 8.0
    for scale_alg in (0, 1):
        _check_mx(x.to(DEVICE), y_grad.to(DEVICE), torch.tensor([20, 65], device=DEVICE), scale_alg=scale_alg)
        _check_mx(x.to(DEVICE), y_grad.to(DEVICE), scale_alg=scale_alg, dst_dtype=torch.float8_e5m2)


def _mx_extreme_case(dtype, gen, n=320):
    """Blocks that exercise every branch of the FP8 encode: NaN and inf blocks, subnormal results of the
    scaled values (tiny elements next to a large one), exact ties, values that saturate under the floor
    rule (amax mantissa above the format's max), signed zeros and fp32-subnormal gradients. 70 rows (ragged
    32-row blocks); ``n`` (a multiple of 4, at least 32) pairs per row."""
    m = 70
    x = _randn(m, 2 * n, dtype=dtype, scale=3.0, gen=gen).cpu()
    dy = _randn(m, n, dtype=dtype, gen=gen).cpu()
    x[0, 0] = torch.nan
    x[33, n - 10] = torch.inf
    x[40, 5] = -torch.inf
    dy[2, :] = 1e-38 if dtype != torch.float16 else 1e-7  # subnormal gradients (scaled up by 2**127)
    # One row mixing tiny and ordinary magnitudes (FP8 subnormals after scaling). A constant gate keeps exp
    # (NumPy's here, torch's in the reference) away from the near-tie 16-bit roundings the contract allows.
    x[3, :] = -1.0
    dy[3, ::2] = 6e-5
    dy[3, 1::2] = 1.0
    dy[4, :] = 0.0
    dy[5, :] = -0.0
    x[6, :] = 10.0  # silu'(10) * 10 * dy: large, uniform magnitudes
    dy[6, :] = torch.linspace(-8.0, 8.0, n)
    # amax = 1.99 * 2**k: the floor rule keeps the exponent, so 1.99 * 2**8 > 448 saturates in E4M3.
    dy[7, :] = 1.99
    dy[8, :] = torch.tensor([1.0, 1.0625, 1.125, 1.1875]).repeat(n // 4)  # ties after scaling
    return x.to(DEVICE), dy.to(DEVICE)


_MX_BWD_DEFAULT_TILE = triton_backend.MX_BWD_BLOCK_N
# (tile, dtype) -> the (scale rule, format) pair it runs, as an index into [(0, E4M3), (0, E5M2), (1, E4M3),
# (1, E5M2)]: every pair on one variant besides the default
_TILE_VARIANT_PAIR = {(32, torch.bfloat16): 0, (128, torch.bfloat16): 1, (256, torch.bfloat16): 2,
                      (64, torch.float16): 3, (64, torch.float32): 0}  # fmt: skip


@pytest.mark.slow(seconds=15)
@pytest.mark.parametrize(
    ("block_n", "dtype"),
    [(b, torch.bfloat16) for b in (32, 64, 128, 256)] + [(64, torch.float16), (64, torch.float32)],
)
def test_mx_quant_tile_variants_extreme_values(monkeypatch, block_n, dtype):
    """Every MX_BWD_BLOCK_N the benchmark tunes over (bf16; fp16 and fp32 at the default width: the tile
    code does not depend on the dtype beyond the vector width, which every other MX test covers), with
    NaN/inf/subnormal/saturating/tie inputs, byte-exact against the reference (ragged and empty groups).
    The default tile on bf16 runs both scale rules with both FP8 formats; the other variants one
    (rule, format) pair each, so that every pair also runs off the default (tile, dtype): the format and
    the rule are constexprs of the quantizer, independent of the tile and of the input dtype."""
    monkeypatch.setattr(triton_backend, "MX_BWD_BLOCK_N", block_n)
    x, dy = _mx_extreme_case(dtype, torch.Generator().manual_seed(block_n))
    gi = torch.tensor([0, 33, 33, 70], device=DEVICE)
    pairs = [(s, f) for s in (0, 1) for f in (torch.float8_e4m3fn, torch.float8_e5m2)]
    if (block_n, dtype) != (_MX_BWD_DEFAULT_TILE, torch.bfloat16):
        pairs = [pairs[_TILE_VARIANT_PAIR[block_n, dtype]]]
    for scale_alg, fmt in pairs:
        _check_mx(x, dy, gi, scale_alg=scale_alg, dst_dtype=fmt)
    _check_mx(x, dy, activate_left=False)


def test_mx_quant_unaligned_tensors_use_the_narrow_tile():
    """Inputs at an address that is not 16-byte aligned: the launcher narrows the tile to
    half the width (mx_block_n: the wide tile spills without vector loads); the result is unchanged."""
    gen = torch.Generator().manual_seed(13)
    m, c = 45, 256
    x = _randn(m, c, dtype=torch.bfloat16, scale=3.0, gen=gen)
    dy = _randn(m, c // 2, dtype=torch.bfloat16, gen=gen)
    x_odd = torch.empty(m * c + 1, dtype=x.dtype, device=DEVICE)[1:].view(m, c)
    x_odd.copy_(x)
    assert x_odd.data_ptr() % 16 != 0
    _check_mx(x_odd, dy, torch.tensor([20, 45], device=DEVICE))


def test_mx_quant_batched():
    gen = torch.Generator().manual_seed(11)
    x = _randn(2, 3, 40, 128, dtype=torch.bfloat16, gen=gen)
    y_grad = _randn(2, 3, 40, 64, dtype=torch.bfloat16, gen=gen)
    _check_mx(x, y_grad)


def test_mx_quant_golden_case():
    """Operator document 5.1: ones[4, 64] bf16, group_index [2, 4]."""
    x = torch.ones(4, 64, dtype=torch.bfloat16, device=DEVICE)
    y1, s1, y2, s2 = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        x,
        torch.ones(4, 32, dtype=torch.bfloat16, device=DEVICE),
        torch.tensor([2, 4], device=DEVICE),
        backend="triton",
    )
    row = torch.tensor([0x77] * 32 + [0x7C] * 32, dtype=torch.uint8)
    assert torch.equal(y1.view(torch.uint8).cpu(), row.expand(4, 64))
    assert torch.equal(y2.view(torch.uint8).cpu(), row.expand(4, 64))
    assert torch.equal(
        s1.view(torch.uint8).cpu(), torch.tensor([[119, 118]], dtype=torch.uint8).expand(4, 1, 2)
    )
    slots = torch.tensor([[119, 0]] * 32 + [[118, 0]] * 32, dtype=torch.uint8)
    assert torch.equal(s2.view(torch.uint8).cpu(), slots.expand(2, 64, 2))


@pytest.mark.parametrize("ends", [[-5, 3, 2, 1000], [0, 0], [7, 3], [1 << 40, 2]])
def test_mx_quant_clamps_invalid_device_group_ends(ends):
    """The device path never validates the ends: calling the backend directly with out-of-range values must
    stay in bounds (clamped like mx.clamp_group_ends), write zeros past the last clamped end, and leave the
    zero-filled mxscale2 rows that no group maps to untouched."""
    m, c = 40, 64
    gen = torch.Generator().manual_seed(5)
    x = _randn(1, m, c, dtype=torch.bfloat16, scale=2.0, gen=gen)
    dy = _randn(1, m, c // 2, dtype=torch.bfloat16, gen=gen)
    ends_t = torch.tensor(ends, dtype=torch.int64, device=DEVICE)
    rows = mx.mxscale2_rows(m, len(ends))
    # Guard bytes around every output catch writes out of bounds.
    pad = 4096
    bufs = [
        torch.full((pad + n + pad,), 0xA5, dtype=torch.uint8, device=DEVICE) for n in (m * c, m * c // 32)
    ]
    bufs += [torch.full((pad + m * c + pad,), 0xA5, dtype=torch.uint8, device=DEVICE)]
    bufs += [torch.full((pad + rows * c * 2 + pad,), 0xA5, dtype=torch.uint8, device=DEVICE)]
    bufs[3][pad:-pad].zero_()
    views = [
        b[pad:-pad].view(shape)
        for b, shape in zip(bufs, [(1, m, c), (1, m, c // 32), (1, m, c), (1, rows, c, 2)], strict=True)
    ]
    triton_backend.swiglu_bwd_mx_quant(x, dy, ends_t, SWIGLU, 1, mx.E4M3FN, *views)
    want = [torch.zeros(v.shape, dtype=torch.uint8) for v in views]
    want[3].zero_()
    reference_bwd_mx_quant(x.cpu(), dy.cpu(), ends_t.cpu(), SWIGLU, 1, mx.E4M3FN, *want)
    for name, v, w in zip(("y1", "s1", "y2", "s2"), views, want, strict=True):
        _equal_codes(v.cpu(), w, name)
    covered = mx.clamp_group_ends(ends_t.cpu(), m)[-1][1]
    assert (
        not views[0][:, covered:].any()
        and not views[2][:, covered:].any()
        and not views[1][:, covered:].any()
    )
    for b in bufs:
        assert (b[:pad] == 0xA5).all() and (b[-pad:] == 0xA5).all(), "write out of bounds"


# ------------------------------------------------------------------- swiglu_mx_quant_dual_axis (forward)


def _mx_forward(x, gi=None, backend="triton", **kw):
    out = swiglu_ops.swiglu_mx_quant_dual_axis(x, gi, backend=backend, **kw)
    return [t.view(torch.uint8).cpu() for t in out]


def _mx_forward_case(n, dtype, gen, m=70):
    """Random activations plus NaN / inf / negative-zero / tiny entries (FP4 ``floor`` underflow)."""
    x = _randn(m, 2 * n, dtype=dtype, scale=3.0, gen=gen).cpu()
    x[1, 0] = torch.nan
    x[m - 2, n - 1] = torch.inf
    x[5, n:] = -0.0
    x[9, : n // 2] = 1e-30 if dtype != torch.float16 else 1e-4
    return x.to(DEVICE)


FWD_FORMATS = [
    {},
    {"dst_dtype": torch.float8_e5m2, "scale_alg": 0},
    {"dst_dtype": torch.float4_e2m1fn_x2, "round_mode": "floor"},
    {"dst_dtype": swiglu_ops.float4_e1m2fn_x2, "round_mode": "round"},
]
FWD_GLU = [{}, {"interleaved": True, "limit": 7.0, "alpha": 1.702, "bias": 1.0}, {"activate_left": False}]
# Every format and every GLU variant at least once (the full product is the reference tests' job).
FWD_COMBOS = [{**FWD_FORMATS[i], **FWD_GLU[j]} for i, j in ((0, 0), (1, 2), (2, 1), (3, 0), (2, 2))]


@pytest.mark.parametrize("block_n", [32, 128])
@pytest.mark.parametrize("n", [20, 100])
def test_mx_forward_tile_variants(monkeypatch, block_n, n):
    """The tile widths the benchmark tunes over give the default tile's bytes (with an odd number of
    32-column blocks the grid must still cover the mxscale1 pad slot), for every format and GLU variant,
    with ragged and empty groups."""
    gen = torch.Generator().manual_seed(block_n + n)
    x = _mx_forward_case(n, torch.bfloat16, gen, m=40)
    gi = torch.tensor([0, 13, 13, 40], device=DEVICE)
    default = [_mx_forward(x, gi, **kw) for kw in FWD_COMBOS]
    monkeypatch.setattr(triton_backend, "MX_BLOCK_N", block_n)
    for kw, want in zip(FWD_COMBOS, default, strict=True):
        for name, g, w in zip(
            ("y1", "mxscale1", "y2", "mxscale2"), _mx_forward(x, gi, **kw), want, strict=True
        ):
            _equal_codes(g, w, f"{name} {kw}")


#: (GLU parameters, forward (b_pad, select), backward select) on bf16: the padding's decision
#: (swiglu_ops.triton.padding). GPT-OSS pads B with -bias and selects nothing; an infinite bias makes NaN
#: (0 * inf) on the padding, a negative one a -0 gradient, a bias that bf16 rounds or beyond the limit a
#: forward padding that clip(-bias) + bias does not cancel.
PADDING_CASES = [
    ({"interleaved": True, "limit": 7.0, "alpha": 1.702, "bias": 1.0}, (-1.0, False), False),
    ({"limit": 7.0, "alpha": 1.702, "bias": float("inf")}, (0.0, True), True),
    ({"limit": 7.0, "alpha": 1.702, "bias": -1.0}, (1.0, False), True),
    ({"limit": 7.0, "alpha": 1.702, "bias": 0.1}, (-0.10009765625, True), False),
    ({"limit": 7.0, "alpha": 1.702, "bias": 10.0}, (-10.0, True), False),
]


@pytest.mark.parametrize(("glu", "forward", "backward"), PADDING_CASES)
def test_mx_padding_select_only_where_the_padding_is_not_zero(glu, forward, backward):
    """Both MX kernels on the clipped GLU with every padding decision: tiles padded along both axes
    (forward: N = 40 pairs, a partial 32-column block; both: rows past a group's end inside its last
    32-row block; the backward on an unaligned x, where it loads the padding; the forward also with a
    tail past the last group end, zeros) give the reference's outputs, so the padding stays +0.0 with the
    select and without it."""
    from _fwd_oracles import assert_forward_matches

    from swiglu_ops.numerics.glu import GluParams

    params = GluParams(clipped=True, **glu)
    assert triton_backend.padding(params, torch.bfloat16, False) == forward
    assert triton_backend.padding(params, torch.bfloat16, True) == (0.0, backward)
    assert triton_backend.padding(GluParams(), torch.bfloat16, False) == (0.0, False)
    mode1 = GluParams(clipped=True, limit=7.0, bias=float("inf"), clamp_mode=1)  # bias unused: +0 padding
    assert triton_backend.padding(mode1, torch.bfloat16, False) == (0.0, False)
    gen = torch.Generator().manual_seed(41)
    x = _randn(70, 80, dtype=torch.bfloat16, scale=0.5, gen=gen)  # small: a padding value would show
    gi = torch.tensor([0, 33, 33, 70], device=DEVICE)
    want = swiglu_ops.swiglu_mx_quant_dual_axis(x.cpu(), gi.cpu(), backend="reference", **glu)
    got = swiglu_ops.swiglu_mx_quant_dual_axis(x, gi, backend="triton", **glu)
    assert_forward_matches([t.cpu() for t in got], want, "triton", torch.float8_e4m3fn)
    tail = torch.tensor([0, 33, 33, 60])  # rows 60-69: a tail, its 32-row block past the last group
    args = (params, 1, mx.E4M3FN, "rint")
    got = _mx_backend_outputs(triton_backend, x[None], None, tail.to(DEVICE), *args)
    want = _mx_backend_outputs(reference_backend, x[None].cpu(), None, tail, *args)
    assert_forward_matches(got, want, "triton", torch.float8_e4m3fn)
    x = _randn(70, 128, dtype=torch.bfloat16, scale=3.0, gen=gen)  # backward: 2N a multiple of 64
    dy = _randn(70, 64, dtype=torch.bfloat16, gen=gen)
    _check_mx(x, dy, gi, **glu)  # plain loads (no padding)
    x_odd = torch.empty(x.numel() + 1, dtype=x.dtype, device=DEVICE)[1:].view(x.shape)
    x_odd.copy_(x)
    _check_mx(x_odd, dy, gi, **glu)  # unaligned: masked loads of the padding


def _mx_backend_outputs(impl, x, dy, ends, glu, scale_alg, fmt, round_mode):
    """Both MX operators of ``impl`` (a backend module) on ``[1, M, 2N]`` inputs with the device path's
    group ends (unvalidated: a tail past the last end is allowed), into fresh buffers: 8 uint8 tensors
    (the forward in ``fmt``, the backward in E4M3; ``dy`` None: the forward's 4)."""
    m, n = x.shape[-2], x.shape[-1] // 2
    rows = mx.mxscale2_rows(m, ends.numel())

    def buffers(c, width):
        shapes = [(1, m, width), (1, m, mx.mxscale1_slots(c)), (1, m, width), (1, rows, c, 2)]
        return [torch.zeros(sh, dtype=torch.uint8, device=x.device) for sh in shapes]

    fwd, bwd = buffers(n, n // 2 if fmt.packed else n), buffers(2 * n, 2 * n)
    impl.swiglu_mx_quant(x, ends, glu, scale_alg, fmt, round_mode, *fwd)
    if dy is None:
        return [t.cpu() for t in fwd]
    impl.swiglu_bwd_mx_quant(x, dy, ends, glu, scale_alg, mx.E4M3FN, *bwd)
    return [t.cpu() for t in fwd + bwd]


@pytest.mark.parametrize(
    ("dtype", "glu", "scale_alg", "fmt", "round_mode"),
    [
        (torch.bfloat16, {}, 1, mx.E4M3FN, "rint"),
        (torch.bfloat16, FWD_GLU[1], 0, mx.E4M3FN, "rint"),
        (torch.float16, {}, 1, mx.E4M3FN, "rint"),
        (torch.float32, FWD_GLU[1], 0, mx.E2M1, "floor"),
    ],
    ids=["bf16-plain-rceil", "bf16-gpt_oss-floor_rule", "fp16-plain-rceil", "fp32-gpt_oss-e2m1"],
)
def test_mx_plain_loads_read_copies_that_never_reach_an_output(
    dtype, glu, scale_alg, fmt, round_mode, monkeypatch
):
    """Where N is a multiple of 32 and the tensors are aligned, the MX kernels load without predicates:
    rows past a block's last row and blocks past N read copies of the block's own values. With groups that
    end and start inside 32-row blocks, an empty group, a tail past the last group end (stored as zeros)
    and an odd block count (the forward's mxscale1 pad slot), and with NaN / inf / the largest finite
    values in every row that a padding would have replaced (each group's first row, the tail), both
    kernels give the reference's outputs (the forward within the near-tie rule of its exp), and the same
    bytes as the masked loads of the padding."""
    from _fwd_oracles import assert_forward_matches

    from swiglu_ops.numerics.glu import GluParams

    m, n = 75, 96  # 3 blocks of 32 pairs: the forward's mxscale1 has a pad slot
    assert triton_backend.plain_loads(n, True)
    assert not triton_backend.plain_loads(n + 16, True) and not triton_backend.plain_loads(n, False)
    params = GluParams(clipped=bool(glu), **{k: v for k, v in glu.items()})
    gen = torch.Generator().manual_seed(43)
    ends = torch.tensor([0, 33, 33, 60], device=DEVICE)  # empty group, ends inside blocks, tail [60, 75)
    x = _randn(1, m, 2 * n, dtype=dtype, scale=2.0, gen=gen)
    dy = _randn(1, m, n, dtype=dtype, gen=gen)
    for r in (33, 60, 61, 74):
        x[0, r, ::3], x[0, r, 1::5], x[0, r, 2::7] = float("nan"), float("inf"), -torch.finfo(dtype).max
        dy[0, r, ::4] = float("nan")
    args = (params, scale_alg, fmt, round_mode)
    plain = _mx_backend_outputs(triton_backend, x, dy, ends, *args)
    want = _mx_backend_outputs(reference_backend, x.cpu(), dy.cpu(), ends.cpu(), *args)
    assert_forward_matches(plain[:4], want[:4], "triton", fmt.torch_dtype)
    for name, got, w in zip(("y1", "s1", "y2", "s2"), plain[4:], want[4:], strict=True):
        _equal_codes(got, w, f"backward {name}")
    monkeypatch.setattr(triton_backend, "plain_loads", lambda n, aligned: False)
    masked = _mx_backend_outputs(triton_backend, x, dy, ends, *args)
    for name, got, w in zip(("y1", "s1", "y2", "s2") * 2, plain, masked, strict=True):
        _equal_codes(got, w, f"{name}: plain against masked loads")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mx_forward_unaligned_tensors(dtype):
    """x at an address that is not 16-byte aligned: narrow tile, no register budget; same outputs as an
    aligned copy, and as the reference within the contract (near ties only)."""
    from _fwd_oracles import assert_forward_matches

    gen = torch.Generator().manual_seed(17)
    n = 66
    x = _mx_forward_case(n, dtype, gen)
    x_odd = torch.empty(x.numel() + 1, dtype=dtype, device=DEVICE)[1:].view(x.shape)
    x_odd.copy_(x)
    assert x_odd.data_ptr() % 16 != 0
    for kw in (FWD_FORMATS[0], FWD_FORMATS[2], {**FWD_FORMATS[0], **FWD_GLU[1]}):
        want = _mx_forward(x, **kw)
        for name, g, w in zip(
            ("y1", "mxscale1", "y2", "mxscale2"), _mx_forward(x_odd, **kw), want, strict=True
        ):
            _equal_codes(g, w, f"{name} {kw}")
        ref = swiglu_ops.swiglu_mx_quant_dual_axis(x.cpu(), backend="reference", **kw)
        got = swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="triton", **kw)
        assert_forward_matches(
            [t.cpu() for t in got], ref, "triton", kw.get("dst_dtype", torch.float8_e4m3fn)
        )


@pytest.mark.parametrize("glu", [{}, {"limit": 7.0, "alpha": 1.702, "bias": 1.0, "interleaved": True}],
                         ids=["plain", "gpt_oss"])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mx_routing_weight_matches_reference(dtype, glu):
    """The routing weight (spec 7.1: per row, negatives and zeros, an empty group) in both MX
    operators: the backward's four code tensors equal, its grad_weight within the contract's 1e-5 of the
    reference at the terms' size (dy * act16); the forward's outputs within the contract (E4M3 and E2M1).
    tests/test_mx_weight.py holds the CPU backends to the same; this file is what a GPU run executes."""
    from _compare import assert_relative
    from _fwd_oracles import assert_forward_matches

    from swiglu_ops.numerics.glu import forward_rounded
    from swiglu_ops.numerics.tolerances import norm_magnitude
    from swiglu_ops.ops.validate import mx_glu_params

    gen = torch.Generator().manual_seed(11)
    m, n = 77, 96
    x = _randn(m, 2 * n, dtype=dtype, scale=3.0, gen=gen)
    dy = _randn(m, n, dtype=dtype, gen=gen)
    w = torch.randn(m, generator=gen)
    w[::7] = 0.0
    ends = torch.tensor([10, 10, 64, m], device=DEVICE)  # an empty group
    args = (x, dy, ends)
    got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(*args, weight=w.to(DEVICE), **glu, backend="triton")
    want = swiglu_ops.swiglu_backward_mx_quant_dual_axis(
        *(t.cpu() for t in args), weight=w, **glu, backend="reference"
    )
    assert len(got) == len(want) == 5
    for name, g, r in zip(("y1", "mxscale1", "y2", "mxscale2"), got[:4], want[:4], strict=True):
        _equal_codes(g.cpu(), r, f"weighted backward {name}")
    params = mx_glu_params(
        True, glu.get("interleaved", False), glu.get("limit"), glu.get("alpha"), glu.get("bias")
    )
    act16 = forward_rounded(x.cpu(), params)
    magnitude = norm_magnitude(dy.cpu(), act16)  # spec 7.1
    assert_relative(got[4].cpu(), want[4], name="grad_weight", magnitude=magnitude)
    for dst in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2):
        kw = dict(weight=w, dst_dtype=dst, **glu)
        ref = swiglu_ops.swiglu_mx_quant_dual_axis(x.cpu(), ends.cpu(), backend="reference", **kw)
        kw["weight"] = w.to(DEVICE)
        out = swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, backend="triton", **kw)
        assert_forward_matches([t.cpu() for t in out], ref, "triton", dst)


def test_mx_backward_interleaved_unaligned_and_tiles(monkeypatch):
    """The GPT-OSS MX backward (interleaved, clipped) on unaligned tensors and every tuned tile width gives
    the default tile's bytes."""
    gen = torch.Generator().manual_seed(19)
    m, c = 45, 192
    x = _randn(m, c, dtype=torch.bfloat16, scale=4.0, gen=gen)
    dy = _randn(m, c // 2, dtype=torch.bfloat16, gen=gen)
    gi = torch.tensor([20, 45], device=DEVICE)
    kw = {"interleaved": True, "limit": 7.0, "alpha": 1.702, "bias": 1.0}
    want = [t.view(torch.uint8).cpu() for t in swiglu_ops.swiglu_backward_mx_quant_dual_axis(x, dy, gi, **kw)]
    x_odd = torch.empty(m * c + 1, dtype=x.dtype, device=DEVICE)[1:].view(m, c)
    x_odd.copy_(x)
    runs = [(None, x_odd)] + [(b, x) for b in (32, 128)]
    for block_n, xx in runs:
        if block_n is not None:
            monkeypatch.setattr(triton_backend, "MX_BWD_BLOCK_N", block_n)
        got = swiglu_ops.swiglu_backward_mx_quant_dual_axis(xx, dy, gi, backend="triton", **kw)
        for name, g, w in zip(("y1", "mxscale1", "y2", "mxscale2"), got, want, strict=True):
            _equal_codes(g.view(torch.uint8).cpu(), w, f"{name} block_n={block_n}")


# ------------------------------------------------------------------------ clipped_swiglu (+ its gradient)


@pytest.mark.parametrize(
    ("rows_per_tile", "block", "chunks", "max_grid_y"),
    [(1, 32, 1, 65535), (4, 64, 4, 65535), (4, 32, 2, 2), (2, 32, 3, 1)],
)
@pytest.mark.parametrize("interleaved", [True, False])
def test_clipped_tile_variants(monkeypatch, rows_per_tile, block, chunks, max_grid_y, interleaved):
    """Row tiles, pair chunks and chunks per program other than the default (rows cut into several chunks,
    a partial last one, programs whose last chunks are past the row; programs over several launches, as
    for rows of 2**26 pairs or more) give the default tile's bits, both directions and clamp modes, with
    masked rows and special values; the default tile matches the reference within the contract."""
    gen = torch.Generator().manual_seed(rows_per_tile * block)
    rows, half = 11, 70
    x = _randn(rows, 2 * half, dtype=torch.bfloat16, scale=4.0, gen=gen).cpu()
    x[0, :6] = torch.tensor([torch.nan, torch.inf, -torch.inf, 7.0, -7.0, 100.0])
    x = x.to(DEVICE)
    dy = _randn(rows, half, dtype=torch.bfloat16, gen=gen)
    gi = torch.tensor([3, 5], device=DEVICE)
    ops = torch.ops.swiglu_ops

    def run(backend):
        return [
            swiglu_ops.clipped_swiglu(x, gi, interleaved=interleaved, clamp_mode=0, backend=backend),
            swiglu_ops.clipped_swiglu(x, gi, interleaved=interleaved, clamp_mode=1, backend=backend),
            swiglu_ops.clipped_swiglu_grad(dy, x, gi, interleaved=interleaved, backend=backend),
            ops._clipped_swiglu_grad_mode1(
                dy, x, gi, dim=-1, limit=7.0, interleaved=interleaved, backend=backend
            ),
        ]

    default = run("triton")
    for got, want in zip(default, run("reference"), strict=True):
        _close_values(got.cpu(), want.cpu(), "default tile vs reference")
    monkeypatch.setattr(triton_backend, "CLIPPED_ROWS", rows_per_tile)
    monkeypatch.setattr(triton_backend, "CLIPPED_BLOCK", block)
    monkeypatch.setattr(triton_backend, "CLIPPED_CHUNKS", chunks)
    monkeypatch.setattr(triton_backend, "MAX_GRID_Y", max_grid_y)
    for got, want in zip(run("triton"), default, strict=True):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert not got[gi.sum() :].view(torch.int16).any()  # rows past the valid count: +0.0


# -------------------------------------------------------------------------------- swiglu_group_grad


def _check_group_grad(dy, x, weight=None, y_origin=None, group_index=None, clamp=0.0):
    got = swiglu_ops.swiglu_group_grad(dy, x, weight, y_origin, group_index, clamp, backend="triton")
    cpu = [None if t is None else t.cpu() for t in (dy, x, weight, y_origin, group_index)]
    want = swiglu_ops.swiglu_group_grad(*cpu, clamp, backend="reference")
    _close_values(got[0].cpu(), want[0], "grad_x")
    if weight is None:
        assert got[1] is None
    else:
        assert got[1].shape == want[1].shape
        # Not NumPy's pairwise order (docs/triton_backend.md): the contract allows 1e-5 relative.
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 17, 96, 300])
def test_group_grad_matches_reference(dtype, hidden):
    gen = torch.Generator().manual_seed(hidden)
    rows = 37
    dy = _randn(rows, hidden, dtype=dtype, gen=gen)
    x = _randn(rows, 2 * hidden, dtype=dtype, scale=4.0, gen=gen)
    _check_group_grad(dy, x)
    w = torch.rand(rows, 1, generator=gen).to(DEVICE) + 0.5
    yo = _randn(rows, hidden, dtype=dtype, gen=gen)
    _check_group_grad(dy, x, w, yo, torch.tensor([20, -3, 5], device=DEVICE), clamp=2.5)


@pytest.mark.parametrize("clamp", [0.0, 1.0, float("inf")])
def test_group_grad_special_values(clamp):
    """NaN/inf inputs, clamp boundaries, huge gates, masked rows, fp16 overflow."""
    gen = torch.Generator().manual_seed(1)
    dy = _randn(9, 40, dtype=torch.float16, gen=gen).cpu()
    x = _randn(9, 80, dtype=torch.float16, scale=4.0, gen=gen).cpu()
    x[0, :6] = torch.tensor([torch.nan, torch.inf, -torch.inf, 1.0, -1.0, 40000.0])
    x[1, 40:46] = torch.tensor([torch.nan, torch.inf, -torch.inf, 1.0, -1.0, -0.0])
    x[2, :] = 300.0
    dy[2, :] = 60000.0  # dg, du overflow fp16 -> inf
    dy[3, :] = -0.0
    for gi in (None, torch.tensor([6], dtype=torch.int32)):
        args = [t.to(DEVICE) for t in (dy, x)]
        _check_group_grad(*args, group_index=None if gi is None else gi.to(DEVICE), clamp=clamp)


def test_group_grad_rank3_int32_groups_and_weight_shape():
    gen = torch.Generator().manual_seed(2)
    dy = _randn(2, 5, 24, dtype=torch.bfloat16, gen=gen)
    x = _randn(2, 5, 48, dtype=torch.bfloat16, scale=3.0, gen=gen)
    w = torch.rand(10, generator=gen).to(DEVICE)
    yo = _randn(2, 5, 24, dtype=torch.bfloat16, gen=gen)
    _check_group_grad(dy, x, w, yo, torch.tensor([4, 3], dtype=torch.int32, device=DEVICE), clamp=1.5)


def test_group_grad_weight_sum_tolerance_is_tight():
    """grad_weight of wide rows with cancellation stays within the contract's 1e-5 of the NumPy order."""
    gen = torch.Generator().manual_seed(9)
    rows, hidden = 6, 3000
    dy = _randn(rows, hidden, dtype=torch.float32, gen=gen)
    x = _randn(rows, 2 * hidden, dtype=torch.float32, gen=gen)
    w = torch.ones(rows, device=DEVICE)
    yo = (dy.cpu() * (1 + torch.rand(rows, hidden, generator=gen))).to(DEVICE)  # all products positive
    _check_group_grad(dy, x, w, yo)


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize(("rows_per_tile", "block_h"), [(4, 256), (2, 512), (1, 1024), (8, 256)])
def test_group_grad_tile_variants(monkeypatch, prefetch, rows_per_tile, block_h):
    """Every tile / prefetch setting the benchmark tunes over, on a hidden size that leaves a partial last
    chunk (and a single-chunk one), with NaN/inf inputs, clamping, weight and a row mask."""
    monkeypatch.setattr(triton_backend, "GROUP_GRAD_PREFETCH", prefetch)
    monkeypatch.setattr(triton_backend, "GROUP_GRAD_ROWS", rows_per_tile)
    monkeypatch.setattr(triton_backend, "GROUP_GRAD_BLOCK_H", block_h)
    gen = torch.Generator().manual_seed(rows_per_tile * block_h)
    for hidden in (block_h + 37, 40):
        dy = _randn(11, hidden, dtype=torch.bfloat16, gen=gen).cpu()
        x = _randn(11, 2 * hidden, dtype=torch.bfloat16, scale=4.0, gen=gen).cpu()
        x[0, :4] = torch.tensor([torch.nan, torch.inf, -torch.inf, -90.0])  # -90: subnormal sigmoid
        x[1, hidden : hidden + 3] = torch.tensor([torch.nan, torch.inf, -torch.inf])
        w = torch.rand(11, generator=gen) + 0.5
        yo = _randn(11, hidden, dtype=torch.bfloat16, gen=gen).cpu()
        args = [t.to(DEVICE) for t in (dy, x, w, yo)]
        _check_group_grad(*args, torch.tensor([7], device=DEVICE), clamp=2.0)
        _check_group_grad(*args[:2])


def test_group_grad_is_deterministic():
    gen = torch.Generator().manual_seed(4)
    args = (
        _randn(33, 700, dtype=torch.bfloat16, gen=gen),
        _randn(33, 1400, dtype=torch.bfloat16, gen=gen),
        torch.rand(33, generator=gen).to(DEVICE),
        _randn(33, 700, dtype=torch.bfloat16, gen=gen),
    )
    first = swiglu_ops.swiglu_group_grad(*args, backend="triton")
    second = swiglu_ops.swiglu_group_grad(*args, backend="triton")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@triton.jit
def _fp4_encode_kernel(t_ptr, out_ptr, n, mbits, ROUND: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(t_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, _fp4_code(t, mbits, ROUND), mask=offs < n)


@triton.jit
def _fp8_encode_kernel(t_ptr, out_ptr, n, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(t_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, _fp8_code(t, E5M2), mask=offs < n)


def _with_neighbours(points: torch.Tensor) -> torch.Tensor:
    """``points`` (fp32), each with both fp32 neighbours, both signs."""
    inf = torch.tensor(float("inf"))
    near = torch.cat([points, torch.nextafter(points, inf), torch.nextafter(points, -inf)])
    return torch.cat([near, -near])


def _random_fp32(gen: torch.Generator, scale: float) -> torch.Tensor:
    """Uniform values on [-scale, scale] and random bit patterns, 100,000 each."""
    values = (torch.rand(100_000, generator=gen) - 0.5) * (2 * scale)
    bits = torch.randint(-(2**31), 2**31 - 1, (100_000,), generator=gen, dtype=torch.int32)
    return torch.cat([values, bits.view(torch.float32)])


_BF16_PATTERNS = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()


def _fp8_code_inputs(fmt) -> torch.Tensor:
    """fp32 values for an FP8 encoder: every bf16 bit pattern widened (every exponent, both signs, zeros,
    subnormals, inf, NaN); every finite code's value and every midpoint between neighbouring values (the
    ties, and past the largest value), each with both fp32 neighbours and both signs; the fp32 subnormal
    edge; random values within the format's range and random bit patterns."""
    values = mx.decode(torch.arange(0, 0x80, dtype=torch.uint8), fmt).double()
    values = values[values.isfinite() & (values <= fmt.max_value)].unique()
    ties = (values[1:] + values[:-1]) / 2
    past = torch.tensor([fmt.max_value * 1.0625, fmt.max_value * 1.125, 2.0**16, 2.0**-149, 2.0**-126])
    points = torch.cat([values, ties, past.double()]).float()
    gen = torch.Generator().manual_seed(8)
    return torch.cat([_BF16_PATTERNS, _with_neighbours(points), _random_fp32(gen, fmt.max_value * 1.25)])


@pytest.mark.skipif(not IN_PROCESS, reason=WHY_NOT)
@pytest.mark.parametrize("fmt", [mx.E4M3FN, mx.E5M2], ids=["e4m3", "e5m2"])
def test_fp8_encoder_is_mx_encode_for_every_fp32_value_class(fmt):
    """The default path's FP8 encoder (``_kernels._fp8_code``: fp32 arithmetic, the quantum from the
    exponent) against the readable rule (``mx.encode``) on every 16-bit pattern, every code's value and
    every tie with both neighbours, and random fp32 values and bit patterns: the same code for each."""
    t = _fp8_code_inputs(fmt)
    got = torch.empty(t.numel(), dtype=torch.int32, device=DEVICE)
    grid = (triton.cdiv(t.numel(), 8192),)
    _fp8_encode_kernel[grid](t.to(DEVICE), got, t.numel(), fmt is mx.E5M2, BLOCK=8192)
    want = mx.encode(t, fmt).to(torch.int32)
    bad = (got.cpu() != want).nonzero().flatten()
    assert bad.numel() == 0, [(t[i].item(), got[i].item(), want[i].item()) for i in bad[:8]]


def _fp4_code_inputs() -> torch.Tensor:
    """fp32 values for the FP4 encoder: every bf16 bit pattern widened (every exponent, both signs, zeros,
    subnormals, inf, NaN); every value of both grids, every midpoint between neighbours (the ties) and the
    binade edges 2, 4, 8, each with both fp32 neighbours, both signs; random values on [-10, 10] and
    random bit patterns."""
    grid = torch.tensor(sorted({k / 4 for k in range(8)} | {0.5 * k for k in range(5)} | {3.0, 4.0, 6.0}))
    points = torch.cat([grid, (grid[1:] + grid[:-1]) / 2, torch.tensor([2.0, 4.0, 6.5, 7.0, 8.0, 1.875])])
    gen = torch.Generator().manual_seed(7)
    return torch.cat([_BF16_PATTERNS, _with_neighbours(points), _random_fp32(gen, 10.0)])


@pytest.mark.skipif(not IN_PROCESS, reason=WHY_NOT)
@pytest.mark.parametrize("round_mode", ["rint", "round", "floor"])
@pytest.mark.parametrize("fmt", [mx.E2M1, mx.E1M2], ids=["e2m1", "e1m2"])
def test_fp4_encoder_is_mx_encode_for_every_fp32_value_class(fmt, round_mode):
    """The kernels' FP4 encoder (``_kernels._fp4_code``: fp32 arithmetic over three binades) against the
    readable rule (``mx.encode``) on every 16-bit pattern, every grid value, tie and binade edge with both
    neighbours, and random fp32 values and bit patterns: the same nibble for each."""
    t = _fp4_code_inputs()
    got = torch.empty(t.numel(), dtype=torch.int32, device=DEVICE)
    block = 8192
    grid = (triton.cdiv(t.numel(), block),)
    _fp4_encode_kernel[grid](
        t.to(DEVICE), got, t.numel(), fmt.mbits, ROUND=ROUND_MODES[round_mode], BLOCK=block
    )
    want = mx.encode(t, fmt, round_mode).to(torch.int32)
    bad = (got.cpu() != want).nonzero().flatten()
    assert bad.numel() == 0, [(t[i].item(), got[i].item(), want[i].item()) for i in bad[:8]]


def test_availability_contract():
    ok, why = triton_backend.is_available("meta")
    assert not ok and "meta" in why
    if not HAS_CUDA and IN_PROCESS:
        assert (
            registry.select("triton", "swiglu_mx_quant", "op", torch.device("cpu"), None)[0].module
            is triton_backend
        )


@pytest.mark.parametrize(
    ("version", "ok"),
    [("3.5.0", True), ("3.5.1", True), ("3.6.0+git1a2b", True), ("3.10.0", True), ("4.0.0rc1", True),
     ("3.5", True), ("3.4.0", False), ("3.2.0", False), ("2.3.1", False), ("3", False), ("3.4rc1", False),
     ("3.4+git5e1f", False), ("3.05.0", True), ("", False), ("x.y", False)],
)  # fmt: skip
def test_triton_older_than_the_floor_is_unavailable_with_the_reason(monkeypatch, version, ok):
    """Triton releases before MIN_TRITON refuse parts of the kernels at their first launch: the backend is
    unavailable with that reason instead ("auto" then falls back with a warning; "triton" is an error)."""
    assert triton_backend.triton_version_ok(version) is ok
    monkeypatch.setattr(triton_backend.triton, "__version__", version)
    for device in ("cuda", "cpu"):
        available, why = triton_backend.is_available(device)
        if not ok:
            assert not available and f"needs Triton >= 3.5 (installed: {version})" in why


def test_hw_conversions_are_opt_in(monkeypatch):
    """The PTX conversion path (swiglu_ops.triton.HW_CONVERSIONS) is off unless asked for."""
    assert triton_backend.HW_CONVERSIONS is (os.environ.get("SWIGLU_OPS_TRITON_HW_CVT") == "1")
    monkeypatch.setattr(triton_backend, "HW_CONVERSIONS", True)
    assert triton_backend._hw_cvt() is True
    monkeypatch.setattr(triton_backend, "HW_CONVERSIONS", False)
    assert triton_backend._hw_cvt() is False


# ------------------------------------------------------------- the opt-in GPU path, emulated (interpreter)


def _hw_path_cases():
    """Every kernel on inputs that reach each key of the fast path (huge negative gates: subnormal
    sigmoids; +-inf and NaN gates and ups; clamp boundaries; values for the clamp_mode-1 quotient),
    both layouts, GLU variants and formats: (name, call, the MX forward's code format or None). On a GPU
    also fp16, whose MX amax takes the float max there (in the interpreter both paths take the integer
    one)."""
    gen = torch.Generator().manual_seed(23)
    specials = torch.tensor([torch.nan, torch.inf, -torch.inf, -90.0, -87.5, 7.0, -7.0, 1e30, -1e-30])
    ops, gpt_oss = torch.ops.swiglu_ops, {"limit": 7.0, "alpha": 1.702, "bias": 1.0}
    cases = []
    for dtype in (torch.bfloat16, torch.float32) + ((torch.float16,) if HAS_CUDA else ()):
        rows, half, k = 9, 40, len(specials)
        x = _randn(rows, 2 * half, dtype=dtype, scale=4.0, gen=gen).cpu()
        x[0, :k] = specials.to(dtype)
        x[1, half : half + k] = specials.to(dtype)
        x[2, 1 : 2 * k : 2] = specials.to(dtype)  # the B positions of the interleaved layout
        x, dy = x.to(DEVICE), _randn(rows, half, dtype=dtype, gen=gen)
        w, yo = torch.rand(rows, generator=gen).to(DEVICE) + 0.5, _randn(rows, half, dtype=dtype, gen=gen)
        gi = torch.tensor([6], device=DEVICE)
        for clamp in (0.0, 1.0):
            cases.append((f"group_grad {dtype} clamp={clamp}", functools.partial(
                swiglu_ops.swiglu_group_grad, dy, x, w, yo, gi, clamp, backend="triton")))  # fmt: skip
        for inter in (False, True):
            glu = {"interleaved": inter, **gpt_oss}
            cases += [
                (f"clipped_swiglu {dtype} {inter} mode={mode}", functools.partial(
                    swiglu_ops.clipped_swiglu, x, gi, clamp_mode=mode, backend="triton", **glu))
                for mode in (0, 1)
            ]  # fmt: skip
            cases.append((f"clipped_swiglu_grad {dtype} {inter}", functools.partial(
                swiglu_ops.clipped_swiglu_grad, dy, x, gi, backend="triton", **glu)))  # fmt: skip
            cases.append((f"clipped_swiglu_grad mode 1 {dtype} {inter}", functools.partial(
                ops._clipped_swiglu_grad_mode1, dy, x, gi, dim=-1, limit=7.0, interleaved=inter,
                backend="triton")))  # fmt: skip
        mx_x, mx_dy = _mx_extreme_case(dtype, gen, n=96)  # 3 blocks: a partial tile, an odd block count
        mx_x[10, :k] = specials.to(dtype).to(DEVICE)
        mx_gi = torch.tensor([0, 33, 33, 70], device=DEVICE)
        for kw in ({}, {"interleaved": True, **gpt_oss}, {"interleaved": False, **gpt_oss}):
            bwd = swiglu_ops.swiglu_backward_mx_quant_dual_axis
            cases.append((f"bwd_mx {dtype} {kw}", functools.partial(
                bwd, mx_x, mx_dy, mx_gi, backend="triton", **kw)))  # fmt: skip
        for kw in FWD_COMBOS:
            cases.append((f"fwd_mx {dtype} {kw}", functools.partial(
                swiglu_ops.swiglu_mx_quant_dual_axis, mx_x, mx_gi, backend="triton", **kw),
                kw.get("dst_dtype", torch.float8_e4m3fn)))  # fmt: skip
        if HAS_CUDA:  # token-contiguous y2: PTX byte stores on the GPU (the interpreter takes tl.store)
            for kw in ({}, {"interleaved": True, **gpt_oss}):
                cases.append((f"bwd_mx transpose_y2 {dtype} {kw}", functools.partial(
                    bwd, mx_x, mx_dy, mx_gi, backend="triton", transpose_y2=True, **kw)))  # fmt: skip
            for kw in FWD_COMBOS[:2]:  # FP8 only
                cases.append((f"fwd_mx transpose_y2 {dtype} {kw}", functools.partial(
                    swiglu_ops.swiglu_mx_quant_dual_axis, mx_x, mx_gi, backend="triton", transpose_y2=True,
                    **kw), kw.get("dst_dtype", torch.float8_e4m3fn)))  # fmt: skip
    return [case if len(case) == 3 else (*case, None) for case in cases]


def _outputs(out):
    return [t.cpu() for t in (out if isinstance(out, (tuple, list)) else [out])]


def _equal_bits_nan_payloads_aside(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bitwise equal, except that NaN payloads may differ (the contract compares NaN positions: a GPU's
    cvt.rn.bf16x2 gives 0x7FFF where the integer rounding gives 0x7FC0)."""
    if got.dtype.is_floating_point and got.dtype.itemsize > 1:
        assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN positions differ"
        got, want = got.masked_fill(got.isnan(), 0), want.masked_fill(want.isnan(), 0)
    _equal_codes(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8), what)


@pytest.mark.slow(seconds=35)
def test_hw_path_gives_the_default_bytes(monkeypatch):
    """The opt-in GPU path (HW_CVT: hardware conversions, the branch-free fast reciprocals and quotients,
    their keys, the exact redo of a tile) runs in the interpreter with its PTX pieces emulated: it must give
    the default path's bytes for every kernel, on inputs that reach every key; the MX forward, whose
    quotient is approximate there (``_quotient``), within the contract's near-tie rule. On a GPU the same
    test compares the real PTX path with the integer path."""
    from _fwd_oracles import assert_forward_matches

    cases = _hw_path_cases()
    default = [_outputs(call()) for _name, call, _dst in cases]
    monkeypatch.setattr(triton_backend, "HW_CONVERSIONS", True)
    for (name, call, dst), want in zip(cases, default, strict=True):
        got = _outputs(call())
        if dst is not None:
            assert_forward_matches(got, want, "triton", dst)
            continue
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            _equal_bits_nan_payloads_aside(g, w, f"{name} output {k}")


@pytest.mark.parametrize("dst", [torch.float8_e4m3fn, torch.float4_e2m1fn_x2])
def test_hw_path_quotient_of_fp32_subnormal_numerators(monkeypatch, dst):
    """The opt-in path's approximate quotient scaled its numerator by 1/4, which is not exact for an fp32
    subnormal (fp32 inputs whose activated half holds subnormals): silu(2j * 2**-149) = j * 2**-149 came out
    as 2 RN(j / 2) * 2**-149, so every odd j gave the code of its even neighbour (or 0 for j = 1).
    Such numerators now scale the reciprocal instead; the codes are the default path's (near-tie rule)."""
    from _fwd_oracles import assert_forward_matches

    from swiglu_ops.numerics.glu import GluParams

    gen = torch.Generator().manual_seed(5)
    rows, half = 8, 64
    j = torch.randint(0, 8, (rows, half), generator=gen) * 2 + 1  # odd, 1..15
    sign = torch.where(torch.rand(rows, half, generator=gen) < 0.5, -1.0, 1.0)
    a = (2 * j).double().mul(2.0**-149).float() * sign  # fp32 subnormal gates; silu(a) = a / 2 = j * 2**-149
    b = torch.full((rows, half), 2.0**120)  # the products j * 2**-29: exact FP8/FP4 values of their blocks
    x = torch.cat([a, b], 1).to(DEVICE)
    assert (a.abs() < 2.0**-126).all() and torch.equal(a.double().abs() / 2 * 2.0**149, j.double())
    # the launcher asks for the quotient's form for such numerators: fp32 inputs, or a subnormal clipped limit
    gpt_oss = dict(interleaved=True, clipped=True, alpha=1.702, bias=1.0)
    assert triton_backend.small_numerators(SWIGLU, torch.float32, True)
    assert triton_backend.small_numerators(GluParams(**gpt_oss, limit=2.0**-120), torch.bfloat16, True)
    assert not triton_backend.small_numerators(GluParams(**gpt_oss, limit=7.0), torch.bfloat16, True)
    assert not triton_backend.small_numerators(SWIGLU, torch.float32, False)
    want = [t.cpu() for t in swiglu_ops.swiglu_mx_quant_dual_axis(x, dst_dtype=dst, backend="triton")]
    monkeypatch.setattr(triton_backend, "HW_CONVERSIONS", True)
    got = [t.cpu() for t in swiglu_ops.swiglu_mx_quant_dual_axis(x, dst_dtype=dst, backend="triton")]
    assert_forward_matches(got, want, "triton", dst)


@pytest.mark.parametrize(
    ("gate", "glu", "den_key"),
    [
        (float("inf"), {"alpha": 1.702, "limit": float("inf")}, False),  # A~ = +inf: exp(-inf) + 1 = 1
        (float("-inf"), {"alpha": -1.702, "limit": 7.0}, False),  # negative alpha: exp(-inf) + 1 = 1
        (float("-inf"), {"alpha": 1.702, "limit": 7.0}, True),  # GPT-OSS: exp(+inf) + 1 = inf keys itself
    ],
)
def test_fast_path_keys_an_infinite_clamped_gate(monkeypatch, gate, glu, den_key):
    """clamp_mode 0's fast reciprocal keys by its operand alone only where that sees every infinite A~
    (``den_key``): elsewhere an infinite gate (the infinite limit; a negative alpha), the only special
    value of its tile, would leave the sigmoid 1 where the spec's quotient (A~ * 0 + 1) / den is NaN.
    The fast path (emulated in the interpreter) gives the default path's bits for ClippedSwigluGrad
    (whose NaN / inf outputs show the difference)."""
    from swiglu_ops.numerics.glu import GluParams

    assert triton_backend.den_key(GluParams(clipped=True, bias=1.0, **glu)) is den_key
    glu = {**glu, "bias": 1.0, "interleaved": False}
    gen = torch.Generator().manual_seed(7)
    x = _randn(4, 64, dtype=torch.float32, gen=gen)
    x[1, 5] = gate  # a gate (the left half), in one tile with ordinary values only
    dy = _randn(4, 32, dtype=torch.float32, gen=gen)
    want = swiglu_ops.clipped_swiglu_grad(dy, x, backend="triton", **glu)
    assert (~want.isfinite()).nonzero().tolist() == [[1, 5], [1, 37]]  # the pair's two gradients
    monkeypatch.setattr(triton_backend, "HW_CONVERSIONS", True)
    got = swiglu_ops.clipped_swiglu_grad(dy, x, backend="triton", **glu)
    _equal_bits_nan_payloads_aside(got.cpu(), want.cpu(), "grad_x")


def test_rows_the_kernels_cannot_address_are_refused():
    """The kernels address within a row by 32-bit offsets, and CUDA launches at most 65535 programs along
    grid axis 1: a row of 2**31 elements or more (their offsets would wrap: a review found 2 * half in
    int32 reading 4 GiB before x for the second row), and an MX row needing more programs along it, are a
    ValueError from the launcher, never a wrong address. Checked on meta tensors before any launch."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    wide = 2**31  # elements in a row of x
    with pytest.raises(ValueError, match="fewer than 2\\*\\*31 elements"):
        triton_backend.swiglu_group_grad(
            torch.empty(2, wide // 2, **meta), torch.empty(2, wide, **meta), None, None, None, 0.0,
            torch.empty(2, wide, **meta), None,
        )  # fmt: skip
    glu = SWIGLU
    with pytest.raises(ValueError, match="fewer than 2\\*\\*31 elements"):
        triton_backend.clipped_swiglu(
            torch.empty(2, wide, **meta), None, glu, torch.empty(2, wide // 2, **meta)
        )
    u8 = dict(device="meta", dtype=torch.uint8)

    def mx_bwd(m, cols):
        x, dy = torch.empty(1, m, cols, **meta), torch.empty(1, m, cols // 2, **meta)
        s1 = torch.empty(1, m, cols // 64, 2, **u8)
        s2 = torch.empty(1, mx.mxscale2_rows(m, None), cols, 2, **u8)
        y = torch.empty(1, m, cols, **u8)
        triton_backend.swiglu_bwd_mx_quant(x, dy, None, glu, 1, mx.E4M3FN, y, s1, y, s2)

    with pytest.raises(ValueError, match="fewer than 2\\*\\*31 elements"):
        mx_bwd(2, wide)
    with pytest.raises(ValueError, match="CUDA's grid limit of 65535 programs along a row"):
        mx_bwd(32, 2**25)
