"""The MoE example runs (small settings), trains, and its MXFP8 gradients stay close to the bf16 ones."""

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
    results = load_example().main(["--tokens", "192", "--steps", "8", "--backend", "reference"])
    out = capsys.readouterr().out
    assert "relative error of MXFP8 vs bf16 gradients" in out and "bf16  loss" in out and "mxfp8 loss" in out
    for name, history in results["losses"].items():
        assert history[-1] < 0.5 * history[0], (name, history)
    assert 0 < results["grad_errors"]["up"] < 0.06  # E4M3: ~2-3 % relative per element
    assert results["grad_errors"]["router"] < 0.02
    assert 0 < results["wgrad_error"] < 0.02
