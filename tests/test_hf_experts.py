"""The transformers experts implementations ``"swiglu_ops"`` and ``"swiglu_ops_mxfp8"``
(:mod:`swiglu_ops.integrations.hf`) on tiny, randomly initialised GPT-OSS and Qwen3-MoE models (no hub):

- fp32 training step (loss, logits, every parameter gradient) of ``"swiglu_ops"`` against transformers' own
  ``"grouped_mm"``, through ``from_pretrained(..., experts_implementation=...)``;
- ``set_experts_implementation`` back and forth (bit-equal results when back on ``"grouped_mm"``);
- ``"swiglu_ops_mxfp8"`` training a few bf16 steps: finite gradients for every parameter, decreasing loss;
- clear errors for what the implementations do not compute; ``import swiglu_ops`` without transformers.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _lazy import assert_imported_only_on_access  # noqa: E402
from test_gpt_oss_hf import training_step  # noqa: E402  (one step on the same INPUT_IDS)
from transformers import (  # noqa: E402
    GptOssConfig,
    GptOssForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS  # noqa: E402

import swiglu_ops  # noqa: E402
import swiglu_ops.integrations.hf as hf  # noqa: E402

VOCAB = 64


def gpt_oss(experts_implementation="grouped_mm", **over):
    """2 layers, hidden 64, 4 experts of intermediate 32 (2I = 64: MX blocks fit). The expert weights are
    scaled up so that gates beyond the limit 7 and up values beyond +-7 occur (HF's 0.02 init never
    reaches the clamp; checked in test_gpt_oss_clamps_are_exercised)."""
    torch.manual_seed(0)
    config = GptOssConfig(**{
        **dict(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
            num_experts_per_tok=2, max_position_embeddings=64, sliding_window=8,
            rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        ),
        **over,
        "experts_implementation": experts_implementation,
    })  # fmt: skip
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            experts = layer.mlp.experts
            experts.gate_up_proj.normal_(0.0, 1.0)
            experts.gate_up_proj_bias.normal_(0.0, 1.0)
            experts.down_proj.normal_(0.0, 0.1)
            experts.down_proj_bias.normal_(0.0, 0.1)
            layer.mlp.router.weight.normal_(0.0, 0.5)
    return model.train()


def qwen3_moe(experts_implementation="grouped_mm", **over):
    """2 layers, hidden 64, 8 experts of intermediate 32, top-2; plain SwiGLU ``silu(gate) * up``."""
    torch.manual_seed(0)
    config = Qwen3MoeConfig(**{
        **dict(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
            num_experts_per_tok=2, max_position_embeddings=64,
        ),
        **over,
        "experts_implementation": experts_implementation,
    })  # fmt: skip
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.normal_(0.0, 0.5)
            layer.mlp.experts.down_proj.normal_(0.0, 0.2)
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return model.train()


MODELS = {"gpt_oss": gpt_oss, "qwen3_moe": qwen3_moe}


def as_list(step):
    loss, logits, grads = step
    return [("loss", loss), ("logits", logits)] + sorted(grads.items())


def assert_fp32_parity(got, expected):
    """Elementwise ``|got - expected| <= 1e-5 |expected| + atol``. The activation differs from HF's by a few
    fp32 ulp (clipped_swiglu rounds once), and through two layers the differences stay at fp32 rounding of
    each tensor's scale (measured max |got - expected| <= 5.3e-7 of the tensor's largest magnitude). rtol
    alone cannot hold for elements that are sums cancelling to near 0 (gradients summing terms of both
    signs over tokens): their absolute error is set by the summed terms, not by the result (measured up to
    2e-4 relative on elements above 1e-3 of the largest). atol covers those: 1e-6 of the tensor's largest
    magnitude (about 8 fp32 ulp of it; the largest atol any element needs at rtol 1e-5 measured 3.4e-7
    of it), per tensor because the gradients' scales span 1e-6 to 1."""
    assert [n for n, _ in as_list(got)] == [n for n, _ in as_list(expected)]
    for (name, g), (_, e) in zip(as_list(got), as_list(expected), strict=True):
        atol = 1e-6 * float(e.abs().max())
        torch.testing.assert_close(g, e, rtol=1e-5, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.fixture
def count_calls(monkeypatch):
    """Records the calls of public swiglu_ops functions that the implementations make (they look them up on
    the package at call time), with grad enabled, and the grad_fn of each result."""
    calls = {}

    def wrap(name):
        original = getattr(hf, name)  # the names the integration calls

        def counting(*args, **kwargs):
            out = original(*args, **kwargs)
            if torch.is_grad_enabled():  # not the activation check's probe (hf._check_activation)
                calls.setdefault(name, []).append(type(out.grad_fn).__name__ if out.grad_fn else None)
            return out

        monkeypatch.setattr(hf, name, counting)

    for name in ("clipped_swiglu", "mxfp8_expert_mlp"):
        wrap(name)
    return calls


def test_registered_and_lazily_exported():
    assert {"swiglu_ops", "swiglu_ops_mxfp8"} <= set(ALL_EXPERTS_FUNCTIONS)
    assert ALL_EXPERTS_FUNCTIONS["swiglu_ops"] is hf.swiglu_ops_experts_forward
    assert swiglu_ops.integrations.hf is hf
    hf.register()  # idempotent
    assert ALL_EXPERTS_FUNCTIONS["swiglu_ops_mxfp8"] is hf.mxfp8_experts_forward


def test_import_swiglu_ops_does_not_import_transformers():
    assert_imported_only_on_access("hf", "transformers")


def test_gpt_oss_clamps_are_exercised():
    """The GPT-OSS parity test only means something if both clamps act: recorded from HF's activation."""
    model = gpt_oss()
    h = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        original = type(experts)._apply_gate
        experts._apply_gate = lambda gu, e=experts, f=original: (h.append(gu.detach()), f(e, gu))[1]
    training_step(model)
    gate_up = torch.cat(h)
    assert float((gate_up[:, 0::2] > 7).float().mean()) > 0.05
    assert float((gate_up[:, 1::2].abs() > 7).float().mean()) > 0.05


@pytest.mark.parametrize("family", list(MODELS))
def test_fp32_training_step_matches_grouped_mm(family, tmp_path, count_calls):
    """from_pretrained(..., experts_implementation="swiglu_ops") vs transformers' "grouped_mm", same weights:
    loss, logits and every parameter gradient (assert_fp32_parity); the fused activation ran with its
    fused backward in every expert layer."""
    MODELS[family]().save_pretrained(tmp_path)
    cls = type(MODELS[family]())
    expected = training_step(cls.from_pretrained(tmp_path, experts_implementation="grouped_mm").train())
    model = cls.from_pretrained(tmp_path, experts_implementation="swiglu_ops").train()
    assert model.config._experts_implementation == "swiglu_ops"
    got = training_step(model)
    assert count_calls["clipped_swiglu"] == ["ClippedSwigluFunctionBackward"] * 2
    assert len(got[2]) == len(list(model.parameters()))
    assert_fp32_parity(got, expected)


@pytest.mark.parametrize("family", list(MODELS))
def test_set_experts_implementation_back_and_forth(family, count_calls):
    model = MODELS[family]()
    first = training_step(model)
    model.set_experts_implementation("swiglu_ops")
    fused = training_step(model)
    assert len(count_calls.pop("clipped_swiglu")) == 2
    assert_fp32_parity(fused, first)
    model.set_experts_implementation("grouped_mm")
    again = training_step(model)
    assert not count_calls
    for (name, a), (_, b) in zip(as_list(again), as_list(first), strict=True):
        assert torch.equal(a, b), name
    model.set_experts_implementation("swiglu_ops")
    assert_fp32_parity(training_step(model), first)
    model.to(torch.bfloat16).set_experts_implementation("swiglu_ops_mxfp8")
    assert model.config._experts_implementation == "swiglu_ops_mxfp8"
    training_step(model)
    assert len(count_calls["mxfp8_expert_mlp"]) == 2


@pytest.mark.parametrize("family", list(MODELS))
def test_bf16_swiglu_ops_close_to_grouped_mm(family):
    """bf16: the fused activation rounds once where eager bf16 rounds every op, so the two differ by bf16
    rounding; the loss within 1 %."""
    model = MODELS[family]().to(torch.bfloat16)
    expected = training_step(model)
    model.set_experts_implementation("swiglu_ops")
    got = training_step(model)
    assert all(bool(g.isfinite().all()) for g in got[2].values())
    assert abs(float(got[0]) - float(expected[0])) <= 0.01 * float(expected[0])


@pytest.mark.parametrize("family", list(MODELS))
def test_mxfp8_trains_in_bf16(family, count_calls):
    """ "swiglu_ops_mxfp8": every parameter gets a finite gradient (GPT-OSS's expert biases included) and
    Adam on one fixed batch lowers the loss; its first loss is within 5 % of bf16 grouped_mm's."""
    model = MODELS[family]().to(torch.bfloat16)
    reference_loss = float(training_step(model)[0])
    model.set_experts_implementation("swiglu_ops_mxfp8")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(4):
        loss, _, grads = training_step(model)
        assert len(grads) == len(list(model.parameters()))
        assert all(bool(g.isfinite().all()) for g in grads.values())
        losses.append(float(loss))
        optimizer.step()
    assert count_calls["mxfp8_expert_mlp"] == ["_ExpertMLPFunctionBackward"] * 2 * 4
    assert abs(losses[0] - reference_loss) <= 0.05 * reference_loss
    assert losses[-1] < losses[0] and all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses


def test_unsupported_configs_are_clear_errors():
    gelu = qwen3_moe(hidden_act="gelu")
    gelu.set_experts_implementation("swiglu_ops")
    with pytest.raises(NotImplementedError, match="only SiLU is supported"):
        training_step(gelu)
    fp32 = qwen3_moe("swiglu_ops_mxfp8")
    with pytest.raises(NotImplementedError, match="needs a bf16 model"):
        training_step(fp32)
    odd = gpt_oss("swiglu_ops_mxfp8", intermediate_size=48).to(torch.bfloat16)
    with pytest.raises(NotImplementedError, match="multiple of 32"):
        training_step(odd)
    ep = gpt_oss("swiglu_ops")
    ep.model.layers[0].mlp.experts._is_expert_parallel = True
    with pytest.raises(NotImplementedError, match="expert parallel"):
        training_step(ep)
    with pytest.raises(ValueError, match="swiglu_ops_nope"):
        qwen3_moe().set_experts_implementation("swiglu_ops_nope")


def test_the_activation_check_sees_a_far_bound_and_a_changed_act_fn():
    """A bound of the class's own on gate and up beyond the probe's near range that no attribute declares
    (the probe used to span |x| <= 12 only: DeepSeek-V4's swiglu_limit = 16 ran as plain SwiGLU, wrong),
    and an act_fn swapped after the first call (the check was cached by the parameters alone): both
    refused."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    class Bounded(Qwen3MoeExperts):
        def _apply_gate(self, gate_up):
            gate, up = gate_up.chunk(2, dim=-1)
            return self.act_fn(gate.clamp(max=16.0)) * up.clamp(-16.0, 16.0)

    experts = Bounded(qwen3_moe().config)
    experts.config._experts_implementation = "swiglu_ops"
    x, idx, w = torch.randn(16, 64), torch.randint(0, 8, (16, 2)), torch.rand(16, 2)
    with pytest.raises(NotImplementedError, match="gated activation is not"):
        experts(x, idx, w)
    model = qwen3_moe("swiglu_ops")
    training_step(model)  # checked and cached
    for module in model.modules():
        if hasattr(module, "act_fn") and hasattr(module, "gate_up_proj"):
            module.act_fn = torch.nn.GELU()
    with pytest.raises(NotImplementedError, match="only SiLU is supported"):
        training_step(model)


def test_the_activation_check_sees_an_instance_override():
    """transformers' own implementations call ``self._apply_gate``, an override set on the instance
    included: "swiglu_ops" checks that one too (it checked the class's and ran the fused SwiGLU where
    grouped_mm ran the override: 4.2 apart on outputs of 141); patch_gpt_oss's fused one counts as the
    class's."""
    import types

    model = qwen3_moe("swiglu_ops")
    training_step(model)  # checked and cached with the class's activation
    for module in model.modules():
        if hasattr(module, "act_fn") and hasattr(module, "gate_up_proj"):
            module._apply_gate = types.MethodType(
                lambda self, gu: torch.nn.functional.gelu(gu.chunk(2, -1)[0]) * gu.chunk(2, -1)[1], module
            )
    with pytest.raises(NotImplementedError, match="gated activation is not"):
        training_step(model)
    patched = swiglu_ops.integrations.patch_gpt_oss(gpt_oss())
    patched.set_experts_implementation("swiglu_ops")
    training_step(patched)  # the fused gate of patch_gpt_oss: accepted


def test_patch_gpt_oss_and_the_registered_implementation_agree():
    """patch_gpt_oss (the activation swapped inside HF's own paths) and "swiglu_ops" run the same fused
    function: the same step, up to the fp32 tolerance (their GEMM paths are HF's and the same)."""
    base = gpt_oss()
    patched = swiglu_ops.integrations.patch_gpt_oss(copy.deepcopy(base))
    fused = copy.deepcopy(base)
    fused.set_experts_implementation("swiglu_ops")
    assert_fp32_parity(training_step(fused), training_step(patched))


def test_without_a_grouped_mm_kernel_transformers_fallback_op_runs(monkeypatch):
    """Where torch's grouped_mm cannot run (here: as on torch < 2.9 CPU), the GEMMs go to transformers' own
    fallback op, as its grouped_mm path does; same results within the fp32 tolerance."""
    model = qwen3_moe()
    expected = training_step(model)
    monkeypatch.setattr(hf, "_CPU_GROUPED_MM", False)
    fallback = torch.ops.transformers.grouped_mm_fallback
    calls = []
    monkeypatch.setattr(
        torch.ops.transformers, "grouped_mm_fallback", lambda *a, **k: calls.append(1) or fallback(*a, **k)
    )
    model.set_experts_implementation("swiglu_ops")
    assert_fp32_parity(training_step(model), expected)
    assert len(calls) == 4  # two GEMMs in each of the two layers


@pytest.mark.parametrize("family", ["deepseek_v4", "hy_v4", "minimax_m3_vl"])
@pytest.mark.parametrize("limit", [10.0, 16.0])
def test_clamped_swiglu_experts_match_grouped_mm(family, limit):
    """DeepSeek-V4's and HY-V4's silu(min(gate, L)) * clip(up, -L, L) (limit / swiglu_limit, no alpha) run
    on the fused operator as clipped_swiglu with alpha 1 and bias 0, MiniMax-M3's GPT-OSS activation on
    concatenated halves (swiglu_alpha / swiglu_limit) with bias 1: output, input and weight gradients as
    transformers' grouped_mm computes them (fp32)."""
    sizes = dict(
        hidden_size=64, moe_intermediate_size=32, num_experts=4, num_local_experts=4, swiglu_limit=limit
    )
    if family == "deepseek_v4":
        from transformers import DeepseekV4Config as Config
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts as Experts
    elif family == "hy_v4":
        from transformers import HYV4Config as Config
        from transformers.models.hy_v4.modeling_hy_v4 import HYV4Experts as Experts
    else:
        from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import (
            MiniMaxM3VLTextConfig as Config,
        )
        from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLExperts as Experts

        sizes.update(intermediate_size=32, swiglu_alpha=1.702)
    torch.manual_seed(0)
    experts = Experts(Config(**sizes))
    with torch.no_grad():
        experts.gate_up_proj.normal_(0.0, 1.0)  # gate and up well past the bound
        experts.down_proj.normal_(0.0, 0.1)
    x, idx, w = torch.randn(16, 64), torch.randint(0, 4, (16, 2)), torch.rand(16, 2)

    def run(impl):
        experts.config._experts_implementation = impl
        experts.zero_grad()
        xr = x.clone().requires_grad_()
        out = experts(xr, idx, w)
        out.sum().backward()
        return out.detach(), xr.grad, experts.gate_up_proj.grad.clone(), experts.down_proj.grad.clone()

    want, got = run("grouped_mm"), run("swiglu_ops")
    for name, a, b in zip(("out", "dx", "d gate_up", "d down"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()), msg=name)
    # "swiglu_ops_mxfp8" (bf16): the same clamps on the MX operators, so within MXFP8's error of grouped_mm
    # (it once dropped a bound without GPT-OSS's bias: 20x the output's size off)
    experts.to(torch.bfloat16)
    x, w = x.bfloat16(), w.bfloat16()
    want, got = run("grouped_mm"), run("swiglu_ops_mxfp8")
    for name, a, b in zip(("out", "dx", "d gate_up", "d down"), got, want, strict=True):
        error = float((a.float() - b.float()).norm() / b.float().norm())
        assert error < 0.08, (name, error)
