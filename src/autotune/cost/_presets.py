"""The settings a published row ran with beyond its layout: read from the row's notes, or from its source's recipe.

`row_settings(row, model, gpu, precision, layout, measurement)` returns the Layout and Workload keywords the row
implies and the readings it made (for the row's provenance), or the reason the row cannot be expressed.

  - notes: "force-balanced" / "fake balanced gate" / "force balance" (--moe-router-force-load-balancing) force the
    routing even; "EP overlap" / "A2A overlap" / "1F1B" turn on EP overlap; "async TP" / "AsyncTP" (torchtitan's
    decomposed all-gather + matmul) and Megatron's TP comm overlap turn on TP overlap; "tokendrop" sets token drop
    at capacity factor 1.0 with padding (Megatron-Bridge's apply_moe_token_drop defaults); "CG" / "CUDA graphs"
    (partial unless "full") turn on CUDA graphs; DeepEP / HybridEP the flex dispatcher; torchtitan's "Interleaved
    1F1B" with no VP runs 2 stages per rank (its default for multi-stage schedules).
  - NeMo Framework 25.x Llama 4 rows: the perf scripts build `llama4_e16` / `llama4_e128` pretrain_recipe(
    performance_mode=True), whose pretrain_performance_optimizations adds MegatronTokenDropCallback (capacity factor
    1.0, inputs padded to capacity; NeMo v2.3.0 and v2.4.0, since the recipe's first commit 305d1a8e). NeMo
    Framework 25.x Mixtral rows likewise: mixtral_8x7b.py's performance recipe appends the expert-parallel token-drop
    callback (MegatronExpertParallelTokenDrop, later MegatronTokenDropCallback: capacity factor 1.0, padded).
  - Megatron-Bridge performance rows: the recipe of the row's release (container 26.04 ships Megatron-Bridge
    v0.4.0, see RELEASES) whose model, GPU, precision, TP/PP/CP/VP/EP and micro-batch equal the row's, from
    data/megatron_bridge_presets.csv (bench/bridge_presets.py rebuilds it from a Megatron-Bridge checkout). Its
    recompute (where the row leaves it blank), dispatcher, EP and TP overlap, CUDA graphs, FSDP, token drop,
    activation offload, the shared-expert overlap, its pipeline layout (the layer split, where the row's notes give
    none) and the MTP layers its model recipe trains (unless the row says "w/o MTP") are taken, and the recipe is
    named in the provenance. The kernels a recipe runs beyond its settings are read where autotune models them
    (KERNELS: the paged stash of full-iteration graphs with its fused grouped MLP, FP8 attention, the MXFP8 output
    layer); any other makes the row inexpressible, with that reason. A GA note that contradicts the row's GBS /
    (DP x MBS) makes the recipe's micro-batch the one that ran. A row whose layout no recipe has takes its GPU and precision's recipe but FSDP
    and offload (the perf scripts load it and overlay the command line's layout), else what all of its model's
    recipes of that release set, the rest Megatron's defaults, and says so.
  - Megatron-LM examples/moe_recipes rows: the recipe YAML the README links to for the row's model, GPU, precision,
    TP, PP, EP and micro-batch (CUDA graphs break a tie), from data/megatron_lm_moe_recipes.csv (bench/
    moe_recipes_presets.py rebuilds it from a Megatron-LM checkout at the rows' commit): the same settings as a
    Megatron-Bridge recipe's, plus its FP8 parameter gather and optimizer state bytes.
No torch, no ray.
"""

from __future__ import annotations

import csv
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..catalog import load_model
from ..errors import BadInput
from ..layout import OFFLOAD_MODULES, Recompute
from ..layout.splits import layout_vpp, parse_pipeline_layout

__all__ = ["row_settings", "release_of", "RELEASES", "PRESETS_CSV", "MOE_RECIPES_CSV"]

PRESETS_CSV = Path(str(resources.files("autotune.cost") / "data" / "megatron_bridge_presets.csv"))
# Megatron-LM's examples/moe_recipes YAMLs at the commit the moe_recipes rows cite (bench/moe_recipes_presets.py)
MOE_RECIPES_CSV = Path(str(resources.files("autotune.cost") / "data" / "megatron_lm_moe_recipes.csv"))
# NeMo container -> the Megatron-Bridge releases it ships (release dates; each release's performance summary page
# lists the containers measured before it)
RELEASES = {"25.09": ("v0.1.0rc4",), "25.11": ("v0.2.0", "v0.2.2"), "26.02": ("v0.3.0",), "26.02.01": ("v0.3.1",),
            "26.04": ("v0.4.0",), "26.04.01": ("v0.4.1", "v0.4.2"), "26.06": ("v0.5.0",), "26.06.01": ("v0.5.1",),
            "26.08": ("v0.6.0",)}
_GRAPHS = {"none", "router", "attn", "full"}
# NeMo AutoModel's performance summary (docs/performance-summary.mdx) links each row to a benchmark recipe; those set
# distributed.activation_checkpointing: true (every decoder layer checkpointed: Megatron's full uniform 1; MoE models:
# nemo_automodel/components/moe/parallelizer.py apply_ac wraps each whole block, experts included, saving only the
# router's projection and top-k). Kimi-K2, Qwen3-235B-A22B and Qwen3-Next's benchmark recipes (github.com/NVIDIA-NeMo/
# Automodel at 36044ad3 examples/llm_benchmark/kimi, qwen) set it too, and GLM-4.7's (GLM-4.5's network) and Nemotron 3
# Ultra's (examples/llm_benchmark/nemotron/nemotron_ultra_v3_te_deepep.yaml, mirror of 2026-08-22); gpt-oss-120b's
# and GLM-4.5-Air's do not (read as none)
_AUTOMODEL = {"DeepSeek-V3": "examples/llm_benchmark/deepseek/deepseek_v3_te_deepep.yaml",
              "Qwen3-30B-A3B": "examples/llm_benchmark/qwen/qwen3_moe_30b_te_deepep.yaml",
              "Llama-3.1-70B": "examples/llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml",
              "NVIDIA-Nemotron-3-Nano-30B-A3B": "examples/llm_benchmark/nemotron/nemotron_nano_v3_te_deepep.yaml",
              "NVIDIA-Nemotron-3-Super-120B-A12B": "examples/llm_benchmark/nemotron/nemotron_super_v3_te_deepep.yaml",
              "NVIDIA-Nemotron-3-Ultra-550B-A55B": "examples/llm_benchmark/nemotron/nemotron_ultra_v3_te_deepep.yaml",
              "Kimi-K2-Instruct": "examples/llm_benchmark/kimi/kimi_k2_te_deepep.yaml",
              "Qwen3-235B-A22B": "examples/llm_benchmark/qwen/qwen3_moe_235b_te_deepep.yaml",
              "Qwen3-Next-80B-A3B-Instruct": "examples/llm_benchmark/qwen/qwen3_next_te_deepep.yaml",
              "GLM-4.5": "examples/llm_benchmark/glm/glm_4.7_te_deepep.yaml"}

# ... and those whose YAML reshards the MoE blocks after forward (distributed.moe.reshard_after_forward: true, at the
# Automodel mirror of 2026-08-22; the others' say false or nothing, apply_fsdp's default false)
_AUTOMODEL_RESHARD_MOE = ("NVIDIA-Nemotron-3-Super-120B-A12B", "NVIDIA-Nemotron-3-Ultra-550B-A55B")

# catalog model -> the NeMo 2 recipe whose performance mode drops tokens (nemo/collections/llm/recipes/, v2.4.0)
_NEMO_TOKEN_DROP = {"Llama-4-Scout-17B-16E": "llama4_e16.py", "Llama-4-Maverick-17B-128E": "llama4_e128.py",
                    "Mixtral-8x7B-v0.1": "mixtral_8x7b.py"}


@lru_cache(maxsize=1)
def _recipes() -> tuple[dict, ...]:
    with open(PRESETS_CSV, newline="", encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


@lru_cache(maxsize=1)
def _moe_recipes() -> tuple[dict, ...]:
    with open(MOE_RECIPES_CSV, newline="", encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


def _moe_recipe(model: str, gpu: str, precision: str, lay: dict, graphs: str) -> dict | None:
    """The Megatron-LM moe_recipes YAML of a row of that README: its model, GPU, precision, TP, PP, EP and micro-batch,
    and where two recipes share those (partial and full-iteration graphs), the CUDA graphs its features name."""
    found = [r for r in _moe_recipes() if r["model"] == model and r["gpu"] == gpu and r["precision"] == precision
             and (int(r["tp"]), int(r["pp"]), int(r["ep"]), int(r["mbs"])) == (lay["tp"], lay["pp"], lay["ep"],
                                                                               lay["micro_batch_size"])]
    if len(found) > 1:
        found = [r for r in found if r["cuda_graphs"] == graphs]
    return found[0] if len(found) == 1 else None


def _container(text: str) -> tuple[int, ...] | None:
    return tuple(int(x) for x in text.split(".")) if re.fullmatch(r"\d+(?:\.\d+)+", text) else None


def release_of(source: str) -> tuple[set[str], str | None]:
    """The Megatron-Bridge releases whose recipes a perf-page row's container ran, and a reading when the container is
    one RELEASES does not list (a page newer than the recipes read, say): the newest listed container not after it
    (recipes carry over from release to release until they are changed), else the oldest listed."""
    m = re.match(r"Megatron-Bridge perf (?:archive|summary):(\S+)", source)
    if not m:
        return set(), None
    if m.group(1) in RELEASES:
        return set(RELEASES[m.group(1)]), None
    want = _container(m.group(1))
    if want is None:
        return set(), None
    known = sorted((_container(c), c) for c in RELEASES)
    before = [c for v, c in known if v <= want]
    use = before[-1] if before else known[0][1]
    return set(RELEASES[use]), (f"container {m.group(1)} is not among the releases read: its recipes read as "
                                f"container {use}'s ({', '.join(RELEASES[use])}), the "
                                + ("newest not after it" if before else "oldest read"))


def _eq(recipe_value: str, value) -> bool:
    return recipe_value == "*" or recipe_value == str(value)


def _bridge(source: str, task: str, model: str, gpu: str, precision: str, lay: dict, gb: int,
            any_mbs: bool = False) -> dict | None:
    rels = release_of(source)[0]
    if not rels:
        return None
    found = [r for r in _recipes() if rels & set(r["release"].split()) and r["model"] == model and _eq(r["gpu"], gpu)
             and _eq(r["precision"], precision) and r["task"] == task
             and all(_eq(r[k], lay[f]) for k, f in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("vp", "vpp"),
                                                     ("ep", "ep"), ("mbs", "micro_batch_size"))
                     if not (any_mbs and k == "mbs"))]
    exact = [r for r in found if _eq(r["gbs"], gb)]
    return (exact or found or [None])[0]


_SETTINGS = ("recompute", "act_offload_layers", "cuda_graphs", "dispatcher", "ep_overlap", "tp_comm_overlap",
             "capacity_factor", "fsdp", "shared_overlap", "mtp", "kernels")
# the kernels a recipe runs beyond its settings (megatron_bridge_presets.csv `kernels`) that autotune models, and how:
# the paged stash is a dropless MoE model's full-iteration graphs (cost/_comm.paged_stash), which need TE's fused
# grouped MLP (its CuTe-DSL kernels on Blackwell: the same path); FP8 attention and the MXFP8 output layer are
# workload settings (Workload.fp8_attention, fp8_output_proj). Any other makes the row inexpressible
KERNELS = {"fine_grained_activation_offloading": "fine-grained activation offloading",
           "paged_stash": "paged stash (full-iteration graphs of dropless experts)",
           "cutedsl_fused_grouped_mlp": "CuTe-DSL fused grouped MLP (the full-iteration graphs' fused experts)",
           "fp8_dot_product_attention": "FP8 attention", "fp8_output_proj": "the output layer under MXFP8"}


def _shared(source: str, task: str, model: str, gpu: str, precision: str) -> dict | None:
    """The settings a page layout with no recipe of its own runs with, others blank. The perf scripts load the recipe
    of the row's model, GPU and precision (get_workload_base_config) and overlay the command line's layout on it:
    what that recipe (or its GBS variants, where they agree) sets, but FSDP and activation offload, which come with
    its own layout and which the page's columns say; with no such recipe, what all of the model's recipes of the
    row's precision (else of any precision) agree on (Llama 3.1 405B's TP comm overlap; Llama's perf scripts turn TP
    overlap off for NVFP4)."""
    rels = release_of(source)[0]
    found = [r for r in _recipes() if rels & set(r["release"].split()) and r["model"] == model and r["task"] == task]
    mine = [r for r in found if _eq(r["gpu"], gpu) and _eq(r["precision"], precision)]
    found = mine or [r for r in found if r["precision"] in (precision, "*")] or found
    if not found:
        return None
    out = {k: found[0][k] if len({r[k] for r in found}) == 1 else "" for k in _SETTINGS}
    if mine:
        out.update(fsdp="", act_offload_layers="")
    what = (f"its {gpu} {precision} recipe's settings under the page's layout" if mine
            else f"the {len(found)} {model} {task} recipes' shared settings")
    return {**out, "recipe": what, "release": found[0]["release"], "file": found[0]["file"], "mbs": "*", "model": model}


def _own_layout(source: str, task: str, model: str, gpu: str, precision: str) -> dict | None:
    """The layout (TP, PP, CP, VP, EP, micro-batch) all of the row's release's recipes for its model, GPU and precision
    run, when they agree on one: what ran when the page's printed layout cannot have (measurements._represent)."""
    rels = release_of(source)[0]
    found = [r for r in _recipes() if rels & set(r["release"].split()) and r["model"] == model and r["gpu"] == gpu
             and r["precision"] == precision and r["task"] == task]
    keys = {tuple(r[k] for k in ("tp", "pp", "cp", "vp", "ep", "mbs")) for r in found}
    if len(keys) != 1 or not all(v.isdigit() for v in next(iter(keys))):
        return None
    tp, pp, cp, vp, ep, mbs = (int(v) for v in next(iter(keys)))
    return {"tp": tp, "pp": pp, "cp": cp, "vp": vp, "ep": ep, "micro_batch": mbs}


def row_settings(row: dict, model: str, gpu: str, precision: str, lay: dict, gb: int, moe: bool) -> dict | str:
    """{"layout": Layout keywords, "workload": Measurement keywords, "read": [readings]} or the skip reason."""
    notes, source, name = row.get("notes") or "", row.get("source") or "", row.get("model") or ""
    text = f"{name}; {notes}"
    out: dict = {"layout": {}, "workload": {}, "read": []}
    if moe and re.search(r"paged stash", text, re.I):  # full-iteration graphs of dropless experts on HybridEP's budget
        out["layout"].update(cuda_graphs="full", dispatcher="hybridep")
        out["read"].append("paged stash: full-iteration CUDA graphs of dropless experts on HybridEP's static budget")
    # fine-grained activation offloading: its modules come from the row's recipe (below); without one, unknown
    fine_text = bool(re.search(r"fine.grained activation offload", text, re.I))
    if moe and re.search(r"force.balanc|fake balanced gate|\bFB\b", text, re.I):
        out["workload"]["force_balance"] = True
    if re.search(r"async ?TP", text, re.I) and not re.search(r"vanilla TP", text, re.I):
        out["layout"]["tp_comm_overlap"] = True
        out["read"].append("async TP as TP communication overlap")
    if lay["tp"] > 1 and re.search(r"\bTP(/\w+)* comm overlap on", text):
        # the Megatron-LM README's weak-scaling rows: "TP/DP/PP comm overlap on" (--tp-comm-overlap, TE userbuffers)
        out["layout"]["tp_comm_overlap"] = True
        out["read"].append("TP communication overlap (the source: TP comm overlap on)")
    if moe and re.search(r"EP overlap|a2a.overlap|1f1b overlap|overlap-moe-expert-parallel-comm", text, re.I):
        out["layout"]["ep_overlap"] = True
    if moe and re.search(r"tokendrop|token drop", text, re.I):
        out["layout"]["moe_capacity_factor"] = 1.0
        out["read"].append("token drop at capacity factor 1.0, padded (Megatron-Bridge apply_moe_token_drop)")
    if moe and source.startswith("NeMo Framework 25.") and model in _NEMO_TOKEN_DROP:
        out["layout"]["moe_capacity_factor"] = 1.0
        out["read"].append(f"token drop at capacity factor 1.0, padded (NeMo {_NEMO_TOKEN_DROP[model]} "
                           "performance recipe: the token-drop callback)")
    if re.search(r"\bfull CG\b|full.iteration", text, re.I):
        out["layout"]["cuda_graphs"] = "full"
    elif re.search(r"\bCG\b|CUDA graph", text, re.I):
        out["layout"]["cuda_graphs"] = "router" if re.search(r"router/preprocess CG|moe_router", text) else "attn"
    if source.startswith("NeMo AutoModel") and model in _AUTOMODEL and not (row.get("recompute") or "").strip():
        out["layout"]["recompute"] = "full:uniform:1"
        out["read"].append(f"recompute full:uniform:1 (activation_checkpointing in NeMo AutoModel {_AUTOMODEL[model]})")
    if source.startswith("NeMo AutoModel") and model in _AUTOMODEL_RESHARD_MOE:
        out["workload"]["fsdp_reshard_moe"] = True
        out["read"].append(f"MoE blocks resharded after forward (moe.reshard_after_forward in {_AUTOMODEL[model]})")
    if (source.startswith("torchtitan") and lay["pp"] > 1 and re.search(r"interleaved 1f1b", notes, re.I)
            and not (row.get("vp") or "").strip()):  # torchtitan's looped schedules: 2 stages per rank by default
        out["layout"]["vpp"] = 2  # (torchtitan/distributed/pipeline_parallel.py, pipeline_parallel_layers_per_stage unset)
        out["read"].append("VP 2 (torchtitan's default 2 stages per rank for interleaved schedules)")
    task = "sft" if re.search(r"\bSFT\b", name) else "pretrain"
    # a page's parenthesised alternative value (another precision of the same row) shares the row's MBS and GBS
    # columns with the main value: its own recipe's micro-batch is the one that ran
    alt = bool(re.search(r"parenthesised alternative", notes))
    # a page's GA column that contradicts its own GBS / (DP x MBS) says the row's MBS is not what ran (25.11's gpt-oss
    # H100 row: GA 2 and MBS 4 are the B200 row's, at PP 4 and DP 16 MBS 4 would give GA 8): its recipe's micro-batch
    ga = re.search(r"\bGA=(\d+)", notes)
    dp = lay.get("world", 0) // max(1, lay["tp"] * lay["pp"] * lay["cp"])
    bad_ga = bool(ga and not alt and dp and int(ga.group(1)) * dp * lay["micro_batch_size"] != gb)
    rec = (_bridge(source, task, model, gpu, precision, lay, gb, alt or bad_ga)
           if source.startswith("Megatron-Bridge perf") else None)
    if rec is None and source.startswith("Megatron-Bridge perf") and lay["pp"] > 1 and not (row.get("vp") or "").strip():
        # a blank VP column with pipeline stages: the release's recipes at this TP / PP / CP / EP, if they agree on
        # one VP and micro-batch, are what ran (26.02.01's Llama 3.1 70B GB300 MXFP8 row: VP blank, MBS 2 beside
        # its release's only recipe at TP1 PP4, VP 5 MBS 1, the layout every other release's row shows)
        cand = [_bridge(source, task, model, gpu, precision, {**lay, "vpp": int(r["vp"]), "micro_batch_size": int(r["mbs"])},
                        gb) for r in _recipes() if r["vp"].isdigit() and r["mbs"].isdigit()]
        cand = {(r["vp"], r["mbs"]): r for r in cand if r is not None and r["vp"] != "1"}
        if len(cand) == 1:
            (vp, mbs), rec = next(iter(cand.items()))
            out["layout"].update(vpp=int(vp), micro_batch_size=int(mbs))
            out["read"].append(f"VP {vp} and micro-batch {mbs} of its release's recipe (the page leaves VP blank)")
    if source.startswith("Megatron-LM examples/moe_recipes"):
        rec = _moe_recipe(model, gpu, precision, lay, out["layout"].get("cuda_graphs", "none"))
        if rec is not None:
            if rec["fp8_param_gather"] == "1":
                out["workload"]["fp8_param_gather"] = True
            if float(rec["optimizer_state_bytes"] or 0):
                out["workload"]["optimizer_state_bytes"] = float(rec["optimizer_state_bytes"])
            out["read"].append(f"FP8 parameter gather {'on' if rec['fp8_param_gather'] == '1' else 'off'}, optimizer "
                               f"state {float(rec['optimizer_state_bytes']) or 12:g} B per parameter (its recipe)")
            if (lay["pp"] > 1 and int(rec["vp"] or 1) > 1 and not rec["pp_layout"] and not (row.get("vp") or "").strip()
                    and "vpp" not in out["layout"]):  # the README's table gives no VP column
                out["layout"]["vpp"] = int(rec["vp"])
                out["read"].append(f"VP {rec['vp']} of its recipe (the table gives none)")
    if source.startswith("Megatron-Bridge perf") and rec is None:
        own = _own_layout(source, task, model, gpu, precision)
        if own:  # measurements._represent takes it when the printed layout cannot hold its own state
            out["recipe_layout"] = own
        rec = _shared(source, task, model, gpu, precision)
        out["read"].append("no Megatron-Bridge recipe at this layout" + (": Megatron's defaults" if rec is None else ""))
    if fine_text and (rec is None or "fine_grained_activation_offloading" not in rec["kernels"].split()):
        return ("it offloads activations of modules its notes do not name (Megatron's fine-grained activation "
                "offloading) and no recipe of it says which")
    if rec is None:
        return out
    fallback = release_of(source)[1]
    if fallback:
        out["read"].append(fallback)
    kernels = rec["kernels"].split()
    # the fused grouped MLP is modelled as part of a dropless model's full-iteration graphs (cost/_comm.paged_stash)
    unknown = [k for k in kernels if k not in KERNELS or (k == "cutedsl_fused_grouped_mlp" and rec["cuda_graphs"] != "full")]
    offload = (rec.get("offload_modules") or "").split()
    if "fine_grained_activation_offloading" in kernels:  # modelled (cost/_offload.py) for the modules autotune knows
        other = [m for m in offload if m not in OFFLOAD_MODULES]
        unknown = [k for k in unknown if k != "fine_grained_activation_offloading"]
        if not offload or other:
            unknown.append(f"fine-grained activation offloading of {', '.join(other) or 'unnamed modules'}")
    if unknown:
        return (f"it runs kernels autotune does not model: {', '.join(unknown)} (Megatron-Bridge recipe {rec['recipe']}, "
                f"{rec['release'].split()[0]})")
    if "fp8_dot_product_attention" in kernels:
        out["workload"]["fp8_attention"] = True
    if "fp8_output_proj" in kernels:
        out["workload"]["fp8_output_proj"] = True
    if kernels:
        out["read"].append("its kernels: " + ", ".join(KERNELS[k] for k in kernels))
    L = out["layout"]
    if (alt or bad_ga) and rec["mbs"] not in ("*", str(lay["micro_batch_size"])):
        L["micro_batch_size"] = int(rec["mbs"])
        out["read"].append(f"micro-batch {rec['mbs']} of its recipe (" + ("the page's MBS column is the main value's)"
                           if alt else f"the page's GA {ga.group(1)} contradicts its MBS {lay['micro_batch_size']} at "
                           f"DP {dp}: GBS {gb} = GA x DP x MBS fails)"))
    if moe and rec["dispatcher"]:
        L["dispatcher"] = rec["dispatcher"]
        L["ep_overlap"] = L.get("ep_overlap", False) or rec["ep_overlap"] == "1"
        if L["ep_overlap"] and rec["cuda_graphs"] == "full" and rec["dispatcher"] != "hybridep":
            # megatron-core 0.16.1 refuses the A2A overlap beside full-iteration graphs (transformer_config.py); the
            # paged stash's releases (0.18, 0.19: HybridEP's static budget) allow the pair, and the v0.5.x and v0.6.0
            # full-iteration recipes set both (layout/_setting_rules.py)
            L["ep_overlap"] = False
            out["read"].append("its A2A overlap beside full-iteration CUDA graphs without HybridEP read as off "
                               "(megatron-core refuses the pair)")
        L["moe_capacity_factor"] = float(rec["capacity_factor"] or 0) or L.get("moe_capacity_factor", 0.0)
        if rec["dispatcher"] == "alltoall" and not L["ep_overlap"] and rec["shared_overlap"] == "1":
            L["moe_shared_expert_overlap"] = True  # DeepSeek's and Kimi's recipes overlap the shared expert on alltoall
    L["tp_comm_overlap"] = L.get("tp_comm_overlap", False) or rec["tp_comm_overlap"] == "1"
    if rec["cuda_graphs"] in _GRAPHS and rec["cuda_graphs"] != "none":
        L["cuda_graphs"] = rec["cuda_graphs"]
    if rec["fsdp"] == "1":
        L["fsdp"] = True
    if int(rec["act_offload_layers"] or 0):
        L["activation_offload_layers"] = int(rec["act_offload_layers"])
    if "fine_grained_activation_offloading" in kernels:
        L["offload_modules"] = tuple(offload)
        out["read"].append(f"fine-grained activation offloading of {', '.join(offload)} (its recipe)")
    if not (row.get("recompute") or "").strip() and rec["recompute"]:
        L["recompute"] = rec["recompute"]
    if moe and L.get("cuda_graphs") in ("attn", "router") and "moe" in Recompute.parse(
            str(L.get("recompute", lay["recompute"]))).modules:
        # a recipe that recomputes the whole MoE block cannot have captured its router (Megatron refuses the pair):
        # its graphs are attention's alone (Nemotron 3 Nano H100: scope attn + mamba), which autotune's 'attn'
        # (attention, router and preprocess) would overstate: read without graphs
        L["cuda_graphs"] = "none"
        out["read"].append("its CUDA graphs (attention only: it recomputes the MoE block) read as none")
    if rec.get("pp_layout") and not lay.get("layer_split"):  # an exact recipe: its PP and VP are the row's
        try:
            stages, _ = parse_pipeline_layout(rec["pp_layout"])
            L["vpp"] = layout_vpp(len(stages), lay["pp"], lay["vpp"])
            L["layer_split"] = stages
            out["read"].append(f"the layer split of its recipe's pipeline layout {rec['pp_layout']}")
        except BadInput as exc:  # a preset line whose layout is not this row's PP x VP: the default split instead
            out["read"].append(f"its recipe's pipeline layout not used ({exc})")
    if rec["mtp"] not in ("", "0") and not re.search(r"w/o mtp|without mtp|no mtp", name, re.I):
        if load_model(model).mtp_layers:
            out["workload"]["train_mtp"] = True
            out["read"].append(f"MTP trained (its model recipe's mtp_num_layers {rec['mtp']})")
        else:  # Qwen3-Next: its recipe trains one, the config the catalog copies has no MTP field
            out["read"].append(f"its model recipe trains {rec['mtp']} MTP layer(s), which the catalog's config does not "
                               "describe: not counted")
    if rec["recipe"].startswith(("the ", "its ")):  # _shared: no one recipe at the row's layout
        out["read"].append(f"{rec['recipe']} ({rec['release'].split()[0]}: {rec['file']})")
    elif rec["release"].startswith("Megatron-LM@"):
        out["read"].append(f"Megatron-LM recipe {rec['file']} (commit {rec['release'].split('@')[1]})")
    else:
        out["read"].append(f"Megatron-Bridge recipe {rec['recipe']} ({rec['release'].split()[0]}: {rec['file']})")
    return out
