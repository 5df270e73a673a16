"""DeepSeek-V4 (Flash, Pro): its config read as the checkpoint's network, its attention's FLOPs as Megatron counts them,
its activations, the rules megatron-core sets it, its Megatron arguments, its published rows; and the MTP block in the
count a TFLOP/s-only row is read with."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autotune.catalog import Workload, load_model, param_counts
from autotune.catalog.model import CSA
from autotune.cost._published import catalog_name
from autotune.cost.flops import train_flops_per_token
from autotune.cost.layers import KIND, PARTS, attention_flops, layer_tables
from autotune.cost.memory import SELECTIVE_DROPS
from autotune.errors import ConfigError
from autotune.launch import slime_model_args
from autotune.launch.model_args import model_notes
from autotune.layout import Layout, Recompute, violations

FLASH, PRO = "DeepSeek-V4-Flash", "DeepSeek-V4-Pro"


def test_flash_and_pro_are_their_published_sizes():
    """DeepSeek's cards: Flash 284B total / 13B active, Pro 1.6T / 49B (Pro's 1.6T with its MTP block)."""
    f, p = param_counts(load_model(FLASH)), param_counts(load_model(PRO))
    assert round(f.total / 1e9) == 284 and round(f.active / 1e9) == 13
    assert round((p.total + p.mtp) / 1e11) == 16 and round(p.active / 1e9) == 49
    m = load_model(FLASH)
    assert m.layer_types == (CSA,) * 43 and m.hc_streams == 4 and m.hash_layers == 3 and m.num_kv_heads == 1
    assert m.csa.ratios == (0, 0, 4) + (128, 4) * 20 + (0,)  # 43 decoder layers, then the MTP layer
    assert m.moe.shared_ffn_hidden_size == 2048 and m.moe.router_bias and not m.moe.sigmoid_router


def _flash_cfg() -> dict:
    from importlib import resources
    return json.loads((resources.files("autotune.catalog") / "data" / "models" / f"{FLASH}.json").read_text())


def test_the_native_layer_type_spelling_reads_as_the_ratio_list(tmp_path):
    cfg = _flash_cfg()
    ratios = cfg.pop("compress_ratios")
    names = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    cfg["layer_types"] = [names[r] for r in ratios[:43]]
    cfg["compress_rates"] = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    a, b = load_model(str(path)), load_model(FLASH)
    assert a.csa == b.csa and param_counts(a).total == param_counts(b).total


@pytest.mark.parametrize("change, words", [
    ({"compress_ratios": [0, 4]}, "lists 2 layers but num_hidden_layers is 43"),
    ({"compress_ratios": [1] * 44}, "ratio of 1"),
    ({"compress_ratios": "[0,4]"}, "compress_ratios"),
    ({"o_groups": 7}, "o_groups 7 does not divide"),
    ({"index_topk": 0}, "index_topk"),
])
def test_bad_deepseek_v4_configs_are_one_line_config_errors(tmp_path, change, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_flash_cfg(), **change}))
    with pytest.raises(ConfigError, match=words):
        load_model(str(path))


def _megatron_dsv4_attention(m, seq: int) -> float:
    """Megatron-LM's count of DeepSeek-V4's attention per token, forward (training.py
    _dsv4_hybrid_self_attention_flops, restated: its token-linear terms plus its L^2 terms at one row of `seq`,
    x 2 for multiply-add)."""
    a, h, nh, d = m.csa, m.hidden_size, m.num_heads, m.csa.head_dim
    r = list(m.csa.ratios[:m.num_layers])
    n0, n4, n128 = r.count(0), r.count(4), r.count(128)
    proj = (a.q_lora_rank * (h + nh * d + 1) + h * d + d + nh * d * a.o_lora_rank + a.o_groups * a.o_lora_rank * h)
    token = proj * len(r) + n0 * nh * a.window * d * 2 + n128 * nh * a.window * d * 2
    token += n4 * h * (2 * d) * 2 + n128 * h * d * 2  # the main compressors
    k = min(a.index_topk, seq // 4)
    token += n4 * nh * (a.window + k * (1 - k * 4 / (2 * seq))) * d * 2
    token += n4 * h * (2 * a.index_head_dim) * 2 + n4 * a.q_lora_rank * a.index_heads * a.index_head_dim \
        + n4 * h * a.index_heads
    core = n128 * nh * d / 128 + n4 * a.index_heads * a.index_head_dim / 4
    return 2 * (token + core * seq)


def test_attention_flops_are_megatrons_count():
    m = load_model(FLASH)
    lt = layer_tables(m)
    items = ("csa.q_down", "csa.q_up", "csa.kv_proj", "csa.o_group_proj", "csa.o_proj", "csa.compressor",
             "csa.indexer_q", "csa.indexer_weights", "csa.indexer_compressor")
    from autotune.catalog.params import layer_items
    proj = sum(2 * it.count for i in range(m.num_layers) for it in layer_items(m, i) if it.name in items)
    ours = proj + attention_flops(m, lt, 4096).sum()
    assert ours == pytest.approx(_megatron_dsv4_attention(m, 4096), rel=2e-3)
    assert (lt.kind == KIND[CSA]).all() and list(lt.ratio) == list(m.csa.ratios[:43])


def test_a_training_step_counts_what_megatron_bridge_printed():
    """Megatron-Bridge's 26.08 page: DeepSeek-V4-Flash on 128 GB200 at 7,776 tokens/s/GPU and 706 TFLOP/s/GPU, i.e.
    90.8 GFLOP per token in Megatron's count, which includes the trained MTP block."""
    m = load_model(FLASH)
    assert train_flops_per_token(m, 4096, mtp_passes=1) / 1e9 == pytest.approx(706e12 / 7776 / 1e9, rel=0.01)
    assert train_flops_per_token(m, 4096) < 0.96 * train_flops_per_token(m, 4096, mtp_passes=1)


def test_hyper_connections_keep_their_streams_and_mhc_recompute_frees_them():
    m = load_model(FLASH)
    lt = layer_tables(m)
    hc, ln = lt.act[:, PARTS.index("hc")], lt.act[:, PARTS.index("ln")]
    assert np.all(ln == 2 * 2 * m.hidden_size) and np.all(hc == ln * (m.hc_streams + 1))
    assert SELECTIVE_DROPS["mhc"] == ("hc",)
    from autotune.catalog import ClusterSpec
    from autotune.cost.memory import MemoryCoefficients, estimate_memory
    from autotune.layout import LayoutTable
    w = Workload(seq_len=4096, global_batch=256, precision="mxfp8")
    c = ClusterSpec.of("GB200", 64)
    base = Layout(world=64, ep=64, micro_batch_size=1, dispatcher="alltoall",
                  recompute=Recompute("selective", modules=("mla_up_proj",)))
    both = Layout(world=64, ep=64, micro_batch_size=1, dispatcher="alltoall",
                  recompute=Recompute("selective", modules=("mla_up_proj", "mhc")))
    mem = estimate_memory(m, w, c, LayoutTable.from_layouts([base, both]))
    freed = mem.terms["activations"][0, 0] - mem.terms["activations"][1, 0]
    assert freed > 0
    # the streams of every layer, for the one micro-batch in flight (PP 1), at 4,096 tokens, times the allocator's
    # share (MemoryCoefficients.fragmentation; the workload trains no MTP block)
    assert freed == pytest.approx(hc.sum() * 4096 * (1 + MemoryCoefficients().fragmentation), rel=1e-6)


def test_megatron_core_rules_for_its_attention():
    m, w = load_model(FLASH), Workload(seq_len=4096, global_batch=256)
    assert {v.code for v in violations(m, w, Layout(world=64, tp=2, ep=32))} >= {"csa_tp"}
    assert {v.code for v in violations(m, w, Layout(world=64, cp=2, ep=32))} >= {"csa_cp"}
    assert not violations(m, w, Layout(world=64, ep=64, recompute=Recompute("selective", modules=("mla_up_proj", "mhc"))))
    bad = violations(m, w, Layout(world=64, ep=64, recompute=Recompute("selective", modules=("mhc", "mlp"))))
    assert "recompute_mhc_mlp" in {v.code for v in bad}
    v3 = load_model("DeepSeek-V3")
    assert "recompute_mhc" in {v.code for v in violations(v3, w, Layout(world=64, ep=64, recompute=Recompute(
        "selective", modules=("mhc",))))}
    assert "csa_tp" not in {v.code for v in violations(v3, w, Layout(world=64, tp=2, ep=32))}


def test_megatron_arguments_are_the_dsv4_hybrid_recipes():
    """The flags Megatron-LM's examples/moe_recipes/deepseek_v4_flash recipe passes, at the checkpoint's values."""
    m = load_model(FLASH)
    a = slime_model_args(m)
    val = lambda flag: a[a.index(flag) + 1]  # noqa: E731
    assert val("--experimental-attention-variant") == "dsv4_hybrid" and "--multi-latent-attention" in a
    assert json.loads(val("--csa-compress-ratios")) == list(m.csa.ratios)
    assert (val("--o-groups"), val("--o-lora-rank"), val("--q-lora-rank"), val("--v-head-dim")) == ("8", "1024", "1024",
                                                                                                   "512")
    assert (val("--dsa-indexer-n-heads"), val("--dsa-indexer-head-dim"), val("--dsa-indexer-topk")) == ("64", "128",
                                                                                                        "512")
    assert val("--num-residual-streams") == "4" and val("--moe-n-hash-layers") == "3"
    assert val("--moe-router-score-function") == "sqrtsoftplus" and "--moe-router-enable-expert-bias" in a
    assert "--group-query-attention" not in a and "--qk-layernorm" in a
    assert any("dsv4_hybrid" in n for n in model_notes(m))
    assert "--experimental-attention-variant" not in slime_model_args(load_model("DeepSeek-V3"))


def test_published_rows_are_read_predicted_and_kept_out_of_the_fit():
    from autotune.cost.calibrate import fit_kinds, published_measurements
    assert catalog_name("DeepSeekV4 Flash") == (FLASH, None)
    kept, skipped = published_measurements(None)
    rows = [m for m in kept if m.model == FLASH]
    assert len(rows) == 3 and all(m.unpriced for m in rows)
    assert not any(FLASH in why or "DeepSeekV4" in why for _, why in skipped)
    bridge = next(m for m in rows if m.gpu == "GB200" and "Megatron-Bridge" in m.source)
    lay = bridge.layout
    assert (lay.ep, lay.cuda_graphs, lay.dispatcher, lay.recompute.modules) == (64, "full", "hybridep", ("mla_up_proj",))
    assert bridge.force_balance and bridge.train_mtp
    # the TFLOP/s-only row is read in Megatron's count, MTP block included
    readme = next(m for m in rows if "moe_recipes" in m.source)
    assert readme.tokens_per_s_per_gpu == pytest.approx(
        646.4e12 / train_flops_per_token(readme.spec, 4096, mtp_passes=1), rel=1e-6)
    others = [m for m in kept if m.gpu in ("GB200", "GB300") and not m.unpriced]
    a = fit_kinds(others, ["GB200"])["GB200"].time.scale
    b = fit_kinds(others + rows, ["GB200"])["GB200"].time.scale
    assert a == b


def test_estimate_says_its_tokens_per_second_are_an_upper_bound(capsys):
    """The rows the fit leaves out are what a user needs to know: estimate (and space, search) print it once."""
    from autotune.cli.main import main

    argv = ["estimate", "--gpu", "GB200", "--count", "128", "--layout", "TP1 PP1 EP64 DP128", "--precision", "mxfp8"]
    def said() -> str:
        got = capsys.readouterr()
        return " ".join((got.out + got.err).split())  # notes go to stderr on a terminal, else with the output

    assert main(argv[:1] + ["--model", FLASH] + argv[1:]) == 0
    text = said()
    assert text.count("upper bound") == 1 and "24-36%" in text
    assert main(argv[:1] + ["--model", "DeepSeek-V3"] + argv[1:]) == 0
    assert "upper bound" not in said()
