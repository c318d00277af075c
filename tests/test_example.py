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
