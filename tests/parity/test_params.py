"""Parameter sharding parity: every rank's parameter count of a real megatron-core GPTModel (CPU, gloo,
one process per rank) equals autotune's prediction for that rank's pipeline stage, exactly.

Widths are the real models' (hidden, heads, head dim, FFN, vocabulary); depth and expert count are cut
(the prediction uses the same shrunk ModelSpec). The model is built as the runner builds it
(runner.build.transformer_config and layer spec), weights left uninitialised (see parity_harness).
What is covered: dense and QKV sharding under TP (+SP), GQA, qk-norm, the attention output gate,
routers, routed experts under EP, ETP and both, shared experts and their gate, Gated DeltaNet and MLA
(DeepSeek-V3) with the TE stand-ins described in parity_harness, learned biases and attention sinks
(gpt-oss), dense leading layers, the padded vocabulary, untied and tied embeddings over PP (the last
stage's copy), the final norm on the last stage, VPP chunks.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from autotune.layout import Layout  # noqa: E402
from parity_harness import count_params, predicted_params, run_world, shrink  # noqa: E402

pytestmark = pytest.mark.slow

MODELS = {
    # Qwen3-30B-A3B widths: hidden 2048, 32 heads / 4 KV, head dim 128, expert FFN 768, vocab 151936
    "qwen3-30b": lambda: shrink("Qwen3-30B-A3B", 4, experts=8),
    "tiny-moe": lambda: shrink("tiny-moe", 4),
    # Llama-3.1-70B widths: hidden 8192, 64 heads / 8 KV, FFN 28672, vocab 128256
    "llama-70b": lambda: shrink("Llama-3.1-70B", 2),
    # Qwen3.5 hybrids: 3 Gated DeltaNet layers + 1 gated full attention (qk-norm, head dim 256); MoE with a
    # gated shared expert (35B-A3B, 122B-A10B), dense with tied embeddings (0.8B)
    "qwen3.5-35b": lambda: shrink("Qwen3.5-35B-A3B", 4, experts=8),
    "qwen3.5-122b": lambda: shrink("Qwen3.5-122B-A10B", 4, experts=8),
    "qwen3.5-0.8b": lambda: shrink("Qwen3.5-0.8B", 4),
    # DeepSeek-V3 widths: MLA, one leading dense layer, shared expert, router correction bias
    "deepseek-v3": lambda: shrink("DeepSeek-V3", 4, experts=8, first_dense=1),
    # gpt-oss-120b widths: biases everywhere, attention sinks, sliding-window layers
    "gpt-oss-120b": lambda: shrink("gpt-oss-120b", 4, experts=8),
}

CASES = [
    ("qwen3-30b", Layout(world=2)),  # TP1 baseline (DP2)
    ("qwen3-30b", Layout(world=2, tp=2)),  # TP2 + SP, experts whole on each TP rank (ETP1)
    ("qwen3-30b", Layout(world=2, ep=2)),
    ("qwen3-30b", Layout(world=2, pp=2)),
    ("qwen3-30b", Layout(world=4, tp=2, ep=2, etp=2)),
    ("qwen3-30b", Layout(world=4, ep=2, etp=2)),
    ("qwen3-30b", Layout(world=4, pp=2, vpp=2, ep=2)),
    ("tiny-moe", Layout(world=2, tp=2)),
    ("tiny-moe", Layout(world=2, ep=2)),
    ("tiny-moe", Layout(world=4, pp=2, ep=2)),
    ("llama-70b", Layout(world=2)),
    ("llama-70b", Layout(world=2, tp=2)),
    ("llama-70b", Layout(world=2, pp=2)),
    ("qwen3.5-35b", Layout(world=2, tp=2)),
    ("qwen3.5-35b", Layout(world=4, tp=2, ep=2, etp=2)),
    ("qwen3.5-122b", Layout(world=4, pp=2, ep=2)),
    ("qwen3.5-0.8b", Layout(world=2, pp=2)),
    ("qwen3.5-0.8b", Layout(world=4, tp=2, pp=2)),
    ("deepseek-v3", Layout(world=2, ep=2)),
    ("deepseek-v3", Layout(world=4, tp=2, ep=2, etp=2)),
    ("deepseek-v3", Layout(world=2, pp=2)),
    ("gpt-oss-120b", Layout(world=2, tp=2)),
    # EP with ETP 1: megatron-core asserts ETP 1 for experts with biases (TransformerConfig.__post_init__; the
    # harness's setattr of add_bias_linear after it had let an ETP 2 model be built that Megatron refuses)
    ("gpt-oss-120b", Layout(world=4, ep=2)),
]


def _id(case) -> str:
    name, lay = case
    return f"{name}-{lay.label().replace(' ', '-')}" + ("-SP" if lay.sp else "")


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_rank_parameter_counts_match_megatron(case):
    name, layout = case
    model = MODELS[name]()
    ranks = run_world(layout, count_params, model, layout)
    rows = [(r, got["pp"], got["count"], predicted_params(model, layout, got["pp"])) for r, got in enumerate(ranks)]
    wrong = [row for row in rows if row[2] != row[3]]
    assert not wrong, "rank, stage, megatron, autotune: " + "; ".join(
        f"{r} {s} {m:,} {p:,.0f} ({m - p:+,.0f})" for r, s, m, p in wrong)
    # ranks of one stage agree (the check above would hide a rank whose stage index is wrong)
    for stage in {s for _, s, _, _ in rows}:
        assert len({m for _, s, m, _ in rows if s == stage}) == 1
