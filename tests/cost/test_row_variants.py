"""Published rows the catalog now expresses: the new name patterns, NVFP4 (Blackwell only, FP4 peak, its amax
pass), trained MTP blocks (compute and memory on the last stage), TFLOP/s read in their source's own count,
and the runner refusing a model it cannot build."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.catalog import GPUS, ClusterSpec, Workload, load_model, param_counts
from autotune.cli.main import main
from autotune.cost import Calibration, evaluate
from autotune.cost._coefficients import TimeCoefficients
from autotune.cost._published import catalog_name, map_row, train_flops_per_token
from autotune.cost.flops import stage_flops
from autotune.cost.measurements import published_measurements
from autotune.cost.memory import estimate_memory
from autotune.errors import BadInput
from autotune.layout import Layout, LayoutTable
from autotune.trials.plan import plan_trial
from autotune.trials.spec import TrialSpec

NANO, SUPER = "NVIDIA-Nemotron-3-Nano-30B-A3B", "NVIDIA-Nemotron-3-Super-120B-A12B"


@pytest.mark.parametrize("source,want", [
    ("Nemotron_3_Nano", NANO), ("Nemotron V3 Nano 30B (26.02)", NANO), ("Nemotron_3_Super", SUPER),
    ("Nemotron V3 Super 120B (26.02)", SUPER), ("Llama 3.1 8B", "Llama-3.1-8B"), ("LLAMA3_8B", "Llama-3.1-8B"),
    ("LLAMA3-8B", "Llama-3.1-8B"), ("Llama-3-style 7B (8.03B)", "Llama-3.1-8B"), ("LLAMA2-7B", "Llama-2-7b-hf"),
    ("LLAMA2-13B", "Llama-2-13b-hf"), ("LLAMA2-70B", "Llama-2-70b-hf"), ("GPT3-5B", "NeMo-GPT3-5B"),
    ("GPT3-175B", "NeMo-GPT3-175B"), ("GPT 1.7B (dense)", "Megatron-GPT-1.7B"), ("GPT 462B (dense)", "Megatron-GPT-462B"),
    ("Nemotron-8B", "Nemotron-3-8B"), ("Nemotron-22B", "Nemotron-3-22B"), ("Nemotron-340B", "Nemotron-4-340B"),
    ("Nemotron4 340B", "Nemotron-4-340B"), ("Nemotron4_340B", "Nemotron-4-340B"), ("Nemotron4 15B", "Nemotron-4-15B"),
    ("nvidia/Nemotron-4-15B-Base", "Nemotron-4-15B"),
    ("Llama-3-style 13B (14.84B)", "Llama-3-Style-13B"),  # KempnerForge's M13B: no Llama 3 of that size
    ("GPT-OSS 20B", "gpt-oss-20b"), ("DeepSeekV3 (w/ MTP)", "DeepSeek-V3"),
    ("LLAMA3_70B [LoRA (fine-tuning)]", "Llama-3.1-70B"),  # the model; LoRA is a training setting (test_lora.py)
    ("LLAMA4-Scout-LLM", "Llama-4-Scout-17B-16E"), ("Llama4 Scout", "Llama-4-Scout-17B-16E"),
    ("Llama 4 Maverick", "Llama-4-Maverick-17B-128E"), ("llama3_1_8b", "Llama-3.1-8B"),
    ("LLAMA3_1_405B", "Llama-3.1-405B"), ("DeepSeek-R1", "DeepSeek-V3"), ("deepseek-ai/DeepSeek-R1-0528", "DeepSeek-V3"),
    ("Llama-3.3-70B-Instruct", "Llama-3.1-70B"), ("llama3_3_70b", "Llama-3.1-70B"), ("DeepSeek-V3.1", "DeepSeek-V3"),
    ("Kimi_K2", "Kimi-K2-Instruct"), ("KIMI_K2", "Kimi-K2-Instruct"), ("Kimi K2 Thinking", "Kimi-K2-Instruct"),
    ("moonshotai/Kimi-K2-Base", "Kimi-K2-Instruct"), ("Kimi-K2-Instruct-0905", "Kimi-K2-Instruct"),
    ("GLM 4.5 Air", "GLM-4.5-Air"), ("zai-org/GLM-4.5-Air", "GLM-4.5-Air"), ("GLM-4.6", "GLM-4.5"), ("GLM 4.7", "GLM-4.5"),
    # Qwen3.5-VL is the catalog's own Qwen3.5 checkpoint (its config.json carries the vision tower)
    ("Qwen3.5-VL 122B-A10B", "Qwen3.5-122B-A10B"), ("Qwen3_5_VL_35B_A3B", "Qwen3.5-35B-A3B"),
    ("QWEN3.5-VL-397B-A17B", "Qwen3.5-397B-A17B"),
    ("Nemotron_3_Ultra", "NVIDIA-Nemotron-3-Ultra-550B-A55B"),
    ("DeepSeekV4 Flash", "DeepSeek-V4-Flash"), ("deepseek-ai/DeepSeek-V4-Pro-Base", "DeepSeek-V4-Pro"),
    ("NemotronH 56B", "Nemotron-H-56B-Base-8K"), ("NEMOTRONH_56B", "Nemotron-H-56B-Base-8K"),
    ("Nemotron_3_5_Lightning", "NVIDIA-Nemotron-3.5-Lightning-30B-A3B"),
    # Qwen3-VL: the catalog's entries are its language models (the vision encoder's work is left out)
    ("Qwen3-VL-30B-A3B", "Qwen3-VL-30B-A3B-Instruct"), ("QWEN3_VL_235B_A22B", "Qwen3-VL-235B-A22B-Instruct"),
    ("Nemotron V3 Ultra 550B (26.04)", "NVIDIA-Nemotron-3-Ultra-550B-A55B"),
    # a name that stops at its total size: the one catalog model of that family and size
    ("Qwen3.5-VL 397B", "Qwen3.5-397B-A17B"), ("Qwen3.5 35B", "Qwen3.5-35B-A3B"), ("Qwen3 235B", "Qwen3-235B-A22B"),
])
def test_new_source_names_map_onto_the_catalog(source, want):
    assert catalog_name(source) == (want, None)


@pytest.mark.parametrize("source", ["DeepSeek-R1-Distill-Llama-70B",  # a dense Llama, not V3's network
                                    "DeepSeek-V3.2-Exp",  # V3 with a sparse-attention indexer the catalog lacks
                                    "Kimi K2.5", "Kimi_K2_5",  # K2's language model with a vision tower
                                    "GLM-4.7-Flash", "GLM-4.6V", "GLM-5",  # MLA, vision, sparse attention
                                    "Qwen3 32B", "Qwen3.5 30B"])  # no catalog model of that family and size
def test_models_left_out_say_why(source):
    name, why = catalog_name(source)
    assert name is None and "not in the catalog" in why


def test_llama4_scout_rows_are_moe_rows_with_their_expert_parallelism():
    row = dict(source="NeMo Framework 25.07 performance summary (DGX-GB200)", model="LLAMA4-Scout-LLM", gpu="GB200",
               num_gpus="64", seq_len="8192", global_batch="1024", micro_batch="1", tp="1", pp="1", cp="1", vp="1",
               ep="16", etp="", precision="FP8 (per-tensor current scaling)", recompute="",
               tokens_per_s_per_gpu="13783", tflops_per_gpu="1501", notes="FSDP=0; GA=16")
    got = map_row(row)
    assert got["model"] == "Llama-4-Scout-17B-16E" and got["layout"]["ep"] == 16
    assert "missing field(s): ep" in map_row({**row, "ep": ""})  # an MoE model: EP is not assumed 1


ROW = dict(source="Megatron-Bridge perf summary:26.08", model="Nemotron_3_Super", gpu="GB300", num_gpus="64",
           seq_len="8192", global_batch="512", micro_batch="1", tp="1", pp="1", cp="1", vp="", ep="64", etp="",
           precision="NVFP4", recompute="", tokens_per_s_per_gpu="10240", tflops_per_gpu="", notes="MoE")


def test_super_rows_train_the_recipes_mtp_block_in_nvfp4():
    got = map_row(ROW)
    m = got["measurement"]
    assert m["precision"] == "nvfp4" and m["train_mtp"] and m["mtp_passes"] == 2
    assert "MTP trained" in got["source"] and "bf16_with_nvfp4_mixed" in got["source"]
    assert "train_mtp" not in map_row({**ROW, "source": "my cluster"})["measurement"]  # the preset is its source's
    # (a source of our own: Megatron-Bridge 26.08's DeepSeek-V3 recipes run kernels the model leaves out)
    ds = {**ROW, "source": "my cluster", "model": "DeepSeekV3 (w/ MTP)", "ep": "8", "precision": "FP8-MX"}
    assert map_row(ds)["measurement"]["train_mtp"]
    assert "train_mtp" not in map_row({**ds, "model": "DeepSeekV3 (w/o MTP)"})["measurement"]


@pytest.mark.parametrize("text,want", [
    ("", "none"), ("-", "none"), ("n/a", "none"), ("No recomputation", "none"), ("Full AC", "full:uniform:1"),
    ("full activation checkpointing", "full:uniform:1"), ("activation checkpointing (full)", "full:uniform:1"),
    ("Selective AC", "selective"), ("selective recomputation", "selective"), ("full:block:4", "full:block:4"),
    ("selective (mlp, up_proj)", "selective:mlp,mla_up_proj"), ("selective:mlp,up_proj", "selective:mlp,mla_up_proj"),
])
def test_recompute_spellings_are_read(text, want):
    assert str(map_row({**ROW, "recompute": text})["layout"]["recompute"]) == want


@pytest.mark.parametrize("text", ["sometimes", "true", "full:uniform", "selective: flux_capacitor"])
def test_recompute_that_is_no_megatron_setting_is_skipped_with_the_value(text):
    why = map_row({**ROW, "recompute": text})
    assert isinstance(why, str) and repr(text) in why


def test_number_cells_with_separators_approximations_and_k_lengths():
    got = map_row({**ROW, "seq_len": "8K", "global_batch": "1,024", "num_gpus": "64 ", "tokens_per_s_per_gpu": "~10,240"})
    m = got["measurement"]
    assert (m["seq_len"], m["global_batch"], m["count"], m["tokens_per_s_per_gpu"]) == (8192, 1024, 64, 10240.0)
    assert "missing field(s): global_batch" in map_row({**ROW, "global_batch": "1K"})  # a K batch is ambiguous


def test_a_row_with_only_mfu_is_read_against_the_dense_bf16_peak():
    from autotune.catalog import GPUS

    got = map_row({**ROW, "tokens_per_s_per_gpu": "", "tflops_per_gpu": "", "mfu": "25.4%"})
    assert got["tflops"] == pytest.approx(0.254 * GPUS["GB300"].bf16_tflops)
    assert "MFU as published (25.4%), read against GB300's dense BF16 peak" in got["source"]
    assert map_row({**ROW, "tokens_per_s_per_gpu": "", "tflops_per_gpu": "", "mfu": "0.254"})["tflops"] == \
        pytest.approx(got["tflops"])
    assert map_row({**ROW, "tokens_per_s_per_gpu": "", "tflops_per_gpu": "", "mfu": ""}) == \
        "missing field(s): tokens_per_s_per_gpu, tflops_per_gpu and mfu"


@pytest.mark.parametrize("field,value,why", [
    ("pp", "1e9", "pp '1e9' is not a parallel degree of 64 GPUs"),  # would size stage arrays of 1e9 (MemoryError)
    ("tp", "inf", "missing field(s): tp"), ("num_gpus", "NaN", "missing field(s): num_gpus"),
    ("tp", "2.5", "missing field(s): tp"), ("vp", "5000", "vp '5000' is out of range"),
    ("micro_batch", "4096", "micro_batch '4096' is not between 1 and the global batch (512)"),
    ("seq_len", "1e12", "seq_len '1e12' is out of range"),
])
def test_cells_that_are_no_run_skip_the_row_with_the_value(field, value, why):
    got = map_row({**ROW, field: value})
    assert isinstance(got, str) and got.startswith(why)


def test_a_row_whose_count_fills_no_nodes_is_skipped_not_raised():
    """12 GPUs on 8-GPU nodes: ClusterSpec refuses it; the row is skipped with that reason (one bad row of a
    user's table must not stop the others being read)."""
    from autotune.cost.measurements import _represent

    row = {**ROW, "source": "Megatron-Bridge perf archive:26.02.01", "model": "GPT OSS 120B", "gpu": "B200",
           "num_gpus": "12", "ep": "4", "precision": "BF16"}
    why = _represent(row, 2)
    assert isinstance(why, str) and "does not divide into nodes of 8 GPUs" in why


def test_nvfp4_is_blackwell_only_and_one_line_bad_input(capsys):
    with pytest.raises(BadInput, match="H100 has no FP4 tensor cores"):
        Workload(precision="nvfp4").check_gpu(GPUS["H100"])
    Workload(precision="nvfp4").check_gpu(GPUS["B200"])
    assert [g for g, spec in GPUS.items() if spec.fp4_tflops] == ["B200", "B300", "GB200", "GB300"]
    rc = main(["estimate", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--layout", "TP1",
               "--precision", "nvfp4"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "FP4 tensor cores" in err


def _ev(model, w, gpu, layout, **coef):
    return evaluate(load_model(model), w, ClusterSpec.of(gpu, layout.world), LayoutTable.from_layouts([layout]),
                    Calibration(gpu, TimeCoefficients(**coef)))


def test_nvfp4_runs_the_linears_at_the_fp4_peak_and_pays_an_amax_pass():
    lay = Layout(world=8, tp=1)
    whole = {"gemm_width": 1e-9, "gemm_rows": 1e-9}  # no shape loss: the GEMM times scale with the peak alone
    fp4 = _ev("Llama-3.1-8B", Workload(precision="nvfp4"), "B200", lay, **whole).time.mb_terms
    mx = _ev("Llama-3.1-8B", Workload(precision="mxfp8"), "B200", lay, **whole).time.mb_terms
    b = GPUS["B200"]
    c = Calibration("B200").time  # MXFP8's block-scaled GEMMs run at mxfp8_gemm of per-tensor FP8's rate
    ratio = c.mxfp8_gemm * b.fp8_tflops / b.fp4_tflops
    assert fp4["compute_dense"][0, 0] == pytest.approx(mx["compute_dense"][0, 0] * ratio)
    shipped = [_ev("Llama-3.1-8B", Workload(precision=p), "B200", lay).time.mb_terms["compute_dense"][0, 0]
               for p in ("nvfp4", "mxfp8")]
    assert shipped[1] * ratio < shipped[0] < shipped[1]  # the shape loss shrinks less than the math
    assert fp4["compute_attention"][0, 0] == pytest.approx(mx["compute_attention"][0, 0])  # attention stays BF16
    assert fp4["quantize"][0, 0] > mx["quantize"][0, 0]  # two-level scaling: an amax per tensor


def test_a_trained_mtp_block_adds_its_work_and_weights_to_the_last_stage_only():
    m = load_model(SUPER)
    t = LayoutTable.from_layouts([Layout(world=64, pp=2, ep=32)])
    off, one, two = (Workload(train_mtp=p > 0, mtp_passes=p) for p in (0, 1, 2))
    f0, f1, f2 = (stage_flops(m, w, t) for w in (off, one, two))
    for k in ("dense", "experts", "linear_attention", "attention"):
        a0, a1, a2 = (getattr(f, k)[0] for f in (f0, f1, f2))
        assert a1[0] == a0[0] and a2[1] - a0[1] == pytest.approx(2 * (a1[1] - a0[1]))
    assert f1.experts[0, 1] > f0.experts[0, 1] and f2.output[0, 1] == pytest.approx(3 * f0.output[0, 1])
    cluster = ClusterSpec.of("GB300", 64)
    w0, w2 = (estimate_memory(m, w, cluster, t).terms for w in (off, two))
    assert w2["weights"][0, 0] == w0["weights"][0, 0] and w2["weights"][0, 1] > w0["weights"][0, 1]
    added = (w2["weights"][0, 1] - w0["weights"][0, 1]) / 2  # bf16 weights; one copy for both passes
    assert added < param_counts(m).mtp / 8  # the block's experts are split over EP 32
    assert w2["activations"][0, 1] > w0["activations"][0, 1] and w2["activations"][0, 0] == w0["activations"][0, 0]


def test_megatron_readme_tflops_are_read_in_its_own_count():
    kept, _ = published_measurements()
    row = next(m for m in kept if m.model == "Megatron-GPT-1.7B")
    model = load_model("Megatron-GPT-1.7B")
    # Megatron-LM r0.8's num_floating_point_operations: attention over the whole row
    assert row.tokens_per_s_per_gpu == pytest.approx(408.8e12 / train_flops_per_token(model, 4096, causal=False))
    assert "Megatron-LM r0.8" in row.source


def test_expressed_rows_cover_the_new_families():
    kept, skipped = published_measurements()
    models = {m.model for m in kept}
    assert {NANO, SUPER, "Llama-3.1-8B", "Llama-2-70b-hf", "NeMo-GPT3-175B", "Megatron-GPT-462B",
            "Nemotron-4-340B"} <= models
    assert {"mxfp8", "nvfp4"} <= {m.precision for m in kept if m.model == SUPER}
    assert not [why for _, why in skipped if "NVFP4" in why]


def test_the_runner_refuses_a_model_it_cannot_build():
    spec = TrialSpec(study="t", number=3, model=NANO, gpu="cpu", count=2, gpus_per_node=2,
                     layout=Layout(world=2, ep=2).to_dict(),
                     workload=dataclasses.asdict(Workload(seq_len=256, global_batch=8)), steps=4, warmup_steps=1)
    with pytest.raises(BadInput) as err:
        plan_trial(spec)
    assert "\n" not in str(err.value) and "Mamba2" in str(err.value) and "autotune estimate" in str(err.value)


def _bridge_row(model: str, gpu: str, release: str, pp: int, vp: int, ep: int, gbs: int, mbs: int = 1,
                precision: str = "MXFP8") -> dict:
    return dict(source=f"Megatron-Bridge perf archive:{release}", model=model, gpu=gpu, num_gpus="256", seq_len="4096",
                global_batch=str(gbs), micro_batch=str(mbs), tp="1", pp=str(pp), cp="1", vp=str(vp), ep=str(ep), etp="",
                precision=precision, recompute="", tokens_per_s_per_gpu="4000", tflops_per_gpu="", notes="")


def test_kimi_k2_bridge_rows_read_their_recipe():
    """A Megatron-Bridge Kimi-K2 row takes its recipe's settings: the recipe's pipeline layout (16 stages, the last
    with one layer and the loss), HybridEP with router graphs on GB200, selective mla_up_proj, no MTP (K2 has none),
    and Muon's optimizer state (8 B per parameter: fp32 master + one momentum)."""
    got = map_row(_bridge_row("Kimi_K2", "GB200", "26.06", pp=4, vp=4, ep=64, gbs=2048))
    lay, meas = got["layout"], got["measurement"]
    assert got["model"] == "Kimi-K2-Instruct"
    assert tuple(lay["layer_split"]) == (4,) * 15 + (1,) and lay["vpp"] == 4
    assert lay["dispatcher"] == "hybridep" and lay["cuda_graphs"] == "router"
    assert str(lay["recompute"]) == "selective:mla_up_proj"
    assert meas["optimizer_state_bytes"] == 8.0 and not meas.get("train_mtp")


def test_deepseek_bridge_rows_train_mtp_unless_the_row_says_otherwise():
    """DeepSeek-V3's Megatron-Bridge recipes train one MTP layer (mtp_num_layers=1) and place it by their pipeline
    layout; the page's own FLOP count agrees (260 GFLOP/token against 250 for the 25.11 rows marked 'w/o MTP')."""
    got = map_row(_bridge_row("DeepSeekV3", "B200", "26.04", pp=16, vp=1, ep=8, gbs=4096))
    assert got["measurement"]["train_mtp"] and tuple(got["layout"]["layer_split"]) == (4,) * 15 + (1,)
    plain = map_row(_bridge_row("DeepSeekV3 (w/o MTP)", "GB200", "25.11", pp=4, vp=4, ep=64, gbs=4096,
                                precision="BF16"))
    assert not plain["measurement"].get("train_mtp")


def test_qwen3_next_bridge_rows_take_their_recipe_layout_and_say_the_mtp_is_not_counted():
    """Qwen3-Next's GB300 recipe runs PP2 VP4 with its own uneven layout (4, 7 x 5, 8, then one layer, MTP and the
    loss) on HybridEP with TE graphs; its model recipe trains one MTP layer, which the catalog's config (no MTP
    field) cannot describe: the reading says so instead of training a block the model lacks."""
    got = map_row({**_bridge_row("Qwen3_Next_80B_a3B", "GB300", "26.06", pp=2, vp=4, ep=32, gbs=1024, mbs=4),
                   "num_gpus": "64"})
    assert tuple(got["layout"]["layer_split"]) == (4, 7, 7, 7, 7, 7, 8, 1)
    assert got["layout"]["dispatcher"] == "hybridep" and got["layout"]["cuda_graphs"] == "attn"
    assert not got["measurement"].get("train_mtp") and "MTP layer(s), which the catalog's config" in got["source"]


def test_a_recipe_that_recomputes_the_moe_block_runs_attention_graphs_alone():
    """Nemotron 3 Nano's H100 BF16 recipe recomputes the MoE block (selective: moe, layernorm) beside TE graphs on
    attention and Mamba: Megatron refuses router graphs with that recompute, so its graphs were attention's alone. The
    row is read (not refused as an illegal pair) without graphs, saying so."""
    row = {**_bridge_row("Nemotron_3_Nano", "H100", "26.04", pp=1, vp=1, ep=8, gbs=1024, precision="BF16"),
           "num_gpus": "16", "seq_len": "8192"}
    got = map_row(row)
    assert isinstance(got, dict) and got["layout"].get("cuda_graphs", "none") == "none"
    assert "moe" in str(got["layout"]["recompute"]) and "attention only" in got["source"]


def test_a_qwen35_vl_row_is_the_catalog_checkpoint_and_says_the_vision_encoder_is_not_counted():
    from autotune.cost._published import map_row
    row = dict(source="Megatron-Bridge perf summary:26.08", model="Qwen3.5-VL 122B-A10B", gpu="GB300", num_gpus="32",
               seq_len="4096", global_batch="1024", micro_batch="2", tp="1", pp="1", cp="1", vp="", ep="32", etp="",
               precision="BF16", recompute="", tokens_per_s_per_gpu="5000", tflops_per_gpu="", mfu="",
               notes="force-balanced")
    vl = map_row(row)
    assert vl["model"] == "Qwen3.5-122B-A10B" and "vision encoder's work" in vl["source"]
    assert vl["layout"]["dispatcher"] == "hybridep"  # its v0.6.0 recipe's (qwen35_vl GB300, EP32 on HybridEP)
    assert "vision encoder" not in map_row({**row, "model": "Qwen3.5-122B-A10B"})["source"]


def test_qwen3_vl_rows_read_as_their_language_model_with_their_recipe():
    """A Megatron-Bridge Qwen3-VL row: the catalog's language model, its recipe's settings (the 235B GB200 recipes put
    10 layers on the first stage and 12 on the last), and the vision encoder's work said to be left out."""
    row = {**ROW, "model": "Qwen3_VL_235B_A22B", "gpu": "GB200", "seq_len": "4096", "global_batch": "1024",
           "micro_batch": "1", "pp": "8", "ep": "8", "precision": "MXFP8", "source": "Megatron-Bridge perf summary:26.02"}
    got = map_row(row)
    assert got["model"] == "Qwen3-VL-235B-A22B-Instruct"
    assert tuple(got["layout"]["layer_split"][:2]) == (10, 12) and sum(got["layout"]["layer_split"]) == 94
    assert "vision encoder's work" in got["source"]
    # its perf recipes freeze the language model (the pretrain mock config): forward and data gradient, no weight
    # gradient, no optimizer state; Qwen3.5-VL's recipes unfreeze theirs, and another source's row says nothing
    assert got["measurement"]["lora"] and "frozen language model" in got["source"]
    q35 = map_row({**row, "model": "Qwen3.5-VL 122B-A10B", "pp": "1", "ep": "8"})
    assert not q35["measurement"].get("lora") and "frozen" not in q35["source"]
    other = map_row({**row, "source": "NeMo AutoModel perf summary (PyTorch/FSDP2 backend)"})
    assert not isinstance(other, dict) or not other["measurement"].get("lora")
