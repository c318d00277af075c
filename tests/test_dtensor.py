"""DTensor sharding rules of the custom ops (``ops/sharding.py``, ``docs/distributed.md`` section 3), on 2
gloo ranks on CPU, ONE spawned group for every check (the spawn costs seconds).

Every custom op (``torch.ops.swiglu_ops.*``) and every public function (which route DTensors to them) runs
on DTensors with each exact placement (Replicate; token Shard without groups, on whole 64-row pairs for the
MX operators, weight sharded like the rows; hidden Shard of the interleaved layouts, whole pairs / blocks),
for the ``reference`` and ``cpu`` backends, on a 1-D mesh and a few on a (1, 2) mesh: the outputs'
placements are the ones the rules promise (no gather), and the gathered result is bit for bit the
single-process call on the whole tensors. The inexact placements (a hidden shard of a chunked layout, a
token shard with group_index, misaligned M or N, a weight with hidden sharding, Partial) are redistributed
by DTensor: bit for bit too. FP8 / E8M0 / FP4 results cross the gather as uint8 views (gloo on torch 2.13
has no FP8). Tiny shapes (M = 128, 2N = 256).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _distributed import run_on_group

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

BACKENDS = ("reference", "cpu")
M, C = 128, 256
GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0)
R, S0, S1 = "R", "S0", "S1"  # placements by name (built in the workers): Replicate, Shard(0), Shard(1)


def _randn(gen, *shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def _args(kind: str, gen, m=M, c=C, dtype=torch.bfloat16, lead=(), dst=torch.float8_e4m3fn):
    """Plain arguments of one operator family (x scaled so that the clamps bind somewhere)."""
    x = _randn(gen, *lead, m, c, dtype=dtype, scale=3.0)
    if kind == "clipped":
        return dict(x=x)
    if kind in ("clipped_grad", "mx_bwd"):
        return dict({"grad_y" if kind == "clipped_grad" else "y_grad": _randn(gen, *lead, m, c // 2)}, x=x)
    if kind == "group_grad":
        return dict(
            grad_y=_randn(gen, m, c // 2),
            x=x,
            weight=torch.rand(m, generator=gen),
            y_origin=_randn(gen, m, c // 2),
            clamp_limit=7.0,
        )
    if kind in ("deq1", "deq2"):  # mx_dequantize of the forward's y1/mxscale1 (axis -1) or y2/mxscale2
        import swiglu_ops

        y1, s1, y2, s2 = swiglu_ops.swiglu_mx_quant_dual_axis(
            x, interleaved=True, dst_dtype=dst, backend="reference"
        )
        data, scale = (y1, s1) if kind == "deq1" else (y2, s2)
        return dict(data=data, scale=scale, axis=-1 if kind == "deq1" else -2)
    return dict(x=x)  # mx_fwd


#: (id, public function or "op:<custom op>", argument family, kwargs, placement of each DTensor argument,
#: the outputs' promised placements (None: inexact, any placement DTensor chooses), argument overrides).
#: Plain-tensor kwargs (group_index) become Replicate DTensors.
CASES = [
    # clipped_swiglu: token dims before dim, hidden dim = dim for the interleaved layout
    ("clipped-R", "clipped_swiglu", "clipped", {}, R, [R]),
    ("clipped-S0", "clipped_swiglu", "clipped", {}, S0, [S0]),
    ("clipped-S1-interleaved", "clipped_swiglu", "clipped", {}, S1, [S1]),
    ("clipped-dim0-S0", "clipped_swiglu", "clipped", dict(dim=0), S0, [S0]),
    ("clipped-S1-chunked", "clipped_swiglu", "clipped", dict(interleaved=False), S1, None),
    ("clipped-S0-groups", "clipped_swiglu", "clipped", dict(group_index=[100]), S0, None),
    ("clipped-S1-groups", "clipped_swiglu", "clipped", dict(group_index=[100]), S1, [S1]),
    ("clipped-partial", "clipped_swiglu", "clipped", {}, "P", None),
    ("op:clipped-S1", "op:clipped_swiglu", "clipped", dict(clamp_mode=1), S1, [S1]),
    # clipped_swiglu_grad and the private mode-1 backward
    ("clipped_grad-R", "clipped_swiglu_grad", "clipped_grad", {}, R, [R]),
    ("clipped_grad-S0", "clipped_swiglu_grad", "clipped_grad", {}, S0, [S0]),
    ("clipped_grad-S1", "clipped_swiglu_grad", "clipped_grad", GPT_OSS, S1, [S1]),
    ("clipped_grad-S1-chunked", "clipped_swiglu_grad", "clipped_grad", dict(interleaved=False), S1, None),
    ("clipped_grad-S0-groups", "clipped_swiglu_grad", "clipped_grad", dict(group_index=[3, 90]), S0, None),
    ("op:clipped_grad-S0", "op:clipped_swiglu_grad", "clipped_grad", {}, S0, [S0]),
    ("mode1-S0", "clipped_swiglu_grad_mode1", "clipped_grad", {}, S0, [S0]),
    ("mode1-S1", "clipped_swiglu_grad_mode1", "clipped_grad", {}, S1, [S1]),
    ("op:mode1-S1", "op:_clipped_swiglu_grad_mode1", "clipped_grad", {}, S1, [S1]),
    (
        "op:mode1-S1-chunked",
        "op:_clipped_swiglu_grad_mode1",
        "clipped_grad",
        dict(interleaved=False),
        S1,
        None,
    ),
    # swiglu_group_grad: rows only ([gate | up] halves: no hidden sharding)
    ("group_grad-R", "swiglu_group_grad", "group_grad", {}, R, [R, R]),
    ("group_grad-S0", "swiglu_group_grad", "group_grad", {}, S0, [S0, S0]),
    ("group_grad-S0-noweight", "swiglu_group_grad", "group_grad", dict(weight=None, y_origin=None), S0, [S0]),
    (
        "op:group_grad-S0-noweight",
        "op:swiglu_group_grad",
        "group_grad",
        dict(weight=None, y_origin=None),
        S0,
        [S0, R],
    ),  # fmt: skip
    ("op:group_grad-S0", "op:swiglu_group_grad", "group_grad", {}, S0, [S0, S0]),
    ("group_grad-S1", "swiglu_group_grad", "group_grad", {}, S1, None),
    ("group_grad-S0-groups", "swiglu_group_grad", "group_grad", dict(group_index=[40, 0, 25]), S0, None),
    # swiglu_backward_mx_quant_dual_axis
    ("bwd-R", "swiglu_backward_mx_quant_dual_axis", "mx_bwd", {}, R, [R] * 4),
    ("bwd-S0", "swiglu_backward_mx_quant_dual_axis", "mx_bwd", {}, S0, [S0] * 4),
    (
        "bwd-S0-gptoss-weight",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(GPT_OSS, interleaved=True, weight="rows"),
        S0,
        [S0] * 5,
    ),  # fmt: skip
    (
        "bwd-S0-transpose",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(transpose_y2=True),
        S0,
        [S0, S0, S1, S0],
    ),  # fmt: skip
    (
        "bwd-S1-interleaved",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(interleaved=True),
        S1,
        [S1] * 4,
    ),  # fmt: skip
    (
        "bwd-S1-transpose",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(interleaved=True, transpose_y2=True, group_index=[17, 17, 70, 128]),
        S1,
        [S1, S1, S0, S1],
    ),  # fmt: skip
    ("op:bwd-S0", "op:swiglu_backward_mx_quant_dual_axis", "mx_bwd", dict(weight="rows"), S0, [S0] * 5),
    (
        "op:bwd-S1",
        "op:swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(interleaved=True),
        S1,
        [S1, S1, S1, S1, R],
    ),  # fmt: skip
    ("bwd-S0-batch", "swiglu_backward_mx_quant_dual_axis", "mx_bwd", dict(lead=(2,), m=32), S0, [S0] * 4),
    ("bwd-S1-chunked", "swiglu_backward_mx_quant_dual_axis", "mx_bwd", {}, S1, None),
    (
        "bwd-S1-weight",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(interleaved=True, weight="rows"),
        S1,
        None,
    ),  # fmt: skip
    (
        "bwd-S0-groups",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(group_index=[17, 17, 70, 128]),
        S0,
        None,
    ),  # fmt: skip
    ("bwd-S0-misaligned", "swiglu_backward_mx_quant_dual_axis", "mx_bwd", dict(m=96), S0, None),
    (
        "bwd-S1-misaligned",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(interleaved=True, c=192),
        S1,
        None,
    ),  # fmt: skip
    ("bwd-partial", "swiglu_backward_mx_quant_dual_axis", "mx_bwd", {}, "P", None),
    # swiglu_mx_quant_dual_axis
    ("fwd-R", "swiglu_mx_quant_dual_axis", "mx_fwd", {}, R, [R] * 4),
    ("fwd-S0", "swiglu_mx_quant_dual_axis", "mx_fwd", {}, S0, [S0] * 4),
    ("fwd-S0-weight", "swiglu_mx_quant_dual_axis", "mx_fwd", dict(weight="rows"), S0, [S0] * 4),
    (
        "fwd-S0-transpose",
        "swiglu_mx_quant_dual_axis",
        "mx_fwd",
        dict(transpose_y2=True),
        S0,
        [S0, S0, S1, S0],
    ),
    (
        "fwd-S1-interleaved",
        "swiglu_mx_quant_dual_axis",
        "mx_fwd",
        dict(GPT_OSS, interleaved=True),
        S1,
        [S1] * 4,
    ),  # fmt: skip
    (
        "fwd-S1-fp4",
        "swiglu_mx_quant_dual_axis",
        "mx_fwd",
        dict(interleaved=True, dst_dtype=torch.float4_e2m1fn_x2, round_mode="floor"),
        S1,
        [S1] * 4,
    ),  # fmt: skip
    (
        "fwd-S1-groups",
        "swiglu_mx_quant_dual_axis",
        "mx_fwd",
        dict(interleaved=True, group_index=[33, 33, 128]),
        S1,
        [S1] * 4,
    ),  # fmt: skip
    ("op:fwd-S1", "op:swiglu_mx_quant_dual_axis", "mx_fwd", dict(interleaved=True), S1, [S1] * 4),
    ("fwd-S1-chunked", "swiglu_mx_quant_dual_axis", "mx_fwd", {}, S1, None),
    ("fwd-S1-misaligned", "swiglu_mx_quant_dual_axis", "mx_fwd", dict(interleaved=True, c=128), S1, None),
    ("fwd-S1-weight", "swiglu_mx_quant_dual_axis", "mx_fwd", dict(interleaved=True, weight="rows"), S1, None),
    ("fwd-S0-groups", "swiglu_mx_quant_dual_axis", "mx_fwd", dict(group_index=[33, 33, 128]), S0, None),
    ("fwd-S0-misaligned", "swiglu_mx_quant_dual_axis", "mx_fwd", dict(m=64), S0, None),
    # mx_dequantize (rows independent on axis -1, M not split with groups; M on whole 64-row pairs without
    # groups on axis -2)
    ("deq1-S0", "mx_dequantize", "deq1", {}, S0, [S0]),
    ("deq1-S1", "mx_dequantize", "deq1", {}, S1, [S1]),
    ("deq2-S0", "mx_dequantize", "deq2", {}, S0, [S0]),
    ("deq2-S1", "mx_dequantize", "deq2", {}, S1, [S1]),
    ("deq2-S1-groups", "mx_dequantize", "deq2", dict(group_index=[33, 33, 128]), S1, [S1]),
    ("deq2-S0-groups-codes", "mx_dequantize", "deq2", dict(group_index=[33, 33, 128], codes=True), S0, None),
    ("deq1-S1-misaligned-codes", "mx_dequantize", "deq1", dict(c=128, codes=True), S1, None),
    # packed FP4: 32 bytes a rank are 64 elements, one whole scale pair
    ("deq1-S1-fp4", "mx_dequantize", "deq1", dict(dst=torch.float4_e2m1fn_x2), S1, [S1]),
    # axis -1 with group ends: rows stay independent, but the ends are global rows (checked against M)
    ("deq1-S0-groups-codes", "mx_dequantize", "deq1", dict(group_index=[40, 128], codes=True), S0, None),
    ("op:deq2-S0", "op:mx_dequantize", "deq2", {}, S0, [S0]),
    ("op:deq1-R-codes", "op:mx_dequantize", "deq1", dict(codes=True), R, [R]),
    # a (1, 2) mesh: the single-dim strategies expanded over both mesh dims (token x hidden)
    ("2d-clipped-S0S1", "clipped_swiglu", "clipped", {}, (S0, S1), [(S0, S1)]),
    (
        "2d-bwd-S1S0",
        "swiglu_backward_mx_quant_dual_axis",
        "mx_bwd",
        dict(interleaved=True),
        (S1, S0),
        [(S1, S0)] * 4,
    ),  # fmt: skip
    ("2d-fwd-RS1", "swiglu_mx_quant_dual_axis", "mx_fwd", dict(interleaved=True), (R, S1), [(R, S1)] * 4),
    ("2d-group_grad-S0S1", "swiglu_group_grad", "group_grad", {}, (S0, S1), None),
]
_SHAPE_KEYS = ("m", "c", "lead", "dst")


def _placement(name):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {R: Replicate(), S0: Shard(0), S1: Shard(1), "P": Partial()}[name]


def _placements(names) -> tuple:
    """A name (the 1-D mesh) or a tuple of names, one per dim of the (1, 2) mesh."""
    return tuple(map(_placement, (names,) if isinstance(names, str) else names))


def _case_call(case, backend: str, gen):
    """(callable, plain arguments) of one case: the public function or the custom op."""
    import swiglu_ops
    from swiglu_ops.ops import api
    from swiglu_ops.ops.table import OPERATORS

    _, target, kind, kwargs, _, _ = case
    kwargs = dict(kwargs)
    shape = {k: kwargs.pop(k) for k in _SHAPE_KEYS if k in kwargs}
    args = _args(kind, gen, **shape)
    if kwargs.get("weight") == "rows":
        kwargs["weight"] = torch.rand(args["x"].shape[:-1], generator=gen)
    if "group_index" in kwargs:
        kwargs["group_index"] = torch.tensor(kwargs["group_index"])
    args.update(kwargs)
    if args.pop("codes", False):  # uint8 codes: gloo can gather them (not FP8 / E8M0) when redistributing
        args.update(data=args["data"].view(torch.uint8), scale=args["scale"].view(torch.uint8))
        args["dst_dtype"] = torch.float8_e4m3fn
    if kind == "deq2" and args.get("group_index") is not None:  # the ends that made the scales
        data, scale = _grouped_y2(gen, args["group_index"], args["data"].dtype)
        args.update(data=data, scale=scale)
    if target == "op:mx_dequantize":
        values = dict(args, dst_dtype=None if args.get("dst_dtype") is None else "float8_e4m3fn")
        return (lambda **a: torch.ops.swiglu_ops.mx_dequantize(**a)), values
    if target.startswith("op:"):
        name = target[3:]
        op = OPERATORS[name]
        values = {p.name: args.get(p.name, p.default) for p in op.params}
        values = api._schema_values(op, values)  # e.g. the FP4 format by name
        fn = getattr(torch.ops.swiglu_ops, name)
        return (lambda **a: fn(**a, backend=backend)), values
    fn = getattr(swiglu_ops, target, None) or getattr(api, target)
    if target == "mx_dequantize":  # no backend: torch code
        return fn, args
    return (lambda **a: fn(**a, backend=backend)), args


def _grouped_y2(gen, ends, dtype):
    import swiglu_ops

    x = _randn(gen, M, C, scale=3.0)
    _, _, y2, s2 = swiglu_ops.swiglu_mx_quant_dual_axis(x, ends, interleaved=True, backend="reference")
    return (y2, s2) if dtype != torch.uint8 else (y2.view(torch.uint8), s2.view(torch.uint8))


def _outputs(result) -> list:
    return [result] if isinstance(result, torch.Tensor) else [t for t in result if t is not None]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def _gather(dt) -> torch.Tensor:
    """A DTensor's whole value on every rank, FP8 / E8M0 / FP4 as uint8 codes (gloo has no FP8)."""
    from torch.distributed.tensor import DTensor

    local = dt.to_local()
    if local.element_size() == 1 and local.dtype not in (torch.uint8, torch.int8):
        local = local.view(torch.uint8)
        dt = DTensor.from_local(local, dt.device_mesh, dt.placements, shape=dt.shape, stride=dt.stride())
    return dt.full_tensor()


def _check(case, backend: str, meshes, rank: int) -> str | None:
    """None if the case passes on this rank, else what differs."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    case_id, _, _, _, placement, promised = case
    mesh = meshes[0 if isinstance(placement, str) else 1]
    gen = torch.Generator().manual_seed(sum(map(ord, case_id)))
    fn, args = _case_call(case, backend, gen)
    expected_args = dict(args)
    dargs = {}
    for k, v in args.items():
        if not isinstance(v, torch.Tensor):
            dargs[k] = v
        elif k == "group_index":
            dargs[k] = distribute_tensor(v, mesh, [Replicate()] * mesh.ndim, src_data_rank=None)
        elif placement == "P":  # Partial: the two ranks' halves (their sum in the dtype is the value)
            dt = DTensor.from_local(v / 2 if v.is_floating_point() else v, mesh, [Partial()] if
                                    v.is_floating_point() else [Replicate()])  # fmt: skip
            dargs[k] = dt
            expected_args[k] = dt.full_tensor()
        else:  # a 1-D weight with the hidden dim sharded: replicated
            names = (placement,) if isinstance(placement, str) else placement
            names = tuple(R if n == S1 and v.dim() < 2 else n for n in names)
            dargs[k] = distribute_tensor(v, mesh, _placements(names), src_data_rank=None)
    expected = _outputs(fn(**expected_args))
    got = _outputs(fn(**dargs))
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if not isinstance(g, DTensor):
            return f"output {i} is a {type(g).__name__}, not a DTensor"
        if promised is not None and g.placements != _placements(promised[i]):
            return f"output {i} placed {g.placements}, promised {promised[i]}"
        whole = _gather(g)
        if whole.shape != e.shape:
            return f"output {i} shape {tuple(whole.shape)}, expected {tuple(e.shape)}"
        if not torch.equal(_bytes(whole), _bytes(e)):
            return f"output {i} differs from the single-process call"
    return None


def _worker(rank: int, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    import swiglu_ops

    meshes = (init_device_mesh("cpu", (world_size,)), init_device_mesh("cpu", (1, world_size)))
    failures = {}
    for backend in BACKENDS:
        for case in CASES:
            try:
                why = _check(case, backend, meshes, rank)
            except Exception as e:  # noqa: BLE001 - reported per case
                why = f"{type(e).__name__}: {e}"
            if why is not None:
                failures[(case[0], backend)] = why
    for name, check in EXTRA_CHECKS.items():
        try:
            why = check(meshes[0])
        except Exception as e:  # noqa: BLE001 - reported per check
            why = f"{type(e).__name__}: {e}"
        if why is not None:
            failures[(name, "extra")] = why
    return dict(failures=failures, module=swiglu_ops.__file__)


def _outputs_do_not_require_grad(mesh) -> str | None:
    """The operators are not differentiable: DTensor inputs that require grad give outputs that do not, as
    plain ones do (they used to come out requiring grad, and a backward through them then failed)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    import swiglu_ops

    gen = torch.Generator().manual_seed(3)
    x = distribute_tensor(_randn(gen, M, C, scale=3.0), mesh, [Shard(0)]).requires_grad_()
    dy = distribute_tensor(_randn(gen, M, C // 2), mesh, [Shard(0)])
    outs = [
        *swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="cpu"),
        swiglu_ops.clipped_swiglu_grad(dy, x, backend="cpu"),  # (clipped_swiglu itself is differentiable)
        *swiglu_ops.swiglu_group_grad(dy, x, backend="cpu"),
    ]
    grads = [i for i, t in enumerate(outs) if t is not None and t.requires_grad]
    return f"outputs {grads} require grad" if grads else None


def _clamped_swiglu_with_groups(mesh) -> str | None:
    """training.clamped_swiglu (autograd over swiglu_group_grad) with a DTensor x and DTensor group counts:
    forward and both gradients bit for bit the single-process ones; plain counts beside a DTensor x are a
    TypeError naming group_index (as at the operators' gate: their placement is unknown)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import swiglu_ops

    gen = torch.Generator().manual_seed(4)
    x, dy = _randn(gen, 40, 64, scale=3.0), _randn(gen, 40, 32)
    w, counts = torch.rand(40, generator=gen), torch.tensor([9, 20])

    def run(x, w, dy, counts):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = swiglu_ops.clamped_swiglu(x, w, counts, 7.0, backend="cpu")
        y.backward(dy)
        return y, x.grad, w.grad

    want = run(x, w, dy, counts)
    for xp in (Replicate(), Shard(0)):
        placed = [distribute_tensor(t, mesh, [xp]) for t in (x, w, dy)]
        got = run(*placed, distribute_tensor(counts, mesh, [Replicate()]))
        for name, a, b in zip(("y", "x.grad", "weight.grad"), got, want, strict=True):
            if not torch.equal(a.full_tensor(), b):
                return f"x {xp}: {name} differs"
        try:
            run(*placed, counts)
            return f"x {xp}, plain group_index: no TypeError"
        except TypeError as exc:
            if "group_index is a plain tensor while x is a DTensor" not in str(exc):
                return f"x {xp}, plain group_index: {exc}"
    return None


def _expert_mlp_names_a_dtensor(mesh) -> str | None:
    """mxfp8_expert_mlp computes on local tensors: a DTensor operand (probs and group_ends too) is a TypeError
    naming it (group_ends used to reach torch's grouped GEMM, which failed on mixed tensors)."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    import swiglu_ops

    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    w1, w2 = torch.zeros(2, 64, 64, dtype=torch.bfloat16), torch.zeros(2, 32, 64, dtype=torch.bfloat16)
    ends, probs = torch.tensor([1, 4]), torch.ones(4)
    for name, args, kwargs in (
        ("x", (distribute_tensor(x, mesh, [Replicate()]), w1, w2, ends), {}),
        ("probs", (x, w1, w2, ends), dict(probs=distribute_tensor(probs, mesh, [Replicate()]))),
        ("group_ends", (x, w1, w2, distribute_tensor(ends, mesh, [Replicate()])), {}),
        ("group_ends", (x, w1, w2, distribute_tensor(ends, mesh, [Replicate()])), dict(quantize=False)),
    ):
        try:
            swiglu_ops.mxfp8_expert_mlp(*args, **kwargs)
            return f"{name}: no TypeError"
        except TypeError as exc:
            if f"{name} is a DTensor" not in str(exc) or "to_local()" not in str(exc):
                return f"{name}: message: {exc}"
    return None


def _errors_keep_their_types(mesh) -> str | None:
    """A bad argument beside DTensor inputs is the plain call's TypeError / ValueError with its message
    (DTensor's sharding propagation used to wrap the fake kernel's error in a RuntimeError)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    import swiglu_ops

    x = torch.randn(128, 256).bfloat16()
    y1, s1, _, _ = swiglu_ops.swiglu_mx_quant_dual_axis(x, backend="reference")
    calls = {
        "scale_alg=2": lambda t: swiglu_ops.swiglu_mx_quant_dual_axis(t, scale_alg=2),
        "fp32 y_grad": lambda t: swiglu_ops.swiglu_backward_mx_quant_dual_axis(t, t[:, :128].float()),
        "limit=0": lambda t: swiglu_ops.clipped_swiglu_grad(t[:, :128], t, limit=0.0),
        "group_grad odd x": lambda t: swiglu_ops.swiglu_group_grad(t[:, :100], t[:, :100]),
        "dequantize dtype": lambda t: swiglu_ops.mx_dequantize(
            distribute_tensor(y1, mesh, [Shard(0)]), distribute_tensor(s1, mesh, [Shard(0)]), dtype=torch.int8
        ),
    }
    for name, call in calls.items():
        errors = []
        for t in (x, distribute_tensor(x, mesh, [Shard(0)])):
            try:
                call(t)
                errors.append(None)
            except (TypeError, ValueError, RuntimeError) as exc:
                errors.append((type(exc), str(exc)))
        if errors[0] is None or errors[1] != errors[0]:
            return f"{name}: plain {errors[0]}, DTensor {errors[1]}"
    return None


EXTRA_CHECKS = {
    "errors_keep_their_types": _errors_keep_their_types,
    "outputs_do_not_require_grad": _outputs_do_not_require_grad,
    "clamped_swiglu_with_groups": _clamped_swiglu_with_groups,
    "expert_mlp_names_a_dtensor": _expert_mlp_names_a_dtensor,
}


@pytest.fixture(scope="module")
def group_results():
    return run_on_group(_worker, world_size=2, timeout=240)


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id", [c[0] for c in CASES])
def test_placement(group_results, case_id, backend):
    for rank, result in enumerate(group_results):
        why = result["failures"].get((case_id, backend))
        assert why is None, f"rank {rank}: {why}"


@pytest.mark.parametrize("name", sorted(EXTRA_CHECKS))
def test_modules_and_autograd_on_dtensors(group_results, name):
    for rank, result in enumerate(group_results):
        why = result["failures"].get((name, "extra"))
        assert why is None, f"rank {rank}: {why}"


def test_every_operator_has_a_layout_and_a_case():
    from swiglu_ops.ops.sharding import LAYOUTS
    from swiglu_ops.ops.table import OPERATORS, PUBLIC

    assert set(LAYOUTS) == set(OPERATORS)
    assert {c[1][3:] for c in CASES if c[1].startswith("op:")} == set(OPERATORS) | {"mx_dequantize"}
    public = {c[1] for c in CASES if not c[1].startswith("op:")}
    assert public == {op.name for op in PUBLIC} | {"clipped_swiglu_grad_mode1", "mx_dequantize"}


_REGISTERED = """
import torch
from torch.distributed.tensor import DTensor
from swiglu_ops.ops import sharding
propagator = DTensor._op_dispatcher.sharding_propagator
for name in sharding.LAYOUTS:
    overload = getattr(torch.ops.swiglu_ops, name).default
    assert overload in propagator.op_strategy_funcs, name
    info = propagator.op_to_schema_info[overload]
    kw = {a.name for a in overload._schema.arguments if a.kwarg_only}  # keyed on every attribute
    assert kw <= set(info.static_kwargkey or ()), (name, info)
print("ok")
"""


@pytest.mark.parametrize("first", ["torch.distributed.tensor", "swiglu_ops"])
def test_rules_registered_in_either_import_order(first):
    """Registered when torch.distributed.tensor is imported before swiglu_ops, and when after (the import
    hook), with the sharding cache keyed on the bool attributes too."""
    import os
    import subprocess
    import sys

    other = "swiglu_ops" if first != "swiglu_ops" else "torch.distributed.tensor"
    code = f"import {first}\nimport {other}\n" + _REGISTERED
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))  # fmt: skip
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
