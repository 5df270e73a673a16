"""How published rows are read where the page and its release's recipes disagree: NVFP4 and Nemotron 3 recipes are
recipes like the others, a GA column that contradicts the row's own MBS gives way to the recipe's micro-batch, and a
printed layout that cannot hold its own weights, gradients and optimizer state is read as its release's recipe."""

from __future__ import annotations

from autotune.cost._presets import _recipes, row_settings
from autotune.cost.measurements import _represent, _state_bytes, published_measurements

_SRC = "Megatron-Bridge perf archive:"


def _row(**kw) -> dict:
    base = dict(source=_SRC + "26.02.01", model="LLAMA3_70B", gpu="GB300", num_gpus="64", seq_len="8192",
                global_batch="256", micro_batch="1", tp="1", pp="4", cp="1", vp="5", ep="", etp="", precision="NVFP4",
                recompute="", tokens_per_s_per_gpu="7000", tflops_per_gpu="", mfu="", notes="pre-training")
    return {**base, **kw}


def test_nvfp4_and_nemotron_3_recipes_are_read():
    recipes = _recipes()
    assert any(r["precision"] == "nvfp4" and r["model"] == "Llama-3.1-70B" for r in recipes)
    supers = [r for r in recipes if r["model"] == "NVIDIA-Nemotron-3-Super-120B-A12B" and r["gpu"] == "B200"
              and r["precision"] == "mxfp8"]
    # its recipe names moe_flex_dispatcher_backend="hybridep": the flex dispatcher on HybridEP
    assert supers and all(r["recompute"] == "selective:moe_act,layernorm" and r["dispatcher"] == "hybridep"
                          for r in supers)
    # the Super model recipe sets no comm_overlap: its TP2 recipes run without TP overlap
    assert all(r["tp_comm_overlap"] == "0" for r in recipes if r["model"].startswith("NVIDIA-Nemotron-3-Super"))
    kept, _ = published_measurements()
    b200 = [m for m in kept if m.model.endswith("Super-120B-A12B") and m.gpu == "B200" and m.precision == "mxfp8"]
    assert b200 and all(str(m.layout.recompute) == "selective:moe_act,layernorm" for m in b200)


def test_a_ga_column_that_contradicts_the_rows_mbs_takes_the_recipes_micro_batch():
    lay = {"world": 64, "tp": 1, "pp": 4, "cp": 1, "vpp": 1, "ep": 8, "micro_batch_size": 4}
    row = {"source": _SRC + "25.11", "model": "GPT OSS 120B", "notes": "GA=2; MoE"}
    out = row_settings(row, "gpt-oss-120b", "H100", "bf16", lay, 512, True)
    assert out["layout"]["micro_batch_size"] == 1 and "GA 2 contradicts" in " ".join(out["read"])
    consistent = row_settings({**row, "notes": "GA=8; MoE"}, "gpt-oss-120b", "H100", "bf16", lay, 512, True)
    assert "micro_batch_size" not in consistent["layout"]  # GA 8 x DP 16 x MBS 4 = 512: the page is taken at its word


def test_a_printed_layout_that_cannot_hold_its_state_is_read_as_the_releases_recipe():
    printed = _row(micro_batch="2", pp="1", vp="")  # the 26.02.01 page: TP1 PP1 MBS 2, FSDP 0
    m = _represent(printed, 2)
    assert (m.layout.tp, m.layout.pp, m.layout.vpp, m.layout.micro_batch_size) == (1, 4, 5, 1)
    assert "as printed (TP1 PP1 MBS2" in m.source
    assert _state_bytes(m) < m.cluster.gpu.memory_bytes
    # a printed layout that holds its state is left as printed, even where no recipe has it
    small = _represent(_row(model="LLAMA3_70B", pp="8", vp="5", micro_batch="1"), 2)
    assert small.layout.pp == 8 and "as printed" not in small.source


def test_a_rows_pp_layout_sets_its_vp_and_split():
    """The moe_recipes README's DeepSeek-V3 rows give no VP but Megatron's layout string ('PP layout
    Et*4|(tttt|)*14tmL'): 16 virtual stages on PP 8 are VP 2, with EP overlap legal there (it needs VPP with PP);
    its recipe YAML's selective recompute is taken, and a row the string does not fit is skipped saying why."""
    row = dict(source="Megatron-LM examples/moe_recipes README (dev)", model="DeepSeek-V3", gpu="B200",
               num_gpus="256", seq_len="4096", global_batch="2048", micro_batch="1", tp="1", pp="8", cp="1", vp="",
               ep="32", etp="1", precision="MXFP8", recompute="", tokens_per_s_per_gpu="", tflops_per_gpu="776.7",
               mfu="", notes="features: DeepEP; EP overlap; force-balanced routing; PP layout Et*4|(tttt|)*14tmL; "
               "MTP 1")
    m = _represent(row, 1)
    assert not isinstance(m, str), m
    assert m.layout.vpp == 2 and m.layout.layer_split == (4,) * 15 + (1,) and m.layout.ep_overlap
    assert m.layout.recompute.modules == ("mla_up_proj", "mlp") and "PP layout" in m.source
    assert "deepseek_v3/b200/mxfp8_256GPU_TP1PP8EP32.yaml (commit 8a2ac1fdc7)" in m.source
    assert "16 stages on PP 4 x VPP 2" in _represent({**row, "pp": "4", "vp": "2", "ep": "64"}, 1)
    assert "fine-grained activation offloading" in _represent({**row, "notes": row["notes"] + "; fine-grained "
                                                               "activation offloading"}, 1)
    from autotune.cost._published import _pipeline_layout

    for spelt in ('--pipeline-model-parallel-layout "Et*4|(tttt|)*14tmL"', "pipeline layout: Et*4|(tttt|)*14tmL;"):
        assert _pipeline_layout(spelt, 8, None)["vpp"] == 2
    assert _pipeline_layout("PP layout (see the page)", 8, None) == {}  # prose: the split is Megatron's usual one
    assert "the loss 'L' must appear once" in _pipeline_layout("PP layout Et*4|(tttt|)*14tm", 8, None)


def test_a_bare_module_list_is_selective_recompute_and_1f1b_overlap_is_ep_overlap():
    """The MoE model zoo's tables write recompute as Megatron's modules in short ('norm, act') and EP overlap as
    '+1f1b overlap'; a word that is no module keeps the row out, naming it."""
    from autotune.cost._published import map_row

    row = dict(source="Megatron-MoE-ModelZoo", model="Qwen3-235B-A22B", gpu="H100", num_gpus="256", seq_len="4096",
               global_batch="2048", micro_batch="1", tp="2", pp="8", cp="1", vp="4", ep="32", etp="1",
               precision="BF16", recompute="norm, act", tokens_per_s_per_gpu="", tflops_per_gpu="276", mfu="",
               notes="DeepEP; +1f1b overlap")
    got = map_row(row)
    assert got["layout"]["recompute"].modules == ("layernorm", "moe_act") and got["layout"]["ep_overlap"]
    assert map_row({**row, "recompute": "mla_up_proj mlp"})["layout"]["recompute"].modules == ("mla_up_proj", "mlp")
    assert not map_row({**row, "notes": "DeepEP"})["layout"].get("ep_overlap")
    assert map_row({**row, "recompute": "norm, banana"}) == ("recompute 'norm, banana' is not a Megatron setting we "
                                                              "can map")
