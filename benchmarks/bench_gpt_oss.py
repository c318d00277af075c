"""One training step (forward, loss, backward) of a small randomly initialised Hugging Face GPT-OSS model on
CPU, with and without ``swiglu_ops.integrations.patch_gpt_oss``. Needs ``pip install "swiglu-ops[hf]"``.

python benchmarks/bench_gpt_oss.py [--size tiny|small] [--steps N] [--backend auto] [--impl eager ...]

Prints the median step time over ``--steps`` timed steps (after two warm-up steps; the two models take
turns step by step) per dtype and expert implementation. ``tiny`` is the model of tests/test_gpt_oss_hf.py;
``small`` is wider so that the expert activation is a measurable part of the step.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

_COMMON = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2)
SIZES = {
    "tiny": dict(
        _COMMON, hidden_size=32, intermediate_size=16, head_dim=8, num_local_experts=4, tokens=(2, 16)
    ),
    "small": dict(
        _COMMON, hidden_size=256, intermediate_size=512, head_dim=64, num_local_experts=8, tokens=(4, 256)
    ),
}


def build(size: str, impl: str):
    from transformers import GptOssConfig, GptOssForCausalLM

    params = dict(SIZES[size])
    tokens = params.pop("tokens")
    config = GptOssConfig(
        vocab_size=256,
        max_position_embeddings=1024,
        sliding_window=64,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        experts_implementation=impl,
        **params,
    )
    torch.manual_seed(0)
    model = GptOssForCausalLM(config).train()
    with torch.no_grad():
        for layer in model.model.layers:  # reach the clamp, as in tests/test_gpt_oss_hf.py
            layer.mlp.experts.gate_up_proj.normal_(0.0, 1.0 / params["hidden_size"] ** 0.5 * 5)
    ids = torch.randint(0, 256, tokens, generator=torch.Generator().manual_seed(1))
    return model, ids


def step_times(models, ids, steps: int) -> list[float]:
    """Median time of one training step per model; the models take turns, step by step, so that load changes
    on a shared machine hit all of them alike."""

    def step(model):
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    for model in models:
        for _ in range(2):
            step(model)
    times = [[] for _ in models]
    for _ in range(steps):
        for model, record in zip(models, times, strict=True):
            start = time.perf_counter()
            step(model)
            record.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main(argv=None) -> int:
    from swiglu_ops.integrations import patch_gpt_oss

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--impl", nargs="+", default=["eager", "grouped_mm"])
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    print(f"size {args.size}, {threads} threads, backend {args.backend!r}, median of {args.steps} steps")
    print(f"{'experts':>10} {'dtype':>9} {'HF eager (ms)':>14} {'patched (ms)':>13} {'ratio':>6}")
    for impl in args.impl:
        base, ids = build(args.size, impl)
        for dtype in (torch.float32, torch.bfloat16):
            hf = copy.deepcopy(base).to(dtype)
            fused = patch_gpt_oss(copy.deepcopy(hf), backend=args.backend)
            t_hf, t_fused = step_times([hf, fused], ids, args.steps)
            name = str(dtype).removeprefix("torch.")
            print(f"{impl:>10} {name:>9} {t_hf * 1e3:14.2f} {t_fused * 1e3:13.2f} {t_fused / t_hf:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
