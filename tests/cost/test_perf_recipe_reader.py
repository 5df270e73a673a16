"""bench/bridge_perf_recipes.py: Megatron-Bridge's flat perf recipes read from their syntax trees (nothing imported or
run), on a small tree written like the real one: a base model recipe behind an import alias, family helpers with
keyword parameters, a helper's `if layout is not None`, the flex-dispatcher and CUDA-graph helpers."""

from __future__ import annotations

import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bridge_perf_recipes as R  # noqa: E402

BASE = '''
from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend

def deepseek_v3_pretrain_1024gpu_h100_bf16_config():
    cfg = _pretrain_common()
    cfg.model.tensor_model_parallel_size = 2
    cfg.model.moe_flex_dispatcher_backend = "hybridep"
    cfg.model.recompute_granularity = None
    cfg.model.recompute_modules = None
    cfg.model.moe_shared_expert_overlap = True
    apply_flex_dispatcher_backend(cfg.model, cfg.model.moe_flex_dispatcher_backend)
    return cfg

def set_deepseek_v3_pipeline_model_parallel_layout(model_cfg, layout=None):
    if layout is not None:
        model_cfg.pipeline_model_parallel_layout = layout
        return
    model_cfg.pipeline_model_parallel_layout = "from-the-map"
'''
ALIAS = '''
from megatron.bridge.recipes.deepseek.h100.deepseek_v3 import (
    deepseek_v3_pretrain_1024gpu_h100_bf16_config as deepseek_v3_pretrain_config,
)
from megatron.bridge.recipes.deepseek.h100.deepseek_v3 import set_deepseek_v3_pipeline_model_parallel_layout
'''
COMMON = '''
from megatron.bridge.recipes.deepseek.deepseek_v3 import deepseek_v3_pretrain_config
from megatron.bridge.recipes.deepseek.deepseek_v3 import set_deepseek_v3_pipeline_model_parallel_layout

def _deepseek_v3_common(cfg):
    cfg.model.recompute_granularity = "selective"

def _full_iteration(cfg, *, fp8_dot_product_attention=False, fp8_output_proj=False):
    cfg.model.cuda_graph_impl = "full_iteration"
    cfg.model.moe_paged_stash = True
    cfg.model.fp8_output_proj = fp8_output_proj
    cfg.mixed_precision.fp8_dot_product_attention = fp8_dot_product_attention
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
'''
RECIPES = '''
from megatron.bridge.perf_recipes.deepseek.common import (_deepseek_v3_common, _full_iteration,
    deepseek_v3_pretrain_config, set_deepseek_v3_pipeline_model_parallel_layout)
from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

def deepseek_v3_pretrain_256gpu_gb300_fp8mx_config():
    cfg = deepseek_v3_pretrain_config()
    _deepseek_v3_common(cfg)
    cfg.model.tensor_model_parallel_size = 1
    cfg.model.pipeline_model_parallel_size = 2
    cfg.model.virtual_pipeline_model_parallel_size = 8
    cfg.model.expert_model_parallel_size = 32
    cfg.train.global_batch_size = 4096
    cfg.train.micro_batch_size = 1
    cfg.model.recompute_modules = []
    set_deepseek_v3_pipeline_model_parallel_layout(cfg.model, "Et*4|(t*4|)*14tmL")
    _full_iteration(cfg, fp8_output_proj=True)
    cfg.env_vars = {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": 1}
    return cfg

def deepseek_v3_pretrain_256gpu_gb300_bf16_config():
    cfg = deepseek_v3_pretrain_config()
    _deepseek_v3_common(cfg)
    cfg.model.pipeline_model_parallel_size = 4
    cfg.model.virtual_pipeline_model_parallel_size = 4
    cfg.model.recompute_modules = ["mla_up_proj"]
    cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(cfg.model, ["attn", "moe_router"])
    set_deepseek_v3_pipeline_model_parallel_layout(cfg.model)
    return cfg

def helper_config():
    return None
'''
FILES = {"src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py": BASE,
         "src/megatron/bridge/recipes/deepseek/deepseek_v3.py": ALIAS,
         "src/megatron/bridge/perf_recipes/deepseek/common.py": COMMON,
         "src/megatron/bridge/perf_recipes/deepseek/gb300/deepseek_v3.py": RECIPES}


def _rows():
    got = {name: R.row_of("v9", path, name, s, {"deepseek": {(4, 4): "map-4-4"}}, {"deepseek": 1})
           for path, name, s in R.read_recipes(FILES)}
    return {k: v for k, v in got.items() if v}


def test_a_recipe_reads_its_base_recipe_helpers_and_keyword_arguments():
    rows = _rows()
    assert set(rows) == {"deepseek_v3_pretrain_256gpu_gb300_fp8mx_config", "deepseek_v3_pretrain_256gpu_gb300_bf16_config"}
    mx = rows["deepseek_v3_pretrain_256gpu_gb300_fp8mx_config"]
    assert (mx["model"], mx["gpu"], mx["precision"]) == ("DeepSeek-V3", "GB300", "mxfp8")
    assert (mx["tp"], mx["pp"], mx["vp"], mx["ep"], mx["mbs"], mx["gbs"]) == (1, 2, 8, 32, 1, 4096)
    assert mx["dispatcher"] == "hybridep" and mx["shared_overlap"] == 0  # the base recipe's flex backend
    assert mx["cuda_graphs"] == "full" and mx["ep_overlap"] == 1
    assert mx["kernels"].split() == ["paged_stash", "cutedsl_fused_grouped_mlp", "fp8_output_proj"]  # no FP8 attention
    assert mx["recompute"] == "none"  # recompute_modules [] turns selective recompute off
    assert mx["pp_layout"] == "Et*4|(t*4|)*14tmL"  # the helper's `if layout is not None` branch, then its return


def test_a_helper_without_its_optional_argument_and_the_graph_helper():
    bf = _rows()["deepseek_v3_pretrain_256gpu_gb300_bf16_config"]
    assert bf["pp_layout"] == "from-the-map"  # the branch not taken: the helper's own assignment
    assert bf["recompute"] == "selective:mla_up_proj" and bf["cuda_graphs"] == "attn" and bf["kernels"] == ""
    assert bf["tp"] == 2  # the base recipe's, untouched by the perf recipe


def test_a_base_recipe_that_returns_another_builds_its_config_there():
    files = dict(FILES)
    files["src/megatron/bridge/recipes/deepseek/deepseek_v3.py"] = '''
from megatron.bridge.recipes.deepseek.h100.deepseek_v3 import deepseek_v3_pretrain_1024gpu_h100_bf16_config as _base
from megatron.bridge.recipes.deepseek.h100.deepseek_v3 import set_deepseek_v3_pipeline_model_parallel_layout

def deepseek_v3_pretrain_config():
    """an alias that returns the hardware recipe's config"""
    return _base()
'''
    rows = {name: R.row_of("v9", path, name, s, {}, {}) for path, name, s in R.read_recipes(files)}
    bf = rows["deepseek_v3_pretrain_256gpu_gb300_bf16_config"]
    assert bf["tp"] == 2 and bf["dispatcher"] == "hybridep"  # what the returned base recipe set


def test_one_reading_of_the_cuda_graph_settings_for_every_release():
    """bench/bridge_presets.py (v0.2.0 to v0.5.1) and the v0.6.0 reader share graphs_name: an impl set to "none"
    beside a full_iteration scope runs no graphs (v0.6.0's _benchmark_common clears that scope; Llama's NVFP4 recipes
    set exactly that), an unset impl beside it is promoted to full-iteration graphs."""
    import bridge_presets as B
    assert R.graphs_name("none", ["full_iteration"]) == "none"
    assert R.graphs_name(None, "full_iteration") == "full"
    assert R.graphs_name("local", []) == R.graphs_name("full_iteration", None) == "full"
    assert R.graphs_name("transformer_engine", ["attn", "moe_router"]) == "attn"
    assert R.graphs_name("transformer_engine", ["moe_router", "moe_preprocess"]) == "router"
    assert B._graphs(B._base(cuda_graph_impl="none", cuda_graph_scope="full_iteration")) == "none"


def test_a_recipe_megatron_would_refuse_is_not_counted_as_out_of_memory():
    """bench/bridge_recipes_fit.py: a recipe with no pipeline layout whose layers (plus an embedding and a loss
    counted as layers, which a recipe may ask for) do not divide over PP, and each rank's over VPP, is refused by
    megatron-core's get_num_layers_to_build before any memory is used; v0.2.x's DeepSeek-V3 H100 recipes take the
    layout their perf script passes to the model recipe."""
    import dataclasses

    import bridge_presets as B
    import bridge_recipes_fit as F

    from autotune.catalog import load_model
    from autotune.layout import Layout

    m = types.SimpleNamespace(spec=load_model("Qwen3.5-397B-A17B"), layout=Layout.parse("TP2 PP8 VPP4 EP32", world=256))
    why = F._megatron_refuses(m, "")
    assert why and "60 decoder layers do not divide over PP 8 x VPP 4" in why
    assert F._megatron_refuses(m, "Et*2|(t*2|)*30tL") is None  # a layout the recipe sets is Megatron's to place
    m.layout = dataclasses.replace(m.layout, pp=4, vpp=1)
    assert F._megatron_refuses(m, "") is None  # 60 / 4
    m = types.SimpleNamespace(spec=load_model("Llama-3.1-405B"), layout=Layout.parse("TP8 PP8 VPP8 CP2", world=1024))
    assert F._megatron_refuses(m, "") is None  # 126 + embedding + loss = 128 over PP 8 x VPP 8
    # the perf script's own settings, outside the base configs: v0.2.x's DeepSeek-V3 H100 layout (PP8 VP4 has no
    # entry in the model recipe's map: v0.3.0's base config carries its own), 26.06's MXFP8 output layer
    ds = B._base(num_gpus=1024, tensor_model_parallel_size=2, pipeline_model_parallel_size=8,
                 virtual_pipeline_model_parallel_size=4, expert_model_parallel_size=64)
    assert B._row("v0.2.0", "p", "DEEPSEEK_V3_H100_BF16_BASE_CONFIG", ds)["pp_layout"] == "Et|(tt|)*30mL"
    assert B._row("v0.3.0", "p", "DEEPSEEK_V3_H100_BF16_BASE_CONFIG", ds)["pp_layout"] == ""
    oss = B._base(num_gpus=64, expert_model_parallel_size=16)
    kernels = lambda rel, name: B._row(rel, "p", name, oss)["kernels"].split()  # noqa: E731
    assert "fp8_output_proj" in kernels("v0.5.0", "GPT_OSS_120B_PRETRAIN_CONFIG_GB300_FP8_MX_V1")
    assert "fp8_output_proj" not in kernels("v0.4.0", "GPT_OSS_120B_PRETRAIN_CONFIG_GB300_FP8_MX_V1")
    assert "fp8_output_proj" not in kernels("v0.5.0", "GPT_OSS_120B_PRETRAIN_CONFIG_GB300_BF16_V1")
    assert "fp8_output_proj" in kernels("v0.5.1", "DEEPSEEK_V3_PRETRAIN_CONFIG_B300_FP8_MX_V1")
    assert "fp8_output_proj" not in kernels("v0.5.0", "DEEPSEEK_V3_PRETRAIN_CONFIG_B300_FP8_MX_V1")
