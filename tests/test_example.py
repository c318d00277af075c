"""The MoE example runs (small settings), trains in bf16 and MXFP8, and its MXFP8 gradients track bf16."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "moe_expert_mlp.py"


def load_example():
    spec = importlib.util.spec_from_file_location("moe_expert_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_trains_and_mxfp8_gradients_track_bf16(capsys):
    results = load_example().main(["--tokens", "192", "--steps", "8", "--backend", "cpu"])
    out = capsys.readouterr().out
    assert "== SwiGLU ==" in out and "== GPT-OSS" in out and "MXFP8 loss" in out and "groups along K" in out
    for variant in ("swiglu", "gpt_oss"):
        losses, errors = results[variant]["losses"], results[variant]["grad_errors"]
        for name, history in losses.items():
            assert history[-1] < 0.6 * history[0], (variant, name, history)
        assert abs(losses["mxfp8"][-1] - losses["bf16"][-1]) < 0.05 * losses["bf16"][-1]
        for name in ("x", "experts.w1", "experts.w2"):  # E4M3 in both operands of the GEMMs: ~3-4 %
            assert 0.005 < errors[name] < 0.08, (variant, name, errors)
        assert errors["router"] < 0.05, (variant, errors)


def test_example_trains_under_torch_compile_with_the_eager_losses(capsys):
    """--compile: the MXFP8 GEMMs' FP8 operands stay in the compiled graph, forward and backward, and the
    MXFP8 training curve equals the eager one bit for bit. The bf16 baseline's activation is plain PyTorch
    arithmetic, which Inductor fuses (fp32 intermediates): its curve agrees to rounding only."""
    example = load_example()
    args = ["--tokens", "96", "--steps", "3", "--experts", "3", "--backend", "cpu"]
    eager = example.main(args)
    compiled = example.main([*args, "--compile"])
    for variant in ("swiglu", "gpt_oss"):
        assert compiled[variant]["losses"]["mxfp8"] == eager[variant]["losses"]["mxfp8"], variant
        for got, want in zip(
            compiled[variant]["losses"]["bf16"], eager[variant]["losses"]["bf16"], strict=True
        ):
            assert abs(got - want) <= 1e-5 * want, variant
