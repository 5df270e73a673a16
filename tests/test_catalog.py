"""Catalog: exact parameter counts, HF config parsing, name lookup, hardware."""

import json
from pathlib import Path

import pytest

from autotune.catalog import ClusterSpec, Workload, get_gpu, load_model, model_names, param_counts
from autotune.errors import BadInput, ConfigError, UnknownName


def test_qwen35_122b_exact_counts():
    c = param_counts(load_model("Qwen3.5-122B-A10B"))
    assert c.active == 9_008_136_192
    assert c.total == 122_111_526_912
    assert c.active_with_vectors == 9_008_449_536
    assert c.active_with_vectors + c.vocab_matrix == 9_771_288_576


@pytest.mark.parametrize(
    "name,total,active_both_vocab,qk_norm_excluded",
    [
        ("Qwen3-Next-80B-A3B-Instruct", 79_674_391_296, 3_874_929_408, False),
        ("Qwen3-235B-A22B", 235_093_610_496, 22_190_739_456, True),
        ("Qwen3-30B-A3B", 30_532_110_336, 3_353_020_416, True),
        ("DeepSeek-V3", 671_026_419_200, 37_552_297_472, False),
        ("Mixtral-8x7B-v0.1", 46_702_792_704, 12_879_925_248, False),
        ("Mixtral-8x22B-v0.1", 140_620_634_112, 39_152_031_744, False),
        ("Llama-3.1-70B", 70_553_706_496, 70_553_706_496, False),
        ("Llama-3.1-405B", 405_853_388_800, 405_853_388_800, False),
        ("gpt-oss-120b", 116_829_156_672, 5_711_982_912, False),
    ],
)
def test_published_counts(name, total, active_both_vocab, qk_norm_excluded):
    m = load_model(name)
    c = param_counts(m)
    qk = 2 * m.head_dim * m.num_layers if qk_norm_excluded else 0
    assert c.total - qk == total
    assert c.active_with_vectors + c.vocab_matrix - qk == active_both_vocab


def test_hybrid_stack_and_moe_structure():
    m = load_model("qwen3.5-122b-a10b")  # case-insensitive
    assert m.count("linear_attention") == 36 and m.count("full_attention") == 12
    assert [i for i, t in enumerate(m.layer_types) if t == "full_attention"][:3] == [3, 7, 11]
    assert m.attn_output_gate and m.qk_norm and m.moe.shared_expert_gate and m.mtp_layers == 1
    ds = load_model("DeepSeek-V3")
    assert ds.mla is not None and ds.moe.dense_layers == (0, 1, 2)
    oss = load_model("gpt-oss-120b")
    assert oss.count("sliding_attention") == 18 and oss.sliding_window == 128


def test_config_path_and_derived_layer_types(tmp_path):
    cfg = json.loads(json.dumps({
        "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 100,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "full_attention_interval": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
    }))
    d = tmp_path / "mini"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(d))
    assert m.name == "mini" and m.layer_types[3] == "full_attention" and m.layer_types[0] == "linear_attention"
    assert m.attn_output_gate  # Qwen3-Next attention is gated by construction


def test_bad_configs_name_the_field(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10}))
    with pytest.raises(ConfigError, match="num_attention_heads"):
        load_model(str(p))
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model(str(p))
    p.write_text(json.dumps({"hidden_size": -1, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 2}))
    with pytest.raises(ConfigError, match="hidden_size"):
        load_model(str(p))


def test_unknown_model_suggests_close_names():
    with pytest.raises(UnknownName, match="Qwen3.5-122B-A10B"):
        load_model("Qwen3.5-122B")
    assert "tiny-moe" in model_names()


def test_gpus_and_cluster():
    assert get_gpu("h200").memory_gb_nominal == 141
    with pytest.raises(UnknownName, match="H200"):
        get_gpu("H20O")
    c = ClusterSpec.of("H200", 32)
    assert c.nodes == 4 and c.node_size == 8
    with pytest.raises(BadInput, match=r"does not divide into nodes of 8 GPUs; use a multiple of 8 \(8 or 16\)"):
        ClusterSpec.of("H200", 12)
    with pytest.raises(BadInput, match=r"\(96 or 104\)"):  # the two multiples either side
        ClusterSpec.of("H200", 100)
    # a node size the user gave is not answered with "set --gpus-per-node": the way out names the kind's own
    with pytest.raises(BadInput, match=r"or a --gpus-per-node that divides 32 \(the H200 default: 8\)"):
        ClusterSpec.of("H200", 32, gpus_per_node=3)


def test_workload_defaults_are_the_seed():
    w = Workload()
    assert (w.seq_len, w.global_batch, w.steps, w.window) == (8192, 128, 20, (5, 19))
    assert w.window_tokens == 15_728_640
    with pytest.raises(BadInput):
        Workload(seq_len=1000)


# --- typed validation of config.json: one line naming the file, the field and the value --------------------
@pytest.mark.parametrize("field, value, words", [
    ("num_experts", "eight", "'num_experts' = 'eight'"),
    ("rope_parameters", "yarn", "'rope_parameters' = 'yarn'"),
    ("mlp_only_layers", 5, "'mlp_only_layers' = 5"),
    ("hidden_size", 1e30, "'hidden_size' = 1e+30"),
    ("hidden_size", 2**70, "less than or equal"),
    ("partial_rotary_factor", float("nan"), "finite"),
    ("num_attention_heads", True, "'num_attention_heads' = True"),
    ("layer_types", "full_attention", "'layer_types'"),
])
def test_wrong_types_in_config_json_are_one_line_config_errors(tmp_path, field, value, words):
    import json

    from autotune.catalog import load_model
    from autotune.errors import ConfigError

    cfg = json.loads((Path(__file__).parents[1] / "src/autotune/catalog/data/models/tiny-moe.json").read_text())
    cfg[field] = value
    path = tmp_path / "bad" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        load_model(str(path))
    msg = str(err.value)
    assert words in msg and str(path) in msg and "\n" not in msg and len(msg) < 400


def test_deeply_nested_or_binary_config_json_is_a_config_error(tmp_path):
    from autotune.catalog import load_model
    from autotune.errors import ConfigError

    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_model(str(deep))
    binary = tmp_path / "bin.json"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_model(str(binary))
