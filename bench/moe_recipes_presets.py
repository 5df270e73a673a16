"""The settings of Megatron-LM's MoE recipes (examples/moe_recipes), read from each recipe's YAML at one commit.

The moe_recipes README's table links each measured row to its recipe file, whose ARGS are Megatron-LM's command-line
arguments. The published rows (src/autotune/cost/data/published_throughput.csv, source "Megatron-LM examples/
moe_recipes README (dev)") carry only the README's short "Features" words, which leave out what a reader of the table
cannot see: all five Qwen3-30B-A3B recipes run the flex dispatcher on HybridEP (the rows without "HybridEP" in their
features were read as NCCL's all-to-all), the H100 FP8 recipe captures attention as well as the router in CUDA graphs,
and the DeepSeek-V3 GB300 recipe recomputes nothing. This script writes one line per recipe in the columns of
data/megatron_bridge_presets.csv, plus the two optimizer settings the YAMLs give (FP8 parameter gather, the Adam
moments' dtype); cost/_presets.py applies a line to the row of the same model, GPU, precision, TP, PP, EP and micro-
batch, as it applies a Megatron-Bridge recipe. Settings only: no throughput is read here.

    python bench/moe_recipes_presets.py MEGATRON_LM_REPO [--commit 8a2ac1fdc7] [--out PATH]

The commit is the one the rows cite (the README's version of 7 August 2026). No torch, no ray.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from autotune.cost._published import catalog_name  # noqa: E402
from autotune.cost._presets import MOE_RECIPES_CSV  # noqa: E402
from bridge_perf_recipes import dispatcher_name, git, graphs_name  # noqa: E402
from bridge_presets import COLUMNS  # noqa: E402

COMMIT = "8a2ac1fdc7"  # the README the published rows cite: "commit 8a2ac1fdc7, Aug 2026"
DIR = "examples/moe_recipes"
EXTRA = ("fp8_param_gather", "optimizer_state_bytes")
FP8_RECIPES = {"mxfp8": "mxfp8", "blockwise": "fp8-blockwise", "tensorwise": "fp8-tensorwise", "delayed": "fp8-delayed"}
_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1}


def links(readme: str) -> list[tuple[str, str]]:
    """(model, recipe path) of every table row, in order: the model cell spans the rows below it (rowspan)."""
    out, model = [], ""
    for tr in re.findall(r"<tr>(.*?)</tr>", readme, re.S):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)
        href = re.search(r'href="([^"]+\.yaml)"', tr)
        if not href:
            continue
        if not cells[0].lstrip().startswith("<a"):  # a model cell
            model = re.sub(r"<[^>]+>", "", cells[0]).strip()
        out.append((model, href.group(1)))
    return out


def precision(a: dict) -> str | None:
    if a.get("fp4") or a.get("fp4_recipe"):
        return None  # no NVFP4 recipe in the README's table
    if a.get("fp8_recipe") or a.get("fp8_format") or a.get("fp8"):
        return FP8_RECIPES.get(str(a.get("fp8_recipe") or "tensorwise"))
    return "bf16"


def words(v) -> list[str]:
    """A YAML list, or the space-separated string an argument list can be written as ("moe_act layernorm")."""
    return v.split() if isinstance(v, str) else list(v or [])


def recompute(a: dict) -> str:
    gran = a.get("recompute_granularity")
    if gran == "selective":
        return "selective:" + ",".join(words(a.get("recompute_modules")) or ["core_attn"])
    if gran == "full":
        return f"full:{a.get('recompute_method') or 'uniform'}:{int(a.get('recompute_num_layers') or 1)}"
    return "none"


def virtual_stages(a: dict) -> int:
    """VP: the number given, or Megatron's layers per virtual stage over the decoder layers, the embedding and the
    loss counted as layers where the recipe says so (--account-for-embedding/loss-in-pipeline-split)."""
    vp = a.get("num_virtual_stages_per_pipeline_rank") or a.get("virtual_pipeline_model_parallel_size")
    per = a.get("num_layers_per_virtual_pipeline_stage")
    if vp or not per:
        return int(vp or 1)
    layers = int(a["num_layers"]) + bool(a.get("account_for_embedding_in_pipeline_split")) + bool(
        a.get("account_for_loss_in_pipeline_split"))
    return max(1, layers // (int(per) * int(a.get("pipeline_model_parallel_size") or 1)))


def state_bytes(a: dict) -> float:
    """Optimizer state per owned parameter: the precision-aware optimizer's main parameters and Adam moments at their
    dtypes (megatron's defaults fp32); 0 (Megatron's own 12) without it."""
    if not a.get("use_precision_aware_optimizer"):
        return 0.0
    return float(sum(_BYTES[str(a.get(k) or "fp32")] for k in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")))


def row_of(model: str, path: str, text: str, commit: str) -> dict | None:
    a = (yaml.safe_load(text) or {}).get("ARGS") or {}
    name, _ = catalog_name(model)
    prec = precision(a)
    if name is None or prec is None:
        return None
    impl = a.get("cuda_graph_impl") or ("transformer_engine" if a.get("external_cuda_graph") else None)
    kernels = [k for k, on in (("paged_stash", a.get("moe_paged_stash")),
                               ("fp8_dot_product_attention", a.get("fp8_dot_product_attention")),
                               ("fine_grained_activation_offloading", a.get("fine_grained_activation_offloading")))
               if on]
    pad = a.get("moe_pad_expert_input_to_capacity")
    return {
        "release": f"Megatron-LM@{commit}", "model": name, "gpu": path.split("/")[1].upper(), "precision": prec,
        "task": "pretrain", "tp": int(a.get("tensor_model_parallel_size") or 1),
        "pp": int(a.get("pipeline_model_parallel_size") or 1), "cp": int(a.get("context_parallel_size") or 1),
        "vp": virtual_stages(a),
        "ep": int(a.get("expert_model_parallel_size") or 1), "mbs": int(a.get("micro_batch_size") or 1),
        "gbs": int(a.get("global_batch_size") or 1), "fsdp": int(bool(a.get("use_megatron_fsdp"))),
        "recompute": recompute(a), "act_offload_layers": 0, "cuda_graphs": graphs_name(impl, words(a.get("cuda_graph_scope"))),
        # megatron-core's default dispatcher is allgather (Megatron-Bridge's model providers set alltoall)
        "dispatcher": dispatcher_name(a.get("moe_token_dispatcher_type", "allgather"), a.get("moe_flex_dispatcher_backend")),
        "ep_overlap": int(bool(a.get("overlap_moe_expert_parallel_comm"))),
        "tp_comm_overlap": int(bool(a.get("tp_comm_overlap"))),
        "capacity_factor": (a.get("moe_expert_capacity_factor") or 0) if pad else 0,
        "shared_overlap": int(bool(a.get("moe_shared_expert_overlap"))),
        "pp_layout": a.get("pipeline_model_parallel_layout") or "", "mtp": int(a.get("mtp_num_layers") or 0),
        "kernels": " ".join(kernels), "recipe": path, "file": f"{DIR}/{path}",
        "offload_modules": " ".join(words(a.get("offload_modules"))) if a.get("fine_grained_activation_offloading") else "",
        "fp8_param_gather": int(bool(a.get("fp8_param_gather"))), "optimizer_state_bytes": state_bytes(a)}


def read(repo: Path, commit: str) -> list[dict]:
    readme = git(repo, "show", f"{commit}:{DIR}/README.md")
    rows = [row_of(model, path, git(repo, "show", f"{commit}:{DIR}/{path}"), commit) for model, path in links(readme)]
    return [r for r in rows if r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path, help="a Megatron-LM git checkout that has the commit")
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("--out", type=Path, default=MOE_RECIPES_CSV)
    args = ap.parse_args()
    rows = read(args.repo, args.commit)
    tmp = args.out.with_suffix(".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS + EXTRA, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(args.out)
    print(f"{len(rows)} recipes -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
