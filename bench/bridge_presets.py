"""Rebuild cost/data/megatron_bridge_presets.csv: the settings Megatron-Bridge's performance recipes ran with.

The published Megatron-Bridge rows (cost/data/published_throughput.csv) give the parallel layout only; the
recipe behind each number also sets recompute, the MoE dispatcher backend, EP communication overlap, CUDA
graphs, TP communication overlap, FSDP and activation offload. This script reads them from a Megatron-Bridge
git checkout (github.com/NVIDIA-NeMo/Megatron-Bridge), release by release, and writes one line per recipe
of a model in autotune's catalog, with the file and the recipe's name, so `_published.map_row` can take the
settings of the recipe whose layout equals the row's. Nothing is executed from the checkout: the workload
files are dataclass literals, read here with a stand-in WorkloadBaseConfig.

    python bench/bridge_presets.py /path/to/Megatron-Bridge [--out src/autotune/cost/data/megatron_bridge_presets.csv]

Family rules (what each release's scripts/performance/configs/<family>/*_llm_pretrain.py adds to the
workload base config, read for v0.2.0 to v0.5.1): DeepSeek-V3 always recomputes selectively (Megatron's
default module core_attn when the base config names none) and overlaps the shared expert on the alltoall
dispatcher; Qwen3 MoE resets recompute to none and enables TP overlap; Llama and gpt-oss enable TP overlap when
TP > 1 (not with NVFP4); Nemotron 3 Super's model recipe (src/megatron/bridge/recipes/nemotronh/nemotron_3_super.py)
sets no comm_overlap (no TP overlap), Nemotron 3 Nano's sets TP overlap (its perf recipes all run TP 1). A recipe that
names `moe_flex_dispatcher_backend` runs the flex dispatcher on that backend ("deepep": autotune's `flex`,
"hybridep": `hybridep`). NVFP4 recipes are read as the others (v0.3.0 on). Kimi-K2 (v0.3.1 on) as DeepSeek-V3:
selective recompute, no TP overlap. A recipe's pipeline layout is its `pp_layout`, else the one its family's model
recipe derives from PP and VP (_FAMILY_LAYOUTS); DeepSeek-V3's model recipe trains one MTP layer (_FAMILY_MTP);
DeepSeek-V3's and Kimi-K2's overlap the shared expert where the dispatcher is alltoall and A2A overlap is off.
v0.1.0rc4's YAML perf matrix is read by hand (MANUAL below, each line with its file); v0.6.0's perf_recipes functions
by bench/bridge_perf_recipes.py.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import types
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bridge_perf_recipes import git as _git, graphs_name, read_release  # noqa: E402  (v0.6.0's flat perf recipes)

RELEASES = ("v0.2.0", "v0.2.2", "v0.3.0", "v0.3.1", "v0.4.0", "v0.4.1", "v0.4.2", "v0.5.0", "v0.5.1")
MODELS = {"DEEPSEEK_V3": "DeepSeek-V3", "GPT_OSS_120B": "gpt-oss-120b", "QWEN3_30B_A3B": "Qwen3-30B-A3B",
          "QWEN3_235B_A22B": "Qwen3-235B-A22B", "LLAMA3_70B": "Llama-3.1-70B", "LLAMA31_405B": "Llama-3.1-405B", "LLAMA3_8B": "Llama-3.1-8B",
          "NEMOTRON_3_NANO": "NVIDIA-Nemotron-3-Nano-30B-A3B", "NEMOTRON_3_SUPER": "NVIDIA-Nemotron-3-Super-120B-A12B",
          "KIMI_K2": "Kimi-K2-Instruct", "QWEN3_NEXT_80B_A3B": "Qwen3-Next-80B-A3B-Instruct",
          "NEMOTRONH_56B": "Nemotron-H-56B-Base-8K", "QWEN3_VL_30B_A3B": "Qwen3-VL-30B-A3B-Instruct",
          "QWEN3_VL_235B_A22B": "Qwen3-VL-235B-A22B-Instruct"}
PRECISIONS = {"BF16": "bf16", "FP8_CS": "fp8-tensorwise", "FP8_MX": "mxfp8", "FP8_SC": "fp8-blockwise",
              "FP8_DS": "fp8-delayed", "NVFP4": "nvfp4"}
NAME = re.compile(r"^(?P<m>[A-Z0-9_]+?)_(?:(?P<task>PRETRAIN|SFT|LORA)_CONFIG_)?(?P<gpu>GB300|GB200|B300|B200|H100)_"
                  r"(?:(?P<task2>SFT|LORA)_)?(?P<p>BF16|FP8_CS|FP8_MX|FP8_SC|FP8_DS|NVFP4)(?:_(?P<v>V\d|BASE_CONFIG))?$")
COLUMNS = ("release", "model", "gpu", "precision", "task", "tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "fsdp",
           "recompute", "act_offload_layers", "cuda_graphs", "dispatcher", "ep_overlap", "tp_comm_overlap",
           "capacity_factor", "shared_overlap", "pp_layout", "mtp", "kernels", "recipe", "file", "offload_modules")


@dataclass
class _Base:  # stands in for scripts/performance/utils/utils.py WorkloadBaseConfig (same field names)
    num_gpus: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    global_batch_size: int = 1
    micro_batch_size: int = 1
    use_megatron_fsdp: bool | None = None
    nccl_ub: bool | None = None
    cuda_graph_impl: str | None = None
    cuda_graph_scope: object = None
    cpu_offloading_num_layers: int | None = None
    recompute_num_layers: int | None = None
    recompute_modules: list | None = None
    moe_flex_dispatcher_backend: str | None = None
    moe_a2a_overlap: bool | None = False
    peft: str | None = None
    pp_layout: str | None = None
    extra: dict = field(default_factory=dict)


def _base(**kw) -> _Base:
    known = {k: v for k, v in kw.items() if k in _Base.__dataclass_fields__}
    b = _Base(**known)
    b.extra = {k: v for k, v in kw.items() if k not in known}
    return b


def _replace(obj, **kw):
    known = {k: v for k, v in kw.items() if k in _Base.__dataclass_fields__ and k != "extra"}
    return replace(obj, **known, extra={**obj.extra, **{k: v for k, v in kw.items() if k not in known}})


def _load(text: str) -> dict:
    """The module's upper-case WorkloadBaseConfig constants, with `replace` and the class stood in."""
    text = re.sub(r"^from utils\.\S+ import .*$|^from \. import .*$", "", text, flags=re.M)
    text = text.replace("from dataclasses import replace", "")
    ns: dict = {"WorkloadBaseConfig": _base, "replace": _replace, "List": list, "Optional": None}
    mod = types.ModuleType("w")
    mod.__dict__.update(ns)
    exec(compile(text, "workload_base_configs", "exec"), mod.__dict__)  # noqa: S102 - dataclass literals only
    return {k: v for k, v in mod.__dict__.items() if k.isupper() and isinstance(v, _Base)}


def _graphs(b: _Base) -> str:
    return graphs_name(b.cuda_graph_impl, b.cuda_graph_scope)


def _recompute(family: str, b: _Base) -> str:
    if b.recompute_num_layers:
        return f"full:block:{b.recompute_num_layers}"
    mods = [m for m in (b.recompute_modules or []) if m]
    if b.recompute_modules is not None and not mods:  # [] turns recompute off (scripts/performance/utils/overrides.py)
        return "none"
    if mods:
        return "selective:" + ",".join(mods)
    return "selective" if family in ("deepseek", "kimi") else "none"


# (PP, VP) -> the --pipeline-model-parallel-layout a family's model recipe sets when the workload config names none
# (DeepSeek-V3: src/megatron/bridge/recipes/deepseek/deepseek_v3.py set_deepseek_v3_pipeline_model_parallel_layout, the
# same map v0.1.0rc4 to v0.6.0, its last stage carrying the MTP layer: the recipe trains mtp_num_layers=1; Kimi-K2:
# recipes/kimi/kimi_k2.py _get_kimi_k2_pipeline_layout, v0.4.0 on, no MTP), written as layout strings
# Qwen3-VL 235B-A22B's GB200 / B200 recipes put 10 layers on the first stage and 12 on the last
# (cfg.model.num_layers_in_first_pipeline_stage / _last_, perf configs qwen_vl/qwen3_vl_pretrain.py v0.3.0 to v0.5.1,
# perf_recipes/qwen_vl/{gb200,b200}/qwen3_vl.py v0.6.0): at PP 8 the six middle stages take 12 each
_FAMILY_LAYOUTS = {
    "qwen3_vl": {(8, 1): "Et*10|(t*12|)*6t*12L"},
    "deepseek": {(4, 1): "Et*16|t*16|t*16|t*13mL", (8, 1): "Et*8|(t*8|)*6t*5mL", (4, 2): "Et*8|(t*8|)*6t*5mL",
                 (16, 1): "Et*4|(t*4|)*14tmL", (8, 2): "Et*4|(t*4|)*14tmL", (4, 4): "Et*4|(t*4|)*14tmL"},
    "kimi": {(4, 1): "Et*16|t*16|t*16|t*13L", (8, 1): "Et*8|(t*8|)*6t*5L", (4, 2): "Et*8|(t*8|)*6t*5L",
             (16, 1): "Et*4|(t*4|)*14tL", (8, 2): "Et*4|(t*4|)*14tL", (4, 4): "Et*4|(t*4|)*14tL",
             (2, 8): "Et*4|(t*4|)*14tL"},
}
# MTP layers a family's model recipe trains (DeepSeek-V3's recipe: mtp_num_layers=1 in every release read, the 25.11
# page's GB200 / GB300 rows say "w/o MTP", which the row reader honours; Qwen3-Next's recipes/qwen/qwen3_next.py:
# mtp_num_layers = 1, its perf layouts end in 'tmL')
_FAMILY_MTP = {"deepseek": 1, "qwen3_next": 1, "deepseek_v4": 1,  # DeepSeek-V4: the HF config's num_nextn_predict_layers
               "nemotron_lightning": 2}  # Lightning's perf recipes: mtp_num_layers 2, one repeated "*E" block


# layouts a release's perf script passes to the model recipe itself (`pretrain_config(layout=...)`), not in the
# workload base config: v0.2.x's scripts/performance/configs/deepseek/deepseek_llm_pretrain.py gives its H100 recipes
# (PP8 VP4, no entry in the model recipe's map) "Et|(tt|)*30mL"; from v0.3.0 the base configs carry it themselves
_SCRIPT_LAYOUTS = {(rel, "DEEPSEEK_V3", "H100"): "Et|(tt|)*30mL" for rel in ("v0.2.0", "v0.2.2")}


def _pp_layout(family: str, b: _Base, script: str = "") -> str:
    if b.pp_layout:
        return b.pp_layout
    return script or _FAMILY_LAYOUTS.get(family, {}).get((b.pipeline_model_parallel_size,
                                                          b.virtual_pipeline_model_parallel_size or 1), "")


# the flex dispatcher's backend -> autotune's dispatcher name (flex runs DeepEP, hybridep HybridEP)
_DISPATCHER = {"deepep": "flex", "hybridep": "hybridep"}


# the family scripts' own switch, outside the base configs: their GB300 / GB200 functions (v0.5.1: DeepSeek-V3's B300
# one too) run the output layer under MXFP8 when the recipe is MXFP8 (`if cfg.mixed_precision.fp8_recipe == "mxfp8":
# cfg.model.fp8_output_proj = True`, scripts/performance/configs/{deepseek,gpt_oss}/*_llm_pretrain.py, v0.5.0 and v0.5.1;
# none before v0.5.0; v0.6.0's perf_recipes set it in the recipes, read by bench/bridge_perf_recipes.py)
_OUTPUT_PROJ = {"v0.5.0": {"deepseek": ("GB300", "GB200"), "gpt_oss": ("GB300", "GB200")},
                "v0.5.1": {"deepseek": ("GB300", "GB200", "B300"), "gpt_oss": ("GB300", "GB200")}}


def _row(release: str, path: str, name: str, b: _Base) -> dict | None:
    m = NAME.match(name)
    if not m or m.group("m") not in MODELS:
        return None
    family = {"DEEPSEEK_V3": "deepseek", "GPT_OSS_120B": "gpt_oss", "QWEN3_30B_A3B": "qwen3",
              "QWEN3_235B_A22B": "qwen3", "NEMOTRON_3_SUPER": "nemotron_super",
              "KIMI_K2": "kimi", "QWEN3_NEXT_80B_A3B": "qwen3_next", "QWEN3_VL_30B_A3B": "qwen3_vl",
              "QWEN3_VL_235B_A22B": "qwen3_vl"}.get(m.group("m"), "llama")
    prec = PRECISIONS[m.group("p")]
    task = (m.group("task") or m.group("task2") or "PRETRAIN").lower()
    if task == "lora":  # not modelled: no row can use the preset
        return None
    backend = b.moe_flex_dispatcher_backend
    tp = b.tensor_model_parallel_size
    tp_overlap = tp > 1 and (family in ("qwen3", "qwen3_next") or prec != "nvfp4") and family not in ("deepseek", "nemotron_super", "kimi")
    kernels = [k for k in ("cutedsl_fused_grouped_mlp", "fp8_dot_product_attention") if b.extra.get(k)]
    if prec == "mxfp8" and m.group("gpu") in _OUTPUT_PROJ.get(release, {}).get(family, ()):
        kernels.append("fp8_output_proj")
    if _graphs(b) == "full" and family != "llama":
        kernels.append("paged_stash")  # dropless full-iteration graphs run on paged stash buffers
    return {
        "release": release, "model": MODELS[m.group("m")], "gpu": m.group("gpu"), "precision": prec,
        "task": task,
        "tp": tp, "pp": b.pipeline_model_parallel_size, "cp": b.context_parallel_size,
        "vp": b.virtual_pipeline_model_parallel_size or 1, "ep": b.expert_model_parallel_size,
        "mbs": b.micro_batch_size, "gbs": b.global_batch_size, "fsdp": int(bool(b.use_megatron_fsdp)),
        "recompute": _recompute(family, b), "act_offload_layers": b.cpu_offloading_num_layers or 0,
        "cuda_graphs": _graphs(b), "dispatcher": _DISPATCHER.get(backend or "", "alltoall"),
        "ep_overlap": int(bool(b.moe_a2a_overlap)), "tp_comm_overlap": int(tp_overlap), "capacity_factor": 0,
        # DeepSeek-V3's and Kimi-K2's model recipes overlap the shared expert (moe_shared_expert_overlap=True), which
        # Megatron runs on the alltoall dispatcher only
        "shared_overlap": int(family in ("deepseek", "kimi") and not backend and not b.moe_a2a_overlap),
        "pp_layout": _pp_layout(family, b, _SCRIPT_LAYOUTS.get((release, m.group("m"), m.group("gpu")), "")), "mtp": _FAMILY_MTP.get(family, 0), "kernels": " ".join(kernels), "recipe": name, "file": path,
    }


# v0.1.0rc4 (25.09): scripts/performance/configs/*/*.yaml perf_matrix plus run_script.py's per-model switches
# (DeepSeek-V3: DeepEP and 1F1B A2A overlap on H100, token drop with capacity factor 1.0 on B200/GB200; Qwen3 MoE:
# token drop everywhere, TP overlap).
_R1 = "scripts/performance/configs/{}; scripts/performance/run_script.py"
MANUAL = [
    dict(release="v0.1.0rc4", model="DeepSeek-V3", gpu="H100", precision="*", tp=2, pp=8, cp=1, vp=4, ep=64, mbs=1,
         gbs=8192, recompute="selective:mla_up_proj,mlp", dispatcher="flex", ep_overlap=1, pp_layout="Et|(tt|)*30mL",
         mtp=1, recipe="perf_matrix.h100.num_gpus_1024", file=_R1.format("deepseek/deepseek_v3_llm_pretrain.yaml")),
    dict(release="v0.1.0rc4", model="DeepSeek-V3", gpu="GB200", precision="*", tp=1, pp=4, cp=1, vp=4, ep=64, mbs=1,
         gbs=2048, recompute="selective:mla_up_proj", capacity_factor=1.0, shared_overlap=1,
         pp_layout=_FAMILY_LAYOUTS["deepseek"][4, 4], mtp=1, recipe="perf_matrix.gb200.num_gpus_256 (use_tokendrop)", file=_R1.format("deepseek/deepseek_v3_llm_pretrain.yaml")),
    dict(release="v0.1.0rc4", model="DeepSeek-V3", gpu="B200", precision="*", tp=1, pp=16, cp=1, vp=1, ep=8, mbs=1,
         gbs=2048, recompute="selective:mla_up_proj", capacity_factor=1.0, shared_overlap=1,
         pp_layout=_FAMILY_LAYOUTS["deepseek"][16, 1], mtp=1, recipe="perf_matrix.b200.num_gpus_256 (use_tokendrop)", file=_R1.format("deepseek/deepseek_v3_llm_pretrain.yaml")),
    # Qwen3 30B-A3B: its perf matrix sets cuda_graphs: true on GB200 and B200 (false on H100): megatron-core's
    # per-layer graphs of the whole layer (enable_cuda_graph), which under token drop with padding capture every
    # kernel of the MoE block too and leave the host no sync: priced as the `full` capture (no launches, no host)
    *[dict(release="v0.1.0rc4", model="Qwen3-30B-A3B", gpu=_gpu, precision="*", tp="*", pp="*", cp="*", vp="*", ep="*",
           mbs="*", gbs="*", capacity_factor=1.0, tp_comm_overlap=1, cuda_graphs=_cg,
           recipe=f"qwen3_30b_a3b (apply_moe_token_drop){' perf_matrix.' + _gpu.lower() + ' cuda_graphs' if _cg != 'none' else ''}",
           file=_R1.format("qwen3/qwen3_30b_a3b_llm_pretrain.yaml"))
      for _gpu, _cg in (("H100", "none"), ("GB200", "full"), ("B200", "full"))],
    dict(release="v0.1.0rc4", model="Llama-3.1-405B", gpu="GB200", precision="fp8-tensorwise", tp=2, pp=1, cp=1, vp=1,
         ep=1, mbs=1, gbs=64, fsdp=1, act_offload_layers=95, tp_comm_overlap=1,
         recipe="perf_matrix.gb200.num_gpus_128.fp8_cs", file=_R1.format("llama31/llama31_405b_llm_pretrain.yaml")),
]
# the rest of v0.1.0rc4's Llama perf matrix: layouts as printed there; TP overlap wherever TP > 1 (run_script.py's
# COMM_OVERLAP_CONFIG_MAP userbuffer configs for llama3_70b / llama31_405b). `cuda_graphs: true` (utils/helpers.py
# set_cuda_graph_overrides: model.enable_cuda_graph, megatron-core's per-layer graphs of the whole layer) is autotune's
# `attn` on these dense models: Llama 3 8B on B200 (every precision) and on GB200 in BF16 and MXFP8, 70B on B200 in BF16
_LAYER_GRAPHS = {("Llama-3.1-8B", "B200", p) for p in ("bf16", "fp8-delayed", "fp8-tensorwise", "mxfp8")} | {
    ("Llama-3.1-8B", "GB200", "bf16"), ("Llama-3.1-8B", "GB200", "mxfp8"), ("Llama-3.1-70B", "B200", "bf16")}
for _m, _gpu, _prec, _tp, _pp, _cp, _vp, _mbs, _gbs, _fsdp, _rc, _off, _f in (
        ("Llama-3.1-70B", "H100", "*", 4, 8, 1, 5, 1, 128, 0, "none", 0, "llama3/llama3_70b_llm_pretrain.yaml"),
        ("Llama-3.1-70B", "GB200", "fp8-tensorwise", 1, 1, 1, 1, 2, 128, 1, "none", 40, "llama3/llama3_70b_llm_pretrain.yaml"),
        ("Llama-3.1-70B", "GB200", "mxfp8", 2, 4, 1, 5, 1, 128, 0, "none", 0, "llama3/llama3_70b_llm_pretrain.yaml"),
        ("Llama-3.1-70B", "B200", "fp8-tensorwise", 1, 1, 1, 1, 1, 128, 1, "full:block:5", 0,
         "llama3/llama3_70b_llm_pretrain.yaml"),
        ("Llama-3.1-70B", "B200", "mxfp8", 2, 4, 1, 5, 1, 128, 0, "none", 0, "llama3/llama3_70b_llm_pretrain.yaml"),
        ("Llama-3.1-70B", "B200", "bf16", 2, 4, 2, 5, 1, 128, 0, "none", 0, "llama3/llama3_70b_llm_pretrain.yaml"),
        # Llama 3 8B: H100 BF16 with CP 2, its FP8 recipes on Megatron FSDP; B200 and GB200 at two rows per micro-batch
        ("Llama-3.1-8B", "H100", "bf16", 1, 1, 2, 1, 1, 128, 0, "none", 0, "llama3/llama3_8b_llm_pretrain.yaml"),
        ("Llama-3.1-8B", "H100", "fp8-delayed", 1, 1, 1, 1, 1, 128, 1, "none", 0, "llama3/llama3_8b_llm_pretrain.yaml"),
        ("Llama-3.1-8B", "H100", "fp8-tensorwise", 1, 1, 1, 1, 1, 128, 1, "none", 0, "llama3/llama3_8b_llm_pretrain.yaml"),
        *[("Llama-3.1-8B", _g, _p, 1, 1, 1, 1, 2, 128, 0, "none", 0, "llama3/llama3_8b_llm_pretrain.yaml")
          for _g in ("B200", "GB200") for _p in ("bf16", "fp8-delayed", "fp8-tensorwise", "mxfp8")],
        ("Llama-3.1-405B", "H100", "*", 8, 8, 2, 8, 1, 512, 0, "none", 0, "llama31/llama31_405b_llm_pretrain.yaml"),
        ("Llama-3.1-405B", "B200", "*", 4, 8, 2, 8, 1, 64, 0, "none", 0, "llama31/llama31_405b_llm_pretrain.yaml"),
        ("Llama-3.1-405B", "GB200", "mxfp8", 4, 8, 2, 8, 1, 64, 0, "none", 0, "llama31/llama31_405b_llm_pretrain.yaml")):
    _cg = "attn" if (_m, _gpu, _prec) in _LAYER_GRAPHS else "none"
    MANUAL.append(dict(release="v0.1.0rc4", model=_m, gpu=_gpu, precision=_prec, tp=_tp, pp=_pp, cp=_cp, vp=_vp, ep=1,
                       mbs=_mbs, gbs=_gbs, fsdp=_fsdp, recompute=_rc, act_offload_layers=_off, tp_comm_overlap=int(_tp > 1),
                       cuda_graphs=_cg, recipe=f"perf_matrix.{_gpu.lower()} ({_prec}{', cuda_graphs' if _cg != 'none' else ''})",
                       file=_R1.format(_f)))
# v0.6.0 on: the flat perf_recipes functions, read from their syntax trees by bench/bridge_perf_recipes.py (their
# settings, helpers and model recipes; every recipe of a catalog model). The 44 v0.6.0 lines read by hand until
# 6 December agreed with it but for what the hand reading missed (the full-iteration recipes' A2A overlap, CuTe-DSL
# fused grouped MLP, FP8 attention, DeepSeek-V3 GB300's recompute_modules [], Nemotron 3 Nano's graph modules)
PERF_RECIPE_RELEASES = ("v0.6.0",)


def _manual(d: dict) -> dict:
    base = {c: "" for c in COLUMNS}
    base.update(task="pretrain", fsdp=0, recompute="none", act_offload_layers=0, cuda_graphs="none",
                dispatcher="alltoall", ep_overlap=0, tp_comm_overlap=0, capacity_factor=0, shared_overlap=0,
                pp_layout="", mtp=0, kernels="")
    base.update(d)
    return base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path, help="a Megatron-Bridge git checkout (tags v0.2.0 ... v0.5.1)")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parents[1] / "src/autotune/cost/data/megatron_bridge_presets.csv")
    args = ap.parse_args()
    rows = [_manual(d) for d in MANUAL]
    for rel in PERF_RECIPE_RELEASES:
        rows += read_release(args.repo, rel, _FAMILY_LAYOUTS, _FAMILY_MTP)
    for rel in RELEASES:
        files = [f for f in _git(args.repo, "ls-tree", "-r", "--name-only", rel, "scripts/performance/configs").split()
                 if f.endswith("workload_base_configs.py")]
        for path in files:
            for name, b in _load(_git(args.repo, "show", f"{rel}:{path}")).items():
                r = _row(rel, path, name, b)
                if r:
                    rows.append(r)
    merged: dict[tuple, dict] = {}  # one line per recipe unchanged across releases: releases joined by spaces
    for r in rows:
        key = tuple(str(r.get(c, "")) for c in COLUMNS if c != "release")
        if key in merged:
            merged[key]["release"] += " " + r["release"]
        else:
            merged[key] = dict(r)
    rows = list(merged.values())
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n", extrasaction="ignore", restval="")
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} recipes -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
