"""MXFP8ExpertMLP inside plain torch.distributed, on 2 gloo ranks on CPU (``docs/distributed.md``).

- FSDP2 (``fully_shard``), bf16 baseline and MXFP8, plain SwiGLU and GPT-OSS: 3 AdamW steps, a new batch per
  step, each rank its own tokens with uneven expert counts (an empty expert), against one process that sums
  the ranks' losses computed by the same (unsharded) module on each rank's batch, divided by the world size
  (FSDP averages the gradients). Per-rank calls keep each rank's expert groups: that is what FSDP computes
  (one concatenated call with merged groups would round dW to bf16 once instead of per rank, and move the
  MXFP8 token blocks: about 3e-3 relative, measured). Required: gradients and parameters within 1e-6
  relative (max |a - b| / max |b|) after every step; measured: 0 (bit for bit).
- Expert parallelism (``swiglu_ops.ExpertParallelMLP``): output, dx and every expert's weight gradient bit
  for bit those of one process running all experts on the same tokens in ``single_process_order``
  (including an empty expert, a rank that receives no rows, a rank that sends none); the order matters.
- The example ``examples/moe_expert_parallel.py`` runs under ``torchrun --nproc-per-node 2``.

Each test spawns one group (``tests/_distributed.py``) and runs all its checks in it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _distributed import run_on_group

import swiglu_ops

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

E, D, H = 4, 32, 32
GPT_OSS = dict(limit=7.0, alpha=1.702, bias=1.0, interleaved=True)
ACTIVATIONS = {"swiglu": {}, "gpt_oss": GPT_OSS}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "moe_expert_parallel.py"


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a 16/32-bit float tensor (so that -0.0 and +0.0 differ)."""
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


# ------------------------------------------------------------------------------------------------ FSDP2

STEPS = 3


def _fsdp_batch(step: int, rank: int):
    """Rank ``rank``'s batch at ``step``: x (scaled so that GPT-OSS's clamps bind on some values), the
    group ends (uneven counts, one empty expert) and the loss's weights ``dy``."""
    g = torch.Generator().manual_seed(100 * step + rank)
    counts = torch.randint(1, 13, (E,), generator=g)
    counts[(step + rank) % E] = 0
    t = int(counts.sum())
    return (
        3 * torch.randn(t, D, generator=g),
        swiglu_ops.counts_to_ends(counts),
        torch.randn(t, D, generator=g),
    )


def _fsdp_worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    configs = [(q, a, None) for q in (False, True) for a in ACTIVATIONS]
    configs.append((True, "swiglu", "bf16 params, fp32 reduce"))
    # with router probabilities: FSDP2 casts every float forward input to param_dtype, probs included (the
    # module widens a bf16 probs exactly; it used to refuse it); the reference gets the same rounded probs
    configs.append((True, "gpt_oss", "bf16 params, fp32 reduce, router probs"))
    diffs = {}
    for quantize, act, mixed in configs:
        torch.manual_seed(0)
        ref = swiglu_ops.MXFP8ExpertMLP(E, D, H, **ACTIVATIONS[act], quantize=quantize)
        model = swiglu_ops.MXFP8ExpertMLP(E, D, H, **ACTIVATIONS[act], quantize=quantize)
        model.load_state_dict(ref.state_dict())
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
        fully_shard(model, mesh=mesh, **({"mp_policy": mp} if mp else {}))
        assert model.w1.to_local().shape[0] == E // world  # sharded along the experts
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
        ref_params = dict(ref.named_parameters())
        steps = []
        for step in range(STEPS):

            def probs(
                x, routed=bool(mixed and "probs" in mixed)
            ):  # one per row, exact in bf16 (FSDP2's cast)
                return torch.sigmoid(x[:, 0]).bfloat16().float() if routed else None

            x, ends, dy = _fsdp_batch(step, rank)
            (model(x, ends, probs(x)).float() * dy).sum().backward()
            loss = 0.0
            for r in range(world):  # one process: the same module on every rank's batch
                xr, er, dyr = _fsdp_batch(step, r)
                loss = loss + (ref(xr, er, probs(xr)).float() * dyr).sum()
            (loss / world).backward()
            grads = {n: _rel(p.grad.full_tensor(), ref_params[n].grad) for n, p in model.named_parameters()}
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
            params = {n: _rel(p.full_tensor(), ref_params[n]) for n, p in model.named_parameters()}
            steps.append({"grad": grads, "param": params})
        diffs[(quantize, act, mixed)] = steps
    return diffs


def test_fully_shard_trains_like_one_process():
    results = run_on_group(_fsdp_worker, world_size=2, timeout=120)
    for config, steps in results[0].items():
        assert len(steps) == STEPS
        for step, d in enumerate(steps):
            worst = max(v for kind in d.values() for v in kind.values())
            print(f"FSDP2 {config} step {step + 1}: max relative diff {worst:.3g} {d}")
            assert worst <= 1e-6, (config, step, d)
    assert results[0] == results[1]  # both ranks saw the same full tensors


# ------------------------------------------------------------------------------------ expert parallelism

CASES = ("an empty expert", "rank 1 receives no rows", "rank 1 sends no rows")


def _ep_batch(case: int, rank: int):
    g = torch.Generator().manual_seed(10 * case + rank)
    counts = torch.randint(1, 40, (E,), generator=g)
    if case == 0:
        counts[1] = 0
    if case == 1:
        counts[2:] = 0  # experts 2 and 3 live on rank 1
    if case == 2 and rank == 1:
        counts[:] = 0
    t = int(counts.sum())
    return 3 * torch.randn(t, D, generator=g), counts, torch.randn(t, D, generator=g)


def _one_process(full, batches, rank_order=None):
    """All experts in one process on all ranks' tokens in ``single_process_order`` (ranks in
    ``rank_order`` within each expert: a wrong order, to show that it matters): output and dx in the
    concatenated ranks' order."""
    order = rank_order or range(len(batches))
    counts = torch.stack([batches[r][1] for r in order])
    p = swiglu_ops.single_process_order(counts)
    xs = torch.cat([batches[r][0] for r in order]).requires_grad_()
    full.zero_grad()
    y = full(xs[p], swiglu_ops.counts_to_ends(counts.sum(0)))
    (y.float() * torch.cat([batches[r][2] for r in order])[p]).sum().backward()
    return torch.empty_like(y).index_copy(0, p, y), xs.grad


def _ep_worker(rank: int, world: int) -> dict:
    local = E // world
    lo, hi = rank * local, (rank + 1) * local
    checks = {}
    for quantize in (False, True):
        for act, glu in ACTIVATIONS.items():
            torch.manual_seed(0)
            full = swiglu_ops.MXFP8ExpertMLP(E, D, H, **glu, quantize=quantize)
            ep = swiglu_ops.ExpertParallelMLP.from_module(full)
            for case in range(len(CASES)):
                batches = [_ep_batch(case, r) for r in range(world)]
                x, counts, dy = batches[rank]
                x = x.clone().requires_grad_()
                ep.zero_grad()
                y = ep(x, swiglu_ops.counts_to_ends(counts))
                (y.float() * dy).sum().backward()
                y_ref, dx_ref = _one_process(full, batches)
                start = sum(b[0].shape[0] for b in batches[:rank])
                mine = slice(start, start + x.shape[0])
                checks[(quantize, act, CASES[case])] = {
                    "out": torch.equal(_bits(y), _bits(y_ref[mine])),
                    "dx": torch.equal(_bits(x.grad), _bits(dx_ref[mine])),
                    "dw1": torch.equal(_bits(ep.experts.w1.grad), _bits(full.w1.grad[lo:hi])),
                    "dw2": torch.equal(_bits(ep.experts.w2.grad), _bits(full.w2.grad[lo:hi])),
                }
            if quantize and act == "swiglu":  # ranks swapped within each expert: other weight gradients
                _one_process(full, [_ep_batch(0, r) for r in range(world)], rank_order=[1, 0])
                checks["swapped order gives other dW1"] = not torch.equal(
                    full.w1.grad, torch.cat(_gathered(ep.experts.w1.grad, world))
                )

    # dispatch/combine directly: local rows, an FP8 tensor (crosses the collectives as bytes), round trip
    batches = [_ep_batch(1, r) for r in range(world)]
    counts = batches[rank][1]
    x8 = batches[rank][0].to(torch.float8_e4m3fn)
    x_local, local_ends, plan = swiglu_ops.dispatch_tokens(x8, swiglu_ops.counts_to_ends(counts), E)
    want = torch.cat(  # expert by expert, then rank by rank
        [
            b[0].to(torch.float8_e4m3fn)[int(b[1][:e].sum()) : int(b[1][: e + 1].sum())]
            for e in range(lo, hi)
            for b in batches
        ]
    )
    checks["fp8 dispatch"] = x_local.dtype == x8.dtype and torch.equal(
        x_local.view(torch.uint8), want.view(torch.uint8)
    )
    checks["local rows"] = x_local.shape[0]
    checks["local ends"] = local_ends.tolist()
    back = swiglu_ops.combine_tokens(x_local, plan)
    checks["fp8 round trip"] = torch.equal(back.view(torch.uint8), x8.view(torch.uint8))

    # a rank without tokens whose x needs no gradient, and a sum() loss (its gradient of an empty y has
    # stride 0): the backward runs on every rank (it used to wait forever on rank 0 / fail on rank 1) and
    # gives the gradients of the run where that x requires grad
    torch.manual_seed(0)
    full = swiglu_ops.MXFP8ExpertMLP(E, D, H)
    x_mine = torch.randn(6, D) if rank == 0 else torch.empty(0, D)
    ends_mine = torch.tensor([3, 6, 6, 6]) if rank == 0 else torch.zeros(E, dtype=torch.int64)
    grads = []
    for needs_grad in (True, rank == 0):
        ep = swiglu_ops.ExpertParallelMLP.from_module(full)
        xr = x_mine.clone().requires_grad_(needs_grad)
        ep(xr, ends_mine).sum().backward()
        grads.append((xr.grad, ep.experts.w1.grad.clone(), ep.experts.w2.grad.clone()))
    (dx, dw1, dw2), (dx_b, dw1_b, dw2_b) = grads
    same_x = dx_b is None if rank == 1 else torch.equal(dx, dx_b)
    checks["no-token rank without grad"] = same_x and torch.equal(dw1, dw1_b) and torch.equal(dw2, dw2_b)

    # bad arguments fail on every rank before any collective (nothing hangs)
    x = batches[rank][0]
    ends = swiglu_ops.counts_to_ends(counts)
    with pytest.raises(ValueError, match="multiple of the world size"):
        swiglu_ops.dispatch_tokens(x, ends[:3], 3)
    with pytest.raises(ValueError, match="rise from 0"):
        swiglu_ops.dispatch_tokens(x[1:], ends, E)
    with pytest.raises(ValueError, match="cumulative token end per expert"):
        swiglu_ops.dispatch_tokens(x, ends[:2], E)
    with pytest.raises(TypeError, match="num_experts must be an int"):
        swiglu_ops.dispatch_tokens(x, ends, float(E))
    with pytest.raises(ValueError, match="positive multiple of the world size"):
        swiglu_ops.dispatch_tokens(x, ends, -2)
    with pytest.raises(ValueError, match="local experts"):
        swiglu_ops.ExpertParallelMLP(swiglu_ops.MXFP8ExpertMLP(E, D, H), E)
    # a DTensor x or group_ends (the expert MLP's rule: local tensors): a TypeError naming it, before any
    # collective (a DTensor x used to fail inside the second all_to_all, a DTensor group_ends in .tolist())
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    mesh = init_device_mesh("cpu", (world,))
    as_dtensor = lambda t: DTensor.from_local(t, mesh, [Replicate()], run_check=False)  # noqa: E731
    for name, args in (("x", (as_dtensor(x), ends)), ("group_ends", (x, as_dtensor(ends)))):
        with pytest.raises(TypeError, match=f"{name} is a DTensor"):
            swiglu_ops.dispatch_tokens(*args, E)
        with pytest.raises(TypeError, match=f"{name} is a DTensor"):
            swiglu_ops.ExpertParallelMLP.from_module(full)(*args)
    with pytest.raises(TypeError, match="y_local is a DTensor"):
        swiglu_ops.combine_tokens(as_dtensor(x_local.float()), plan)
    return checks


def _gathered(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return parts


def test_expert_parallel_is_bitwise_one_process():
    results = run_on_group(_ep_worker, world_size=2, timeout=120)
    for rank, checks in enumerate(results):
        for key in [k for k in checks if isinstance(k, tuple)]:
            assert all(checks[key].values()), (rank, key, checks[key])
        assert checks["swapped order gives other dW1"], rank
        assert checks["fp8 dispatch"] and checks["fp8 round trip"], rank
        assert checks["no-token rank without grad"], rank
    assert results[1]["local rows"] == 0 and results[1]["local ends"] == [0, 0]  # rank 1 received nothing
    assert results[0]["local rows"] > 0


def test_single_process_order_is_by_expert_then_rank():
    # rank 0: expert 0 -> row 0, expert 1 -> rows 1, 2; rank 1: expert 0 -> rows 3, 4, 5
    assert swiglu_ops.single_process_order(torch.tensor([[1, 2], [3, 0]])).tolist() == [0, 3, 4, 5, 1, 2]
    assert swiglu_ops.single_process_order(torch.zeros(2, 3, dtype=torch.int64)).tolist() == []
    with pytest.raises(ValueError, match=r"counts must be \[world, E\]"):
        swiglu_ops.single_process_order(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="counts must be"):
        swiglu_ops.single_process_order(torch.tensor([[1, -2]]))
    with pytest.raises(TypeError, match="counts must be an int64 or int32 tensor"):
        swiglu_ops.single_process_order(torch.ones(2, 2))


# --------------------------------------------------------------------------------------------- example


def test_example_runs_under_torchrun():
    src = str(Path(swiglu_ops.__file__).resolve().parents[1])  # the swiglu_ops this test imports
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    env["OMP_NUM_THREADS"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(EXAMPLE),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matches one process" in done.stdout, done.stdout
    assert done.stdout.count("expert parallel: 2 ranks x 2 experts") == 1  # printed by rank 0 only
