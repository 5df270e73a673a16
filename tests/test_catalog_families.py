"""The families added for the published rows: parameter counts against published figures, the Mamba2 layer's
per-rank sharding, FLOPs and saved bytes, bad Nemotron-H configs, and the models' Megatron arguments.

No parity test against megatron-core's MambaMixer: its constructor raises ImportError without mamba-ssm
(HAVE_MAMBA_SSM; mamba-ssm needs CUDA to build) and allocates on torch.cuda.current_device(), so it cannot be
built on this CPU machine. The sharding test below restates MambaMixer's per-rank tensor shapes
(megatron/core/ssm/mamba_mixer.py, megatron-core 0.16.1) instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotune.catalog import load_model, param_counts
from autotune.catalog.model import FULL, MAMBA, NONE
from autotune.catalog.params import layer_items
from autotune.cost.layers import KIND_ATTENTION, layer_tables
from autotune.errors import ConfigError
from autotune.launch import slime_model_args

NANO, SUPER = "NVIDIA-Nemotron-3-Nano-30B-A3B", "NVIDIA-Nemotron-3-Super-120B-A12B"
ULTRA = "NVIDIA-Nemotron-3-Ultra-550B-A55B"


def _buffers(m) -> int:
    return sum(it.count for i in range(m.num_layers) for it in layer_items(m, i) if it.shard == "buffer")


@pytest.mark.parametrize("name,total", [
    ("Llama-3.1-8B", 8_030_261_248), ("Llama-2-7b-hf", 6_738_415_616), ("Llama-2-13b-hf", 13_015_864_320),
    ("Llama-2-70b-hf", 68_976_648_192), ("gpt-oss-20b", 20_914_757_184),
    # HF registers the routers' e_score_correction_bias as a buffer: its index counts parameters only
    (NANO, 31_577_937_344), (SUPER, 123_611_012_096 - 2_942_324_736),  # Super: the MTP tensors are apart
])
def test_published_totals(name, total):
    m = load_model(name)
    assert param_counts(m).total - _buffers(m) == total


def test_kimi_k2_counts_and_structure():
    """Kimi-K2: DeepSeek-V3's network with 384 experts, 64 heads and one dense layer. The language model's count is
    1,026,408,232,448 (its safetensors; the routers' e_score_correction_bias is a parameter in its remote code) and
    a decode token runs 31,686,066,176 matrix parameters (the output layer, not the embedding lookup)."""
    m = load_model("Kimi-K2-Instruct")
    c = param_counts(m)
    assert c.total == 1_026_408_232_448 and c.active == 31_686_066_176 and c.mtp == 0
    assert m.mla is not None and m.moe.num_experts == 384 and m.moe.dense_layers == (0,) and m.num_heads == 64


@pytest.mark.parametrize("name,hub,no_mtp", [("GLM-4.5", 358_337_791_296, 352_797_829_024),
                                             ("GLM-4.5-Air", 110_468_824_832, None)])
def test_glm45_counts_match_the_hub(name, hub, no_mtp):
    """GLM-4.5's Hub checkpoints hold the MTP layer with its own embedding and output copies (Megatron shares the
    main ones): our network + MTP block + two vocabulary matrices is the Hub's tensor count exactly. That needs the
    family's reading: Q/K/V biases but none on o_proj, a router correction bias, weighted QK norm on GLM-4.5 only."""
    m = load_model(name)
    c = param_counts(m)
    assert c.total + c.mtp + 2 * m.vocab_size * m.hidden_size == hub
    assert no_mtp is None or c.total == no_mtp
    assert m.qkv_bias_only and m.moe.router_bias and m.qk_norm == (name == "GLM-4.5") and m.rotary_fraction == 0.5


def test_super_mtp_block_and_structure():
    m = load_model(SUPER)
    # one MTP block (*E): norms, the 2h -> h projection, an attention and a latent-MoE layer; less its router bias
    assert param_counts(m).mtp - m.moe.num_experts == 2_942_324_736
    assert (m.count(MAMBA), m.count(FULL), m.count(NONE)) == (40, 8, 40)
    assert m.moe.latent_size == 1024 and not m.gated_mlp and m.mtp_pattern == "*E"
    assert all(m.is_moe_layer(i) == (c == "E") for i, c in enumerate(m.hybrid_pattern))
    assert all(m.has_ffn(i) == (c in "-E") for i, c in enumerate(m.hybrid_pattern))


def test_ultra_is_its_name_and_its_checkpoints_size():
    """550B total / 55B active (the name), and with the MTP block the BF16 checkpoint's 1,121 GB; the HF file's
    spelling (layers_block_type, mtp_layers_block_type) reads as the catalog's pattern strings."""
    m = load_model(ULTRA)
    c = param_counts(m)
    assert round(c.total / 1e9) == 549 and round(c.active / 1e9) == 55
    assert round(2 * (c.total + c.mtp) / 1e9) == 1121
    assert (m.count(MAMBA), m.count(FULL), m.count(NONE)) == (48, 12, 48)
    assert [i for i, t in enumerate(m.layer_types) if t == FULL] == [7, 14, 23, 32, 39, 48, 57, 64, 73, 82, 89, 98]
    assert m.moe.latent_size == 2048 and m.mtp_pattern == "*E" and m.mamba.num_heads * m.mamba.head_dim == 2 * 8192


def test_nemotron_h_block_type_lists_read_as_the_patterns(tmp_path):
    cfg = json.loads((Path(__file__).parents[1] / "src/autotune/catalog/data/models" / f"{ULTRA}.json").read_text())
    names = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}
    hf = {k: v for k, v in cfg.items() if k not in ("hybrid_override_pattern", "mtp_hybrid_override_pattern")}
    hf["layers_block_type"] = [names[c] for c in cfg["hybrid_override_pattern"]]
    hf["mtp_layers_block_type"] = ["attention", "moe"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    a, b = load_model(str(path)), load_model(ULTRA)
    assert a.hybrid_pattern == b.hybrid_pattern and a.mtp_pattern == b.mtp_pattern
    assert param_counts(a) == param_counts(b)
    hf["mtp_layers_block_type"] = ["attention", "moe", "sliding"]
    path.write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as err:
        load_model(str(path))
    assert "mtp_layers_block_type" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name,billions", [
    ("Megatron-GPT-1.7B", 1.7), ("Megatron-GPT-7.1B", 7.1), ("Megatron-GPT-16B", 16), ("Megatron-GPT-32B", 32),
    ("Megatron-GPT-70B", 70), ("Megatron-GPT-119B", 119), ("Megatron-GPT-177B", 177), ("Megatron-GPT-314B", 314),
    ("Megatron-GPT-462B", 462), ("NeMo-GPT3-5B", 5), ("NeMo-GPT3-20B", 20), ("NeMo-GPT3-175B", 175),
    ("Nemotron-4-340B", 340), ("Nemotron-H-56B-Base-8K", 56),
])
def test_sizes_only_named_match_the_name(name, billions):
    """Only the name is published: the count is within its rounding (3.5% covers '1.7B' for 1.75B)."""
    total = param_counts(load_model(name)).total / 1e9
    assert abs(total - billions) <= 0.035 * billions


def test_nemotron_4_15b_has_the_papers_embedding_and_non_embedding_split():
    """Nemotron-4 15B (arXiv:2402.16819): 3.2B embedding parameters (input and output, untied) and 12.5B others."""
    m = load_model("Nemotron-4-15B")
    emb = 2 * m.vocab_size * m.hidden_size
    assert abs(emb / 1e9 - 3.2) < 0.06 and abs((param_counts(m).total - emb) / 1e9 - 12.5) < 0.05  # 3.15B, 12.48B


def test_kempnerforge_13b_is_the_benchmarks_14_84b():
    """KempnerForge's M13B (dim 5120, 40 layers, 8 KV heads, vocab 128256, FFN multiplier 1.3 rounded up to 256:
    17920) is the 14.84B its benchmark names; an FFN of Llama 2 13B's 13824 would make it 13.3B."""
    m = load_model("Llama-3-Style-13B")
    assert m.ffn_hidden_size == 256 * -(-int(4 * 5120 * 2 / 3 * 1.3) // 256) == 17920
    assert round(param_counts(m).total / 1e9, 2) == 14.84


def test_untied_embeddings_are_what_reproduce_the_readme_sizes():
    m = load_model("Megatron-GPT-1.7B")
    tied = param_counts(m).total - m.vocab_size * m.hidden_size
    assert not m.tie_embeddings and abs(tied / 1e9 - 1.7) > 0.1  # tied would be 1.48B, not "1.7B"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_mamba_layer_shards_as_megatrons_mixer(tp):
    """Per TP rank: in_proj column-parallel over (z, x, B, C, dt), conv1d weight and bias over (x, B, C), dt_bias,
    A_log and D per local head, the gated norm's weight over d_inner / TP, out_proj row-parallel; the layer's
    pre-norm whole on every rank."""
    m = load_model(NANO)
    mb, h = m.mamba, m.hidden_size
    i = m.layer_types.index(MAMBA)
    d, g, n, heads = mb.num_heads * mb.head_dim // tp, mb.num_groups // tp, mb.state_dim, mb.num_heads // tp
    megatron = (h * (2 * d + 2 * g * n + heads)  # in_proj
                + (d + 2 * g * n) * (mb.conv_kernel + 1)  # conv1d weight [conv_dim, 1, k] and bias
                + 3 * heads + d  # dt_bias, A_log, D; norm
                + d * h  # out_proj
                + h)  # the layer's RMSNorm (fused into in_proj's LayerNormColumnParallelLinear)
    lt = layer_tables(m)
    assert lt.params_tp[i] / tp + lt.params_rep[i] == megatron


def test_mamba_and_ffn_only_layers_in_the_tables():
    m = load_model(NANO)
    lt = layer_tables(m)
    kinds = {c: set(lt.kind[[i for i, x in enumerate(m.hybrid_pattern) if x == c]]) for c in "M*E"}
    assert kinds == {"M": {4}, "*": {0}, "E": {5}}
    assert set(np.flatnonzero(lt.is_attention)) == {i for i, c in enumerate(m.hybrid_pattern) if c == "*"}
    mamba = lt.kind == 4
    assert (lt.flops_linear_attn[mamba] > 0).all() and (lt.flops_attn_quadratic[mamba] == 0).all()
    assert (lt.flops_expert[mamba] == 0).all() and (lt.flops_expert[lt.is_moe] > 0).all()
    # every weight matrix a token meets is 2 FLOPs per parameter: dense + experts = 2 x active matrices (the
    # depthwise conv, an elementwise filter, is counted as 2 x channels x kernel in either)
    active = sum(round(it.count * it.active) for i in range(m.num_layers) for it in layer_items(m, i) if it.matrix)
    assert lt.flops_dense.sum() + lt.flops_expert.sum() == pytest.approx(2 * active)
    assert KIND_ATTENTION == (0, 1, 3, 6)


def test_mamba_layer_saves_what_the_fused_scan_and_linears_keep():
    """Per token, bytes: the pre-norm's input and in_proj's input (h each), zxbcdt (the in_proj output) and out_x
    kept by mamba_split_conv1d_scan_combined, the gated norm's input and fp32 rstd per group, out_proj's input."""
    m = load_model(NANO)
    mb, h = m.mamba, m.hidden_size
    i = m.layer_types.index(MAMBA)
    d = mb.num_heads * mb.head_dim
    zxbcdt = 2 * d + 2 * mb.num_groups * mb.state_dim + mb.num_heads
    want = 2 * (h + h + zxbcdt + d + d + d) + 4 * mb.num_groups
    assert layer_tables(m).act[i].sum() == want


def test_latent_moe_runs_experts_and_dispatch_at_the_latent_width():
    m = load_model(SUPER)
    e = m.moe
    i = m.hybrid_pattern.index("E")
    lt = layer_tables(m)
    # squared ReLU without a gate: fc1 and fc2 per expert, each latent x FFN; top-22 of 512
    assert lt.flops_expert[i] == pytest.approx(2 * e.top_k * 2 * e.latent_size * e.ffn_hidden_size)
    assert e.width(m.hidden_size) == 1024 and load_model("Qwen3-30B-A3B").moe.width(2048) == 2048


def _nemotron_h(tmp_path, **change):
    cfg = json.loads(json.dumps({
        "model_type": "nemotron_h", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hybrid_override_pattern": "M*ME",
        "mamba_num_heads": 8, "mamba_head_dim": 8, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 32}))
    cfg.update(change)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize("change,words", [
    ({"hybrid_override_pattern": "M*MX"}, ["hybrid_override_pattern", "'X'", "allowed"]),
    ({"hybrid_override_pattern": "M*M|E"}, ["'|'", "pipeline separators"]),
    ({"hybrid_override_pattern": "M*"}, ["2 layers", "num_hidden_layers is 4"]),
    ({"hybrid_override_pattern": 5}, ["hybrid_override_pattern", "5"]),
    ({"mamba_num_heads": 5}, ["mamba_num_heads 5", "n_groups 2"]),
    ({"ssm_state_size": None}, ["ssm_state_size", "positive integer"]),
    ({"hybrid_override_pattern": None}, ["hybrid_override_pattern", "layers_block_type"]),
])
def test_bad_nemotron_h_configs_are_one_line_config_errors(tmp_path, change, words):
    with pytest.raises(ConfigError) as err:
        load_model(_nemotron_h(tmp_path, **change))
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_a_small_nemotron_h_reads_its_pattern_and_block_type_names(tmp_path):
    m = load_model(_nemotron_h(tmp_path))
    assert m.layer_types == (MAMBA, FULL, MAMBA, NONE) and m.ffn_free == (0, 1, 2) and m.is_moe_layer(3)
    named = load_model(_nemotron_h(tmp_path, hybrid_override_pattern=None,
                                   layers_block_type=["mamba", "attention", "mamba", "moe"]))
    assert named.layer_types == m.layer_types and named.hybrid_pattern == "M*ME"


def test_megatron_arguments_of_the_new_stacks():
    sup = slime_model_args(load_model(SUPER))
    assert sup[sup.index("--hybrid-override-pattern") + 1] == load_model(SUPER).hybrid_pattern
    assert {"--is-hybrid-model", "--squared-relu", "--moe-router-enable-expert-bias"} <= set(sup)
    assert sup[sup.index("--mamba-num-heads") + 1] == "128" and sup[sup.index("--moe-latent-size") + 1] == "1024"
    assert "--swiglu" not in sup and "--moe-layer-freq" not in sup
    # Nemotron-H's attention has no positional embedding (Megatron-Bridge's NemotronH bridge: "none"), though its
    # config.json carries rope_theta: none, and no rotary flag
    for name in (NANO, SUPER, ULTRA):
        a = slime_model_args(load_model(name))
        assert a[a.index("--position-embedding-type") + 1] == "none", name
        assert not [x for x in a if x.startswith(("--rotary", "--rope", "--use-rope"))], name
    gpt = slime_model_args(load_model("NeMo-GPT3-175B"))
    assert gpt[gpt.index("--position-embedding-type") + 1] == "learned_absolute" and "--swiglu" not in gpt
    assert "--disable-bias-linear" not in gpt and gpt[gpt.index("--normalization") + 1] == "LayerNorm"
    assert "--swiglu" in slime_model_args(load_model("Llama-3.1-8B"))


# Llama 4 (HF Llama4ForConditionalGeneration): the catalog holds the text model; the checkpoints' published
# totals also hold the vision tower and projector, restated below from the Scout file's vision_config.
SCOUT, MAVERICK = "Llama-4-Scout-17B-16E", "Llama-4-Maverick-17B-128E"
SCOUT_TOTAL = 108_641_793_536  # HF meta-llama/Llama-4-Scout-17B-16E-Instruct safetensors.parameters.BF16
MAVERICK_TOTAL = 401_583_781_376  # Llama 4 Maverick parameter_count (Fireworks; = the HF repository's metadata)


def _llama4_vision(v: dict, text_hidden: int) -> int:
    """HF Llama4VisionModel + Llama4MultiModalProjector tensors (transformers modeling_llama4.py): the unfold
    patch linear (no bias), class embedding, (patches + 1) positions, LayerNorms (weight and bias) before and
    after, per layer q/k/v/o and fc1/fc2 with biases and two LayerNorms, the pixel-shuffle adapter's fc1
    (intermediate -> projector_input_dim) and fc2 (projector_output_dim square), the projector to the text width."""
    h, f, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    return (v["num_channels"] * p * p * h + h + ((v["image_size"] // p) ** 2 + 1) * h + 2 * 2 * h
            + v["num_hidden_layers"] * layer
            + f * v["projector_input_dim"] + v["projector_output_dim"] ** 2
            + v["vision_output_dim"] * text_hidden)


def _catalog_json(name: str) -> dict:
    from importlib import resources
    return json.loads((resources.files("autotune.catalog") / "data" / "models" / f"{name}.json").read_text())


def test_llama4_text_models_plus_the_vision_tower_are_the_published_checkpoints():
    scout, maverick = load_model(SCOUT), load_model(MAVERICK)
    vision = _llama4_vision(_catalog_json(SCOUT)["vision_config"], scout.hidden_size)
    assert param_counts(scout).total + vision == SCOUT_TOTAL
    # Maverick's file has no vision_config (its source zeroed the tower's depth); the same tower closes its total
    assert param_counts(maverick).total + vision == MAVERICK_TOTAL
    assert _buffers(scout) == _buffers(maverick) == 0  # the routers have no bias or correction buffer


@pytest.mark.parametrize("name", [SCOUT, MAVERICK])
def test_llama4_active_parameters_round_to_the_model_cards_17b(name):
    """Model card: 17B active. One token's weight matrices with both vocabulary matrices (the seed's active
    rule counts one: 16.1B; the card's figure reads as counting the input embedding too)."""
    c = param_counts(load_model(name))
    assert round((c.active + c.vocab_matrix) / 1e9) == 17


def test_llama4_moe_layer_pattern_and_ffn_sizes():
    scout, maverick = load_model(SCOUT), load_model(MAVERICK)
    assert all(scout.is_moe_layer(i) for i in range(scout.num_layers)) and scout.num_layers == 48
    # interleave_moe_layer_step 2: HF moe_layers = range(1, 48, 2); Megatron-Bridge moe_layer_freq [0, 1] * 24
    assert [int(maverick.is_moe_layer(i)) for i in range(48)] == [0, 1] * 24
    h = maverick.hidden_size
    dense, moe = layer_items(maverick, 0), layer_items(maverick, 1)
    assert {it.name: it.count for it in dense}["mlp.dense"] == 3 * h * 16384  # intermediate_size_mlp, SwiGLU
    assert not any(it.name.startswith("moe.") for it in dense)
    counts = {it.name: it.count for it in moe}
    assert counts["moe.experts"] == 128 * 3 * h * 8192 and counts["moe.router"] == h * 128
    assert "mlp.dense" not in counts and "moe.router_bias" not in counts


@pytest.mark.parametrize("name", [SCOUT, MAVERICK])
def test_llama4_moe_layers_carry_one_ungated_shared_expert(name):
    m = load_model(name)
    e, h = m.moe, m.hidden_size
    assert (e.top_k, e.ffn_hidden_size, e.shared_ffn_hidden_size) == (1, 8192, 8192)
    assert not e.shared_expert_gate and not e.router_bias and m.gated_mlp and not m.tie_embeddings
    i = next(i for i in range(m.num_layers) if m.is_moe_layer(i))
    counts = {it.name: it.count for it in layer_items(m, i)}
    assert counts["moe.shared"] == 3 * h * 8192 and "moe.shared_gate" not in counts
    lt = layer_tables(m)
    # the shared expert runs on every token beside the one routed expert: 2 FLOPs per weight each
    assert lt.flops_expert[i] == pytest.approx(2 * 3 * h * 8192)
    attention = 2 * h * m.num_heads * m.head_dim + 2 * h * m.num_kv_heads * m.head_dim  # q, o; k, v
    assert lt.flops_dense[i] == pytest.approx(2 * (attention + h * e.num_experts + 3 * h * 8192))  # + router, shared


def test_llama4_qk_norm_is_weightless_and_attention_is_full():
    m = load_model(SCOUT)
    assert _catalog_json(SCOUT)["text_config"]["use_qk_norm"] and not m.qk_norm  # Llama4TextL2Norm: no weights
    assert set(m.layer_types) == {FULL} and (m.num_heads, m.num_kv_heads, m.head_dim) == (40, 8, 128)


def _llama4(tmp_path, **change):
    text = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
            "intermediate_size_mlp": 96, "num_local_experts": 4, "num_experts_per_tok": 1}
    text.update(change)
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama4", "text_config": {k: v for k, v in text.items() if v is not None}}))
    return str(p)


def test_a_small_llama4_reads_moe_layers_steps_and_chunked_layer_types(tmp_path):
    assert load_model(_llama4(tmp_path)).moe.dense_layers == ()  # HF's default step 1: every layer MoE
    m = load_model(_llama4(tmp_path, interleave_moe_layer_step=2))
    assert m.moe.dense_layers == (0, 2) and m.ffn_hidden_size == 96
    # moe_layers overrides the step (HF Llama4TextConfig)
    assert load_model(_llama4(tmp_path, interleave_moe_layer_step=2, moe_layers=[0])).moe.dense_layers == (1, 2, 3)
    chunked = load_model(_llama4(tmp_path, layer_types=["chunked_attention"] * 3 + ["full_attention"]))
    assert chunked.layer_types == (FULL,) * 4
    assert load_model(_llama4(tmp_path, intermediate_size_mlp=None, moe_layers=[1])).ffn_hidden_size == 16384


@pytest.mark.parametrize("change,words", [
    ({"num_local_experts": None}, ["num_local_experts"]),
    ({"intermediate_size": None}, ["intermediate_size"]),
    ({"moe_layers": [1, 4]}, ["moe_layers", "[4]", "num_hidden_layers is 4"]),
    ({"interleave_moe_layer_step": 0}, ["interleave_moe_layer_step"]),
    ({"intermediate_size_mlp": "big"}, ["intermediate_size_mlp"]),
])
def test_bad_llama4_configs_are_one_line_config_errors(tmp_path, change, words):
    with pytest.raises(ConfigError) as err:
        load_model(_llama4(tmp_path, **change))
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("name,score,scale,groups", [
    ("DeepSeek-V3", "sigmoid", "2.5", ("8", "4")), ("Kimi-K2-Instruct", "sigmoid", "2.827", None),
    ("GLM-4.5", "sigmoid", "2.5", None), ("GLM-4.5-Air", "sigmoid", None, None), ("Qwen3-30B-A3B", "softmax", None, None),
    ("Llama-4-Scout-17B-16E", "sigmoid", None, None), ("gpt-oss-120b", "softmax", None, None),
])
def test_router_arguments_follow_the_config(name, score, scale, groups):
    """The emitted router is the model's: the config's scoring_func (GLM-4.5 and Llama 4 name none and route by
    sigmoid), its
    routed_scaling_factor where it is not 1, DeepSeek-V3's group-limited routing, and the correction bias with sigmoid."""
    a = slime_model_args(load_model(name))

    def val(flag):
        return a[a.index(flag) + 1] if flag in a else None

    assert val("--moe-router-score-function") == score and val("--moe-router-topk-scaling-factor") == scale
    assert (val("--moe-router-num-groups"), val("--moe-router-group-topk")) == (groups or (None, None))
    # the correction bias rides on a sigmoid router that has one (Llama 4's has none; gpt-oss's bias is a linear one)
    assert ("--moe-router-enable-expert-bias" in a) == (score == "sigmoid" and not name.startswith("Llama-4"))


def test_nemotron_h_56b_is_the_papers_stack():
    """Nemotron-H (arXiv:2504.03624): 118 layers, 54 Mamba-2, 54 MLP and 10 attention layers evenly dispersed, hidden
    8,192, 64 query heads over 8 KV groups; Megatron-Bridge's recipe (recipes/nemotronh/h100/nemotronh.py at v0.6.0) gives
    the pattern, the 32,768 squared-ReLU FFN and Mamba's 256 heads x 64 with state 256 in 8 groups."""
    m = load_model("Nemotron-H-56B-Base-8K")
    assert (m.num_layers, m.count(MAMBA), m.count(FULL), m.hidden_size) == (118, 54, 10, 8192)
    assert len(m.ffn_free) == 64 and not m.gated_mlp and m.ffn_hidden_size == 32768 and m.moe is None
    assert (m.num_heads, m.num_kv_heads, m.mamba.num_heads, m.mamba.state_dim) == (64, 8, 256, 256)
    args = slime_model_args(m)
    assert args[args.index("--hybrid-override-pattern") + 1] == m.hybrid_pattern and "--squared-relu" in args


def test_nemotron_3_5_lightning_is_the_perf_recipes_network():
    """Megatron-Bridge's Lightning perf recipes (perf_recipes/nemotronh/*/nemotronh.py at v0.6.0) build Nemotron 3
    Nano's model and add an MTP block ('*E', mtp_num_layers 2 with one repeated layer). The 26.08 page agrees: its
    TFLOP/s over tokens/s is 28.15 GFLOP per token for Lightning (807 at 28,672) and 22.56 for Nano (901 at 39,936),
    a difference of 5.59 GFLOP: two passes of that block."""
    from autotune.cost.flops import train_flops_per_token
    nano, light = load_model(NANO), load_model("NVIDIA-Nemotron-3.5-Lightning-30B-A3B")
    assert param_counts(light).total == param_counts(nano).total and light.mtp_pattern == "*E"
    extra = (train_flops_per_token(light, 8192, mtp_passes=2) - train_flops_per_token(nano, 8192)) / 1e9
    assert extra == pytest.approx(807e12 / 28672 / 1e9 - 901e12 / 39936 / 1e9, rel=0.1)
