"""swiglu_ops.integrations.torchtitan against torchtitan 0.3.0 (skipped without torchtitan).

- The converter on the deepseek_v3 ``debugmodel`` and qwen3 ``debugmodel_moe`` configs (built on the meta
  device): every ``GroupedExperts`` becomes a ``FusedGroupedExperts``, state-dict keys and shapes unchanged.
- ``FusedGroupedExperts`` against torchtitan's own ``GroupedExperts`` on the same weights and tokens, both
  measured against a float64 evaluation of the same bf16 operands: the bf16 recipe's error is no larger than
  torchtitan's, the MXFP8 recipe's within MXFP8 rounding.
- Two gloo processes (``tests/_distributed.py``), a whole torchtitan ``MoE`` layer parallelized by torchtitan
  itself: EP=2 (``AllToAllTokenDispatcher``, experts sharded on the ``ep`` mesh) and TP=2 (w1/w3 sharded on F,
  w2 on its F dim) against EP=1/TP=1, forward and gradients; an MXFP8 TP sharding that splits a 32-element
  block raises ValueError.
"""

from __future__ import annotations

import unittest.mock

import pytest
import torch

pytest.importorskip("torchtitan")
pytest.importorskip("spmd_types")

from torchtitan.distributed.utils import set_spmd_backend  # noqa: E402

set_spmd_backend("partial_dtensor")  # torch 2.13: torchtitan's default "spmd_types" backend does not run

from _distributed import run_on_group  # noqa: E402
from torchtitan.models.common.moe import GroupedExperts  # noqa: E402

from swiglu_ops.integrations import torchtitan as tt  # noqa: E402
from swiglu_ops.integrations.torchtitan import FusedExpertsConverter, FusedGroupedExperts  # noqa: E402

# ------------------------------------------------------------------------------------------- converter


def _registries():
    from torchtitan.models.deepseek_v3 import model_registry as deepseek_v3
    from torchtitan.models.qwen3 import model_registry as qwen3

    return {"deepseek_v3": (deepseek_v3, "debugmodel"), "qwen3": (qwen3, "debugmodel_moe")}


@pytest.mark.parametrize("model", ["deepseek_v3", "qwen3"])
@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_converter_replaces_every_grouped_experts(model, recipe):
    registry, flavor = _registries()[model]
    plain = registry(flavor).model
    converted = registry(flavor, converters=[FusedExpertsConverter.Config(recipe=recipe)]).model
    with torch.device("meta"):
        ref, fused = plain.build(), converted.build()
    ref_experts = {n for n, m in ref.named_modules() if type(m) is GroupedExperts}
    fused_experts = {n: m for n, m in fused.named_modules() if isinstance(m, GroupedExperts)}
    assert ref_experts and set(fused_experts) == ref_experts
    assert all(type(m) is FusedGroupedExperts and m.recipe == recipe for m in fused_experts.values())
    shapes = lambda m: {k: (tuple(v.shape), v.dtype) for k, v in m.state_dict().items()}  # noqa: E731
    assert shapes(fused) == shapes(ref)
    # param_init and sharding config travel with the config: the same initialisers for the same names
    for _fqn, cfg, _parent, _attr in converted.traverse(GroupedExperts.Config):
        assert type(cfg) is FusedGroupedExperts.Config and set(cfg.param_init) == {
            "w1_EFD",
            "w2_EDF",
            "w3_EFD",
        }


def test_converter_leaves_subclasses_and_rejects_unknown_options():
    from torchtitan.models.common.moe import RoutedExperts
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

    dispatcher = LocalTokenDispatcher.Config(num_experts=4, top_k=2)
    for inner in (
        GptOssGroupedExperts.Config(dim=64, hidden_dim=64, num_experts=4),  # biases, clipped SwiGLU: not ours
        FusedGroupedExperts.Config(dim=64, hidden_dim=64, num_experts=4, recipe="bf16"),  # converted already
    ):
        tree = RoutedExperts.Config(inner_experts=inner, token_dispatcher=dispatcher)
        converter = FusedExpertsConverter.Config(recipe="mxfp8").build()
        with unittest.mock.patch.object(tt.logger, "warning") as warning:  # converting nothing is said
            assert converter.convert(tree).inner_experts is inner
        assert converter.converted == 0 and "converted nothing" in warning.call_args.args[0]
    with pytest.raises(ValueError, match="recipe must be one of"):
        FusedExpertsConverter.Config(recipe="fp4").build()
    with pytest.raises(ValueError, match="recipe must be one of"):
        FusedGroupedExperts(FusedGroupedExperts.Config(dim=64, hidden_dim=64, num_experts=4, recipe="fp4"))
    # backend and gemm too, where the config is built (not at the first forward), in either recipe
    for bad, match in (
        (dict(backend="nonsense"), "backend must be one of"),
        (dict(gemm="x"), "gemm must be"),
    ):
        with pytest.raises(ValueError, match=match):
            FusedExpertsConverter.Config(recipe="bf16", **bad).build()
        with pytest.raises(ValueError, match=match):
            FusedGroupedExperts(FusedGroupedExperts.Config(dim=64, hidden_dim=64, num_experts=4, **bad))


# ------------------------------------------------------------------------- one process, against torchtitan


def _float64_experts(x, w1, w2, w3, counts):
    """torchtitan's GroupedExperts in float64, no rounding."""
    outs, start = [x.new_zeros(0, w2.shape[1])], 0
    for e, c in enumerate(counts.tolist()):
        xe = x[start : start + c]
        start += c
        outs.append((torch.nn.functional.silu(xe @ w1[e].T) * (xe @ w3[e].T)) @ w2[e].T)
    return torch.cat(outs)


def _run(module, x, counts, gout):
    module.zero_grad()
    x = x.clone().requires_grad_()
    out = module(x, counts)
    (out.float() * gout).sum().backward()
    return [out, x.grad] + [p.grad for p in (module.w1_EFD, module.w2_EDF, module.w3_EFD)]


NAMES = ("out", "dx", "dw1", "dw2", "dw3")


@pytest.mark.parametrize("dim,hidden", [(64, 128), (64, 80)])  # F = 80: zero-padded to 96
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_matches_torchtitan_grouped_experts(recipe, dtype, dim, hidden):
    torch.manual_seed(0)
    experts = 4
    ref = GroupedExperts(GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=experts))
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    fused = FusedGroupedExperts(
        FusedGroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=experts, recipe=recipe)
    )
    fused.load_state_dict(ref.state_dict())  # strict: the same keys and shapes
    counts = torch.tensor([5, 0, 9, 6])  # an expert without tokens
    x = torch.randn(int(counts.sum()), dim).to(dtype)
    gout = torch.randn(x.shape)

    # float64 on the operands both modules multiply: x, w and the output gradient rounded to bf16
    exact = [t.detach().bfloat16().double() for t in (x, ref.w1_EFD, ref.w2_EDF, ref.w3_EFD)]
    exact = [t.requires_grad_() for t in exact]
    out64 = _float64_experts(*exact, counts)
    (out64 * gout.bfloat16().double()).sum().backward()
    want = [out64] + [t.grad for t in exact[:1]] + [t.grad for t in exact[1:]]

    got_tt = _run(ref, x, counts, gout.bfloat16().float())
    got = _run(fused, x, counts, gout.bfloat16().float())
    assert got[0].dtype == got_tt[0].dtype == dtype and got[1].dtype == dtype
    for name, a, b, w in zip(NAMES, got, got_tt, want, strict=True):
        err = ((a.double() - w).norm() / w.norm()).item()
        err_tt = ((b.double() - w).norm() / w.norm()).item()
        if recipe == "bf16":  # one rounding of the activation instead of torchtitan's three
            assert err <= err_tt * 1.05 + 1e-6, (name, err, err_tt)
        else:  # E4M3 keeps 3 mantissa bits: ~2**-5 relative per element, about 4% measured
            assert err < 0.08, (name, err, err_tt)


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_no_tokens(recipe):
    """An EP rank can receive no tokens at all: an empty output and exactly zero weight gradients."""
    m = FusedGroupedExperts(FusedGroupedExperts.Config(dim=64, hidden_dim=64, num_experts=2, recipe=recipe))
    for p in m.parameters():
        torch.nn.init.normal_(p)
    x = torch.zeros(0, 64, requires_grad=True)
    out = m(x, torch.tensor([0, 0]))
    out.sum().backward()
    assert out.shape == (0, 64) and x.grad.shape == (0, 64)
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in m.parameters())


def test_mxfp8_rejects_a_shard_that_splits_a_block():
    """What the TP test below checks under a real sharding: local F = 48 of a global F = 96."""
    m = FusedGroupedExperts(FusedGroupedExperts.Config(dim=64, hidden_dim=96, num_experts=2, recipe="mxfp8"))
    with torch.no_grad():
        m.w1_EFD = torch.nn.Parameter(torch.zeros(2, 48, 64))
        m.w3_EFD = torch.nn.Parameter(torch.zeros(2, 48, 64))
        m.w2_EDF = torch.nn.Parameter(torch.zeros(2, 64, 48))
    with pytest.raises(ValueError, match=r"F = 96 sharded into F = 48 per shard"):
        m(torch.zeros(3, 64), torch.tensor([1, 2]))
    m.recipe = "bf16"  # zero-padded to 64 per shard: runs
    assert m(torch.zeros(3, 64), torch.tensor([1, 2])).shape == (3, 64)


# ------------------------------------------------------------------- two processes: EP=2 and TP=2 (gloo)

E, D, K, B, L = 4, 64, 2, 2, 6


def _moe_config(recipe, *, hidden, enable_ep, enable_sp=False):
    import spmd_types as spmd
    from torchtitan.models.common.config_utils import (
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )
    from torchtitan.models.common.moe_sharding import set_moe_sharding_config

    init = dict.fromkeys(("weight", "w1_EFD", "w2_EDF", "w3_EFD"), torch.nn.init.zeros_)
    cfg = make_moe_config(
        num_experts=E,
        load_balance_coeff=None,
        router=make_router_config(dim=D, num_experts=E, gate_param_init=init, top_k=K, score_func="softmax"),
        routed_experts=make_routed_experts_config(
            dim=D, hidden_dim=hidden, num_experts=E, top_k=K, param_init=init, comm_backend="standard"
        ),
    )
    cfg = FusedExpertsConverter.Config(recipe=recipe).build().convert(cfg)
    set_moe_sharding_config(  # as qwen3 / deepseek_v3 do for their GroupedExperts
        cfg,
        enable_ep=enable_ep,
        enable_sp=enable_sp,
        expert_param_layout={"w1_EFD": spmd.S(1), "w2_EDF": spmd.S(2), "w3_EFD": spmd.S(1)},
    )
    return cfg


def _build(cfg):
    """The same weights on every rank, before torchtitan distributes them."""
    moe = cfg.build()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _name, p in sorted(moe.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return moe


def _step(moe, x, gout):
    x = x.clone().requires_grad_()
    out = moe(x)
    if hasattr(out, "full_tensor"):  # TP: a replicated DTensor; with SP, this rank's part of the sequences
        out = out.to_local()
    (out.float() * gout).sum().backward()
    experts = moe.routed_experts.inner_experts
    assert isinstance(experts, FusedGroupedExperts)
    grads = {n: getattr(p.grad, "to_local", lambda g=p.grad: g)() for n, p in experts.named_parameters()}
    return {"out": out.detach(), "dx": x.grad, **grads}


def _parallel_dims(world_size, *, ep, tp):
    from torchtitan.distributed import ParallelDims

    dims = ParallelDims(
        dp_replicate=1, dp_shard=world_size // tp, cp=1, tp=tp, pp=1, ep=ep, world_size=world_size,
        spmd_backend="partial_dtensor",
    )  # fmt: skip
    dims.build_mesh()
    return dims


def _worker(rank, world_size):
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    import torchtitan.tools.utils as tools_utils
    from torchtitan.distributed.utils import set_spmd_backend

    set_spmd_backend("partial_dtensor")
    parallel_dims_module.device_type = tools_utils.device_type = (
        "cpu"  # torchtitan assumes "cuda" without GPU
    )

    gen = torch.Generator().manual_seed(1)
    xs = torch.randn(world_size, B, L, D, generator=gen)  # rank r's batch under EP (data parallel)
    gouts = torch.randn(world_size, B, L, D, generator=gen)
    x_all, gout_all = xs.flatten(0, 1), gouts.flatten(0, 1)  # every rank's tokens: EP=1 and TP=2 see all
    results = {}
    for recipe in ("bf16", "mxfp8"):
        results[recipe, "ref"] = _step(
            _build(_moe_config(recipe, hidden=128, enable_ep=False)), x_all, gout_all
        )
        moe = _build(_moe_config(recipe, hidden=128, enable_ep=True))
        moe.parallelize(_parallel_dims(world_size, ep=world_size, tp=1))
        assert moe.routed_experts.inner_experts.w1_EFD.to_local().shape[0] == E // world_size
        results[recipe, "ep"] = _step(moe, xs[rank], gouts[rank])
        moe = _build(_moe_config(recipe, hidden=128, enable_ep=False))
        moe.parallelize(_parallel_dims(world_size, ep=1, tp=world_size))
        assert moe.routed_experts.inner_experts.w1_EFD.to_local().shape[1] == 128 // world_size
        results[recipe, "tp"] = _step(moe, x_all, gout_all)
        # EP=2 on the TP axis with sequence parallelism: each rank holds half of every sequence of x_all
        moe = _build(_moe_config(recipe, hidden=128, enable_ep=True, enable_sp=True))
        moe.parallelize(_parallel_dims(world_size, ep=world_size, tp=world_size))
        seq = slice(rank * L // world_size, (rank + 1) * L // world_size)
        results[recipe, "ep_sp"] = _step(moe, x_all[:, seq], gout_all[:, seq])

    # F = 96: 48 per shard splits an MX block (rejected); the bf16 recipe pads each shard to 64 (exact)
    results["bf16", "ref96"] = _step(_build(_moe_config("bf16", hidden=96, enable_ep=False)), x_all, gout_all)
    for recipe in ("bf16", "mxfp8"):
        moe = _build(_moe_config(recipe, hidden=96, enable_ep=False))
        moe.parallelize(_parallel_dims(world_size, ep=1, tp=world_size))
        try:
            results[recipe, "tp96"] = _step(moe, x_all, gout_all)
        except ValueError as exc:  # raised on every rank before any collective: nothing waits
            results[recipe, "tp96"] = str(exc)
    results["placements"] = _placement_errors(world_size)
    results["empty shard"] = _empty_shard(world_size)
    return results


def _empty_shard(world_size):
    """F = 1 under TP = 2 (shards of 1 and 0 columns), recipe bf16: every rank computes (the empty shard as
    one zero block; it used to raise on that rank only) and the shards' partial outputs add up to the
    unsharded module's output."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    experts = FusedGroupedExperts(
        FusedGroupedExperts.Config(dim=D, hidden_dim=1, num_experts=2, recipe="bf16", backend="cpu")
    )
    gen = torch.Generator().manual_seed(5)
    full = {n: torch.randn(getattr(experts, n).shape, generator=gen) for n in ("w1_EFD", "w3_EFD", "w2_EDF")}
    x, counts = torch.randn(3, D, generator=gen), torch.tensor([1, 2])
    for name, t in full.items():
        setattr(experts, name, torch.nn.Parameter(t.clone()))
    want = experts(x, counts).detach()
    for name, dim in (("w1_EFD", 1), ("w3_EFD", 1), ("w2_EDF", 2)):
        setattr(experts, name, torch.nn.Parameter(distribute_tensor(full[name], mesh, [Shard(dim)])))
    try:
        got = experts(x, counts).detach()
    except ValueError as exc:
        return str(exc)
    dist.all_reduce(got)
    return float((got - want).abs().max()), _partial_sum_tol(want)


def _placement_errors(world_size):
    """FusedGroupedExperts with DTensor weights the module cannot compute on, placed by hand: F = 65 split
    33 + 32 (only rank 0's shard splits an MX block) and F = 63 split 32 + 31 (only rank 1's), and Partial
    weights. Each must raise on every rank (no rank may go on into a collective the others never reach)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    errors = {}
    for case, hidden in (("F65", 65), ("F63", 63), ("partial", 64)):
        experts = FusedGroupedExperts(
            FusedGroupedExperts.Config(dim=D, hidden_dim=hidden, num_experts=2, recipe="mxfp8", backend="cpu")
        )
        for name, dim in (("w1_EFD", 1), ("w3_EFD", 1), ("w2_EDF", 2)):
            full = torch.zeros(getattr(experts, name).shape)
            t = DTensor.from_local(full, mesh, [Partial()]) if case == "partial" else (
                distribute_tensor(full, mesh, [Shard(dim)])
            )  # fmt: skip
            setattr(experts, name, torch.nn.Parameter(t))
        try:
            experts(torch.zeros(3, D), torch.tensor([1, 2]))
            errors[case] = None
        except ValueError as exc:
            errors[case] = str(exc)
    return errors


@pytest.fixture(scope="module")
def distributed():
    return run_on_group(_worker, world_size=2, timeout=150)


def _partial_sum_tol(ref: torch.Tensor) -> float:
    """TP's extra rounding: each rank's partial sum rounded to bf16 before the reduction (plus the final
    rounding): a few bf16 ulps of the largest value."""
    return 4 * 2.0**-8 * ref.abs().max().item()


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_expert_parallel_matches_ep1(distributed, recipe):
    """EP=2 gives EP=1's results bitwise: every token meets the same arithmetic, each expert's tokens in the
    same order (rank 0's, then rank 1's), so even the token-axis MX blocks of the weight gradients agree."""
    for rank, res in enumerate(distributed):
        ref, ep = res[recipe, "ref"], res[recipe, "ep"]
        tokens = slice(rank * B, (rank + 1) * B)
        local = slice(rank * E // 2, (rank + 1) * E // 2)
        torch.testing.assert_close(ep["out"], ref["out"][tokens], rtol=0, atol=0)
        torch.testing.assert_close(ep["dx"], ref["dx"][tokens], rtol=0, atol=0)
        for name in ("w1_EFD", "w2_EDF", "w3_EFD"):
            torch.testing.assert_close(ep[name], ref[name][local], rtol=0, atol=0, msg=name)


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_expert_parallel_on_the_sequence_parallel_tp_axis(distributed, recipe):
    """EP=2 on the TP axis (torchtitan's EP with TP: tokens sequence-sharded): every token's output and input
    gradient bitwise; an expert now sees its tokens in another order (sequence halves first), so its weight
    gradient accumulates in another order: within a few bf16 ulps (here every expert has fewer than 32
    tokens: one MX block, the same members)."""
    for rank, res in enumerate(distributed):
        ref, ep = res[recipe, "ref"], res[recipe, "ep_sp"]
        seq = (slice(None), slice(rank * L // 2, (rank + 1) * L // 2))
        local = slice(rank * E // 2, (rank + 1) * E // 2)
        torch.testing.assert_close(ep["out"], ref["out"][seq], rtol=0, atol=0)
        torch.testing.assert_close(ep["dx"], ref["dx"][seq], rtol=0, atol=0)
        for name in ("w1_EFD", "w2_EDF", "w3_EFD"):
            want = ref[name][local]
            torch.testing.assert_close(ep[name], want, rtol=0, atol=_partial_sum_tol(want), msg=name)


def _check_tp(ref, tp, rank, hidden):
    """TP=2: weight gradients of each shard bitwise (a shard's SwiGLU is exact on its own columns); the
    output and the input gradient within the rounding of the bf16 partial sums."""
    f = slice(rank * hidden // 2, (rank + 1) * hidden // 2)
    shards = {"w1_EFD": (slice(None), f), "w3_EFD": (slice(None), f), "w2_EDF": (slice(None), slice(None), f)}
    for name, index in shards.items():
        torch.testing.assert_close(tp[name], ref[name][index], rtol=0, atol=0, msg=name)
    for name in ("out", "dx"):
        torch.testing.assert_close(tp[name], ref[name], rtol=0, atol=_partial_sum_tol(ref[name]), msg=name)


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_tensor_parallel_matches_tp1(distributed, recipe):
    for rank, res in enumerate(distributed):
        _check_tp(res[recipe, "ref"], res[recipe, "tp"], rank, 128)


@pytest.mark.slow(seconds=30)
def test_tensor_parallel_block_splitting_shard(distributed):
    for rank, res in enumerate(distributed):
        msg = res["mxfp8", "tp96"]
        assert isinstance(msg, str), "MXFP8 with 48 columns of F per shard must raise"
        assert "F = 96 sharded into F = [48, 48] per shard" in msg and "multiple of 32" in msg, msg
        _check_tp(res["bf16", "ref96"], res["bf16", "tp96"], rank, 96)  # bf16: padded, still exact per shard


def test_an_empty_tensor_parallel_shard_computes(distributed):
    for rank, res in enumerate(distributed):
        assert isinstance(res["empty shard"], tuple), f"rank {rank}: {res['empty shard']}"
        error, tol = res["empty shard"]
        assert error <= tol, (rank, error, tol)


@pytest.mark.slow(seconds=30)
def test_unexecutable_weight_placements_fail_on_every_rank(distributed):
    """Shards that split an MX block on one rank only, and Partial weights: the same ValueError on both ranks
    (decided from the global placements; a rank-local check let the other rank run on and wait)."""
    want = {"F65": "F = [33, 32] per shard", "F63": "F = [32, 31] per shard", "partial": "not Partial"}
    for rank, res in enumerate(distributed):
        for case, text in want.items():
            msg = res["placements"][case]
            assert msg is not None and text in msg, f"rank {rank}, {case}: {msg}"
