"""Rope scaling in MODEL_ARGS, as Megatron-LM 1dcf0daf (slime's pin) reads it from the command line.

Llama 3.x's llama3 scaling is --use-rope-scaling (arguments.py:1684), whose shape is fixed in code
(rotary_pos_embedding.py:92-98: low_freq_factor 1, high_freq_factor 4, 8192 original positions) and whose factor is
GPTModel's default 8 (gpt_model.py:106): slime's model provider passes `rope_scaling` alone (model_provider.py:216 at
a897e1f), so --rope-scaling-factor (arguments.py:1686) only restates it; other values are a note, not the flag. MLA
takes YaRN from --rope-type (arguments.py:2074), --rotary-scaling-factor, --mscale, --mscale-all-dim
(arguments.py:2768-2773, defaults 1, 1, 0, which replace MLATransformerConfig's 40, 1, 0: core_transformer_config_from_args
copies every same-named argument, arguments.py:1343-1345); original positions, beta_fast and beta_slow have no flag
(MLATransformerConfig: 4096, 32, 1, transformer_config.py:2086-2093). An MLA model without scaling says --rope-type rope,
which MLATransformerConfig accepts only with rope fusion off (transformer_config.py:2108-2109) while the parser leaves
it on (--no-rope-fusion, arguments.py:2070-2073).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from importlib import resources
from pathlib import Path

import pytest

from autotune.catalog import load_model
from autotune.launch import model_notes, rope_args, slime_model_args

ROPE_FLAGS = {"--use-rope-scaling", "--rope-scaling-factor", "--rope-type", "--rotary-scaling-factor", "--mscale",
              "--mscale-all-dim", "--no-rope-fusion"}

# Qwen3.5-122B-A10B's MODEL_ARGS before rope scaling was emitted (the seed's stack): must not move.
QWEN35_122B = [
    "--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec", "--disable-bias-linear", "--qk-layernorm",
    "--group-query-attention", "--num-attention-heads", "32", "--num-query-groups", "2", "--kv-channels", "256",
    "--num-layers", "48", "--hidden-size", "3072", "--ffn-hidden-size", "1024", "--use-gated-attention",
    "--normalization", "RMSNorm", "--apply-layernorm-1p", "--position-embedding-type", "rope", "--norm-epsilon",
    "1e-6", "--rotary-percent", "0.25", "--swiglu", "--untie-embeddings-and-output-weights", "--vocab-size", "248320",
    "--rotary-base", "10000000", "--moe-ffn-hidden-size", "1024", "--moe-shared-expert-intermediate-size", "1024",
    "--moe-router-score-function", "softmax", "--moe-token-dispatcher-type", "alltoall", "--moe-router-topk", "8",
    "--moe-layer-freq", "[1]*48", "--num-experts", "256", "--moe-grouped-gemm", "--moe-token-drop-policy", "probs",
    "--moe-router-dtype", "fp32", "--moe-permute-fusion", "--moe-aux-loss-coeff", "0", "--attention-output-gate",
    "--moe-shared-expert-gate", "--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "4",
    "--linear-conv-kernel-dim", "4", "--linear-key-head-dim", "128", "--linear-value-head-dim", "128",
    "--linear-num-key-heads", "16", "--linear-num-value-heads", "64",
]


def _rope(args: list[str]) -> list[str]:
    """The rope-scaling words of MODEL_ARGS, in order, each flag with its value."""
    out: list[str] = []
    for i, w in enumerate(args):
        if w in ROPE_FLAGS:
            out.append(w)
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                out.append(args[i + 1])
    return out


def _variant(tmp_path, base: str, **changes):
    """`base`'s catalog config.json with top-level keys changed (None: removed), loaded from a file."""
    cfg = json.loads((resources.files("autotune.catalog") / "data" / "models" / f"{base}.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path = tmp_path / f"{base}-variant.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


def test_qwen35_model_args_are_unchanged():
    assert slime_model_args(load_model("Qwen3.5-122B-A10B")) == QWEN35_122B


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-4-Scout-17B-16E"])
def test_llama3_rope_scaling_is_megatrons(name):
    args = slime_model_args(load_model(name))
    assert _rope(args) == ["--use-rope-scaling", "--rope-scaling-factor", "8"]
    assert args[args.index("--rotary-base") + 1] == "500000" and rope_args(load_model(name))[1] == []


def test_llama_without_rope_scaling_gets_none():
    for name in ("Llama-4-Maverick-17B-128E", "Llama-2-7b-hf", "Mixtral-8x7B-v0.1", "Qwen3-30B-A3B"):
        assert _rope(slime_model_args(load_model(name))) == [], name
        assert rope_args(load_model(name))[1] == [], name


@pytest.mark.parametrize("change, said", [
    ({"factor": 16.0}, "factor 16"),
    ({"original_max_position_embeddings": 4096}, "original_max_position_embeddings 4096"),
    ({"low_freq_factor": 2.0, "high_freq_factor": 8.0}, "low_freq_factor 2, high_freq_factor 8"),
])
def test_other_llama3_values_are_a_note_not_the_flag(tmp_path, change, said):
    scaling = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
               "rope_type": "llama3", **change}
    m = _variant(tmp_path, "Llama-3.1-8B", rope_scaling=scaling)
    assert _rope(slime_model_args(m)) == []
    (note,) = model_notes(m)
    assert said in note and "--use-rope-scaling applies factor 8" in note and "plain RoPE" in note


def test_deepseek_v3_takes_its_yarn():
    m = load_model("DeepSeek-V3")
    args = slime_model_args(m)
    assert _rope(args) == ["--rope-type", "yarn", "--rotary-scaling-factor", "40", "--mscale", "1",
                           "--mscale-all-dim", "1", "--no-rope-fusion"]  # as slime's deepseek-v3.sh
    assert args[args.index("--rotary-base") + 1] == "10000"
    assert "--qk-layernorm" in args  # MLA's latent norms: without it Megatron builds MLA without q_a / kv_a norms
    # original positions 4096, beta_fast 32, beta_slow 1: MLATransformerConfig's own values, nothing to say
    assert model_notes(m) == []


def test_kimi_k2_takes_its_yarn_and_a_note_for_beta_fast():
    m = load_model("Kimi-K2-Instruct")
    args = slime_model_args(m)
    assert _rope(args) == ["--rope-type", "yarn", "--rotary-scaling-factor", "32", "--mscale", "1",
                           "--mscale-all-dim", "1", "--no-rope-fusion"]
    assert args[args.index("--rotary-base") + 1] == "50000" and "--qk-layernorm" in args
    (note,) = model_notes(m)
    assert "beta_fast 1 is not settable" in note and "beta_fast 32" in note and "beta_slow" not in note


def test_mla_without_rope_scaling_says_plain_rope(tmp_path):
    """No rope_scaling on an MLA model: --rope-type rope (not MLA's default yarn) with --no-rope-fusion."""
    m = _variant(tmp_path, "Kimi-K2-Instruct", rope_scaling=None)
    assert m.mla is not None
    args = slime_model_args(m)
    assert _rope(args) == ["--rope-type", "rope", "--no-rope-fusion"] and model_notes(m) == []
    assert not {"--rotary-scaling-factor", "--mscale", "--mscale-all-dim"} & set(args)


def test_mla_yarn_fields_without_a_flag_are_notes(tmp_path):
    scaling = {"beta_fast": 16, "beta_slow": 2, "factor": 4, "original_max_position_embeddings": 8192, "type": "yarn"}
    m = _variant(tmp_path, "DeepSeek-V3", rope_scaling=scaling)
    assert _rope(slime_model_args(m)) == ["--rope-type", "yarn", "--rotary-scaling-factor", "4", "--mscale", "1",
                                          "--mscale-all-dim", "0", "--no-rope-fusion"]  # the parser's mscale_all_dim
    (note,) = model_notes(m)
    assert "original_max_position_embeddings 8192, beta_fast 16, beta_slow 2 are not settable" in note
    assert "original_max_position_embeddings 4096, beta_fast 32, beta_slow 1 (MLATransformerConfig's defaults)" in note


def test_rope_flags_are_in_megatrons_parser():
    known = set(Path(__file__).with_name("megatron_flags.txt").read_text().split())
    assert ROPE_FLAGS <= known
    for name in ("DeepSeek-V3", "Kimi-K2-Instruct", "Llama-3.1-8B"):
        flags = {w for w in rope_args(load_model(name))[0] if w.startswith("--")}
        assert flags and flags <= ROPE_FLAGS, name


def test_megatron_core_fixes_what_the_flags_cannot_say():
    """megatron-core 0.16.1 (the runner's; the same code as Megatron-LM 1dcf0daf here): llama3 scaling's fixed shape and
    factor, MLA's YaRN defaults, and MLA refusing plain rope beside rope fusion."""
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    from autotune.launch.model_args import _LLAMA3, _MLA_YARN_FIXED

    fixed = {k: p.default for k, p in inspect.signature(RotaryEmbedding._apply_scaling).parameters.items()
             if k not in ("self", "freqs")}
    assert {k: float(v) for k, v in fixed.items()} == _LLAMA3
    assert inspect.signature(GPTModel.__init__).parameters["rope_scaling_factor"].default == _LLAMA3["factor"]
    defaults = {f.name: f.default for f in dataclasses.fields(MLATransformerConfig)}
    assert {k: float(defaults[k]) for k in _MLA_YARN_FIXED} == _MLA_YARN_FIXED and defaults["rope_type"] == "yarn"
    base = dict(num_layers=1, hidden_size=64, num_attention_heads=4, kv_channels=16, use_cpu_initialization=True)
    with pytest.raises(ValueError, match="only works with YARN"):
        MLATransformerConfig(**base, rope_type="rope", apply_rope_fusion=True)
    MLATransformerConfig(**base, rope_type="rope", apply_rope_fusion=False)


def test_a_config_without_an_epsilon_takes_its_config_class_default():
    """GPT-3 (gpt2) and Nemotron configs name no epsilon: HF's GPT2Config / NemotronConfig default, 1e-5 (Megatron's
    own default too), not the RMSNorm families' 1e-6."""
    from autotune.launch.model_args import norm_epsilon

    for name, eps in (("Megatron-GPT-7.1B", 1e-5), ("Nemotron-4-340B", 1e-5), ("Qwen3.5-2B", 1e-6)):
        m = load_model(name)
        args = slime_model_args(m)
        assert norm_epsilon(m) == eps and args[args.index("--norm-epsilon") + 1] == f"{eps:g}".replace("e-0", "e-"), name


def test_llama4_says_its_nope_layers_qk_l2_norm_and_input_scaled_experts():
    """Scout: every 4th layer skips RoPE (HF no_rope_layers [1, 1, 1, 0] x 12: 1 where a layer takes it; Megatron's
    --no-rope-freq 4 skips layer index 3, 7, ...), a weightless QK L2 norm, the router's score on the expert's input;
    its chunked attention has no flag: a note. Maverick (use_qk_norm false) has no --qk-l2-norm."""
    scout = load_model("Llama-4-Scout-17B-16E")
    args = slime_model_args(scout)
    assert args[args.index("--no-rope-freq") + 1] == "4"
    assert "--qk-l2-norm" in args and "--moe-apply-probs-on-input" in args
    assert any("chunked attention (8192 tokens" in n for n in model_notes(scout))
    maverick = slime_model_args(load_model("Llama-4-Maverick-17B-128E"))
    assert "--qk-l2-norm" not in maverick and maverick[maverick.index("--no-rope-freq") + 1] == "4"
    flags = {ln.strip() for ln in (Path(__file__).with_name("megatron_flags.txt")).read_text().splitlines()}
    assert {"--no-rope-freq", "--qk-l2-norm", "--moe-apply-probs-on-input"} <= flags


def test_llama4_irregular_nope_layers_are_a_list(tmp_path):
    layers = [1, 0, 1, 1] * 12  # NoPE at index 1, 5, ...: not every N-th from the first
    cfg = json.loads((resources.files("autotune.catalog") / "data" / "models" / "Llama-4-Scout-17B-16E.json").read_text())
    cfg["text_config"]["no_rope_layers"] = layers  # Scout's text keys live under text_config
    path = tmp_path / "scout-variant.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    args = slime_model_args(m)
    pattern = args[args.index("--no-rope-freq") + 1]
    assert eval(pattern) == [1 - x for x in layers]  # noqa: S307 - Megatron evaluates the same expression
