"""Megatron-LM's examples/moe_recipes: the recipe YAMLs read into presets (bench/moe_recipes_presets.py, on a small git
tree written like the real one) and applied to the published rows of that README (cost/_presets.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import moe_recipes_presets as R  # noqa: E402
from autotune.cost.measurements import published_measurements  # noqa: E402

README = """# MoE Recipes
<table>
  <tbody>
    <tr>
      <td rowspan="2">Qwen3-30B-A3B</td>
      <td><a href="qwen3_30b/h100/fp8_32GPU_TP1PP1EP8.yaml">H100 FP8</a></td>
      <td>32</td><td>1/1/8/1/1</td><td>1/256/4096</td><td>FP8 blockwise; router/preprocess CG</td><td>232.4</td>
    </tr>
    <tr>
      <td><a href="qwen3_30b/gb200/bf16_16GPU_TP1PP1EP16.yaml">GB200 BF16</a></td>
      <td>16</td><td>1/1/16/1/1</td><td>4/512/4096</td><td>BF16 baseline</td><td>528</td>
    </tr>
    <tr>
      <td>Qwen3-235B-A22B</td>
      <td><a href="qwen3_235b/h100/bf16_256GPU_TP2PP8EP32.yaml">H100 BF16</a></td>
      <td>256</td><td>2/8/32/1/1</td><td>1/2048/4096</td><td>HybridEP</td><td></td>
    </tr>
    <tr>
      <td>Some-Unknown-MoE</td>
      <td><a href="unknown/b200/bf16.yaml">B200 BF16</a></td>
      <td>8</td><td>1/1/8/1/1</td><td>1/64/4096</td><td></td><td>1</td>
    </tr>
  </tbody>
</table>
"""
FP8 = """DEPENDENCIES:
  dockerfile: |
    FROM base
ARGS:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
  expert_model_parallel_size: 8
  moe_token_dispatcher_type: flex
  moe_flex_dispatcher_backend: hybridep
  cuda_graph_impl: transformer_engine
  cuda_graph_scope:
  - attn
  - moe_router
  micro_batch_size: 1
  global_batch_size: 256
  fp8_recipe: blockwise
  fp8_param_gather: true
  use_precision_aware_optimizer: true
  exp_avg_dtype: bf16
  exp_avg_sq_dtype: bf16
"""
BF16 = """ARGS:
  expert_model_parallel_size: 16
  moe_token_dispatcher_type: alltoall
  external_cuda_graph: true
  cuda_graph_scope: moe_router moe_preprocess
  micro_batch_size: 4
  global_batch_size: 512
"""
Q235 = """ARGS:
  num_layers: 94
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 8
  expert_model_parallel_size: 32
  num_layers_per_virtual_pipeline_stage: 3
  account_for_embedding_in_pipeline_split: true
  account_for_loss_in_pipeline_split: true
  overlap_moe_expert_parallel_comm: true
  moe_token_dispatcher_type: flex
  recompute_granularity: selective
  recompute_modules: moe_act layernorm
  micro_batch_size: 1
  global_batch_size: 2048
"""


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path_factory.mktemp("megatron-lm")
    d = repo / R.DIR
    for path, text in (("README.md", README), ("qwen3_30b/h100/fp8_32GPU_TP1PP1EP8.yaml", FP8),
                       ("qwen3_30b/gb200/bf16_16GPU_TP1PP1EP16.yaml", BF16),
                       ("qwen3_235b/h100/bf16_256GPU_TP2PP8EP32.yaml", Q235), ("unknown/b200/bf16.yaml", BF16)):
        (d / path).parent.mkdir(parents=True, exist_ok=True)
        (d / path).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "recipes"], check=True)
    return {(r["model"], r["gpu"]): r for r in R.read(repo, "HEAD")}


def test_each_linked_recipe_of_a_catalog_model_is_read_with_the_rowspan_model(rows):
    assert set(rows) == {("Qwen3-30B-A3B", "H100"), ("Qwen3-30B-A3B", "GB200"), ("Qwen3-235B-A22B", "H100")}


def test_dispatcher_graphs_precision_and_optimizer_state(rows):
    fp8 = rows["Qwen3-30B-A3B", "H100"]
    assert (fp8["precision"], fp8["dispatcher"], fp8["cuda_graphs"]) == ("fp8-blockwise", "hybridep", "attn")
    assert fp8["fp8_param_gather"] == 1 and fp8["optimizer_state_bytes"] == 4 + 2 + 2  # fp32 main, bf16 moments
    bf16 = rows["Qwen3-30B-A3B", "GB200"]
    # the deprecated --external-cuda-graph is TE's graphs; a scope written as one string is its words
    assert (bf16["precision"], bf16["dispatcher"], bf16["cuda_graphs"], bf16["mbs"]) == ("bf16", "alltoall", "router", 4)
    assert bf16["optimizer_state_bytes"] == 0.0 and bf16["recompute"] == "none"


def test_virtual_stages_and_recompute_modules_written_as_a_string(rows):
    q = rows["Qwen3-235B-A22B", "H100"]
    assert q["vp"] == (94 + 2) // (3 * 8)  # embedding and loss counted as pipeline layers
    assert q["recompute"] == "selective:moe_act,layernorm"
    assert (q["dispatcher"], q["ep_overlap"]) == ("flex", 1)  # flex without a backend: DeepEP


def _published(path_part: str):
    kept, _ = published_measurements()
    found = [m for m in kept if path_part in m.source]
    assert found, path_part
    return found


def test_the_shipped_rows_take_their_recipe_yaml():
    # the README's features leave the dispatcher out; the recipe runs HybridEP
    [h100] = _published("qwen3_30b/h100/bf16_32GPU_TP1PP1EP8.yaml")
    assert h100.layout.dispatcher == "hybridep"
    [fp8] = _published("qwen3_30b/h100/fp8_32GPU_TP1PP1EP8.yaml")
    assert fp8.layout.cuda_graphs == "attn" and fp8.fp8_param_gather and fp8.optimizer_state_bytes == 8.0
    # two recipes share GB200's layout: each row takes the one its features' graphs name
    [paged] = _published("mxfp8_16GPU_TP1PP1EP16_paged_stash.yaml")
    [partial] = _published("mxfp8_16GPU_TP1PP1EP16_partial_cg.yaml")
    assert (paged.layout.cuda_graphs, partial.layout.cuda_graphs) == ("full", "attn")
    # DeepSeek-V3 GB300's recipe recomputes nothing (the MoE model zoo's script it was once read from: mlp)
    [gb300] = _published("deepseek_v3/gb300/mxfp8_256GPU_TP1PP4EP64.yaml")
    assert gb300.layout.recompute.granularity == "none"


def test_a_row_without_vp_takes_its_recipes_virtual_stages(monkeypatch):
    """The README's table has no VP column: a PP row takes its recipe's VP (where the recipe gives no layout string)."""
    from autotune.cost import _presets

    rec = {c: "" for c in R.COLUMNS + R.EXTRA}
    rec.update(release="Megatron-LM@abc", model="Qwen3-30B-A3B", gpu="H100", precision="bf16", task="pretrain", tp="1",
               pp="2", cp="1", vp="6", ep="8", mbs="1", gbs="256", fsdp="0", recompute="none", act_offload_layers="0",
               cuda_graphs="none", dispatcher="hybridep", ep_overlap="0", tp_comm_overlap="0", capacity_factor="0",
               shared_overlap="0", mtp="0", recipe="r.yaml", file="examples/moe_recipes/r.yaml", fp8_param_gather="0",
               optimizer_state_bytes="0")
    monkeypatch.setattr(_presets, "_moe_recipes", lambda: (rec,))
    lay = {"world": 32, "tp": 1, "pp": 2, "cp": 1, "vpp": 1, "ep": 8, "micro_batch_size": 1}
    row = {"source": "Megatron-LM examples/moe_recipes README (dev)", "model": "Qwen3-30B-A3B", "notes": "", "vp": ""}
    out = _presets.row_settings(row, "Qwen3-30B-A3B", "H100", "bf16", lay, 256, True)
    assert out["layout"]["vpp"] == 6 and out["layout"]["dispatcher"] == "hybridep"
    assert "VP 6 of its recipe" in " ".join(out["read"])
    given = _presets.row_settings({**row, "vp": "3"}, "Qwen3-30B-A3B", "H100", "bf16", lay, 256, True)
    assert "vpp" not in given["layout"]  # a row that gives its VP keeps it
