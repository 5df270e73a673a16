"""Full-iteration CUDA graphs of dropless MoE models (megatron-core's paged stash), FP8 attention and the MXFP8 output
layer: legal where Megatron runs them, their arguments, their time and memory, and the published rows that ran them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import Calibration, TimeCoefficients, evaluate
from autotune.errors import BadInput
from autotune.layout import Layout, LayoutTable, check
from autotune.layout.setting_args import setting_args

M = load_model("gpt-oss-120b")
W = Workload(seq_len=4096, global_batch=1280, precision="mxfp8", force_balance=True)
C = ClusterSpec.of("GB300", 64)


def _lay(**kw) -> Layout:
    return Layout(**{"world": 64, "ep": 16, "micro_batch_size": 4, "dispatcher": "hybridep", **kw})


def _eval(lays, workload=W, coef=None):
    cal = Calibration("GB300", coef) if coef is not None else Calibration("GB300")
    return evaluate(M, workload, C, LayoutTable.from_layouts(lays), cal)


def _illegal(lay, workload=W) -> list[str]:
    return [code for code, mask in check(M, workload, LayoutTable.from_layouts([lay])).items() if not mask[0]]


def test_full_graphs_of_a_dropless_moe_model_run_on_hybridep_with_the_paged_stash_only():
    assert "full_graphs_static_shapes" not in _illegal(_lay(cuda_graphs="full"))
    assert "full_graphs_static_shapes" in _illegal(_lay(cuda_graphs="full", dispatcher="alltoall"))
    assert "full_graphs_static_shapes" not in _illegal(_lay(cuda_graphs="full", dispatcher="alltoall",
                                                            moe_capacity_factor=1.0))
    flags = dict(setting_args(_lay(cuda_graphs="full"), moe=True))
    assert "--moe-paged-stash" in flags and flags["--moe-expert-rank-capacity-factor"] == "1.5"
    assert "--use-transformer-engine-op-fuser" in flags
    dropped = dict(setting_args(_lay(cuda_graphs="full", moe_capacity_factor=1.0), moe=True))
    assert "--moe-paged-stash" not in dropped  # token drop pads to capacity: static shapes without it
    assert "--moe-paged-stash" not in dict(setting_args(_lay(cuda_graphs="attn"), moe=True))


def test_the_paged_stash_drops_per_expert_kernels_and_launches_and_copies_the_stash():
    """Under the paged stash the per-expert elementwise kernels, per-expert GEMM and cast kernels and the host's
    launches are gone; the stash copy (a write and a read of the saved expert activations) is plain traffic."""
    c = TimeCoefficients()
    ev = _eval([_lay(cuda_graphs="full"), _lay(cuda_graphs="attn")], coef=c)
    mb = ev.time.mb_terms
    assert mb["expert_memory"][0].max() == 0 and mb["expert_memory"][1].max() > 0
    assert mb["layer_overhead"][0].max() == 0 < mb["layer_overhead"][1].max()
    stash_copy = mb["expert_memory"][1, 0] * 2 / (3 * c.mem_touch)
    # gpt-oss's clamped GLU moves traffic outside the activation kernel on the unfused (attn) path only
    # (tests/cost/test_expert_bias.py): taken out here, the rest of the difference is the stash's copy
    plain = replace(M, moe=replace(M.moe, activation_clamp=0.0))
    lays = LayoutTable.from_layouts([_lay(cuda_graphs="full"), _lay(cuda_graphs="attn")])
    unclamped = evaluate(plain, W, C, lays, Calibration("GB300", c)).time.mb_terms["memory_bound"]
    clamp = mb["memory_bound"][1, 0] - unclamped[1, 0]
    assert clamp > 0 and mb["memory_bound"][0, 0] == pytest.approx(unclamped[0, 0], rel=1e-12)
    assert mb["memory_bound"][0, 0] - (mb["memory_bound"][1, 0] - clamp) == pytest.approx(stash_copy, rel=1e-6)
    local = M.moe.num_experts / 16
    assert mb["compute_experts"][1, 0] - mb["compute_experts"][0, 0] > 0.9 * 6 * c.expert_gemm_s * local
    assert ev.time.tokens_per_s_per_gpu[0] > ev.time.tokens_per_s_per_gpu[1]


def test_outside_mxfp8_the_paged_stash_keeps_the_per_expert_kernels():
    """The fused grouped MLP's kernels are measured only under MXFP8 on Blackwell (every full-iteration recipe): in
    BF16 the graphs still take the launches and host syncs away and the stash copy still costs, but the per-expert
    elementwise passes and GEMM kernels stay."""
    bf16 = replace(W, precision="bf16")
    mb = _eval([_lay(cuda_graphs="full"), _lay(cuda_graphs="attn")], bf16, TimeCoefficients()).time.mb_terms
    assert mb["expert_memory"][0, 0] == pytest.approx(mb["expert_memory"][1, 0], rel=1e-9) and mb["expert_memory"][0, 0] > 0
    assert mb["layer_overhead"][0].max() == 0 < mb["layer_overhead"][1].max()
    assert mb["memory_bound"][0, 0] > mb["memory_bound"][1, 0]  # the stash copy
    assert mb["compute_experts"][0, 0] == pytest.approx(mb["compute_experts"][1, 0], rel=1e-9)


def test_the_paged_stash_holds_its_page_pool_whatever_the_routing():
    """The experts' saved activations fill a pool of 1.2x their even share even when routing is forced even: more
    activation memory than the same layout's partial graphs, where forced routing keeps them at 1.0x. (gpt-oss's
    clamped GLU keeps a second fc1-sized copy on the unfused path only, tests/cost/test_expert_bias.py: taken out.)"""
    plain = replace(M, moe=replace(M.moe, activation_clamp=0.0))
    lays = LayoutTable.from_layouts([_lay(cuda_graphs="full"), _lay(cuda_graphs="attn")])
    act = evaluate(plain, W, C, lays, Calibration("GB300")).memory.terms["activations"]
    assert act[0, 0] > act[1, 0] * 1.05


def test_fp8_attention_speeds_the_matrix_products_not_the_exponentials():
    on = replace(W, fp8_attention=True)
    a = _eval([_lay()], W).time.mb_terms["compute_attention"][0, 0]
    b = _eval([_lay()], on).time.mb_terms["compute_attention"][0, 0]
    speedup = C.gpu.fp8_tflops / C.gpu.bf16_tflops * TimeCoefficients().fp8_gemm
    assert 1.0 < a / b < speedup  # the softmax's exponentials stay on the SFUs
    out = replace(W, fp8_output_proj=True)
    assert (_eval([_lay()], out).time.mb_terms["compute_output"][0, 0]
            < _eval([_lay()], W).time.mb_terms["compute_output"][0, 0])


def test_fp8_attention_and_the_fp8_output_layer_need_their_formats():
    with pytest.raises(BadInput, match="--fp8-attention needs an FP8 precision"):
        Workload(precision="bf16", fp8_attention=True)
    with pytest.raises(BadInput, match="--fp8-output-proj runs the output layer under MXFP8 only"):
        Workload(precision="fp8-tensorwise", fp8_output_proj=True)
    Workload(precision="fp8-tensorwise", fp8_attention=True)


def test_a_cluster_without_the_paged_stash_keeps_token_drop_for_full_graphs():
    from autotune.space import SearchSpace, explore
    space = SearchSpace.model_validate({"dimensions": {"ep": [16], "dispatcher": ["hybridep"], "cuda_graphs": ["full"],
                                                       "rows_per_microbatch": [4], "moe_capacity_factor": [0.0, 1.0]},
                                        "prune": {"keep_within": 0.01}})
    with_it = explore(space, M, W, C)
    without = explore(space, M, W, ClusterSpec.of("GB300", 64, has_paged_stash=False))
    assert any("paged stash" in n for n in without.notes) and not any("paged stash" in n for n in with_it.notes)
    caps = lambda r: sorted({float(x) for x in r.table.capacity})  # noqa: E731
    assert caps(with_it) == [0.0, 1.0] and caps(without) == [1.0]
    assert any("paged stash" in why for why in without.reasons)


def test_the_installed_megatron_core_is_read_for_the_paged_stash_without_importing_it(tmp_path, monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    from autotune.trials import plan
    src = tmp_path / "core" / "transformer" / "transformer_config.py"
    src.parent.mkdir(parents=True)
    src.write_text("class TransformerConfig:\n    moe_paged_stash: bool = False\n")
    asked = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: asked.append(name) or SimpleNamespace(
        submodule_search_locations=[str(tmp_path / "core")]))
    assert plan.megatron_has_paged_stash() is True
    assert asked == ["megatron.core"]  # the package, whose spec imports only `megatron`, not megatron.core itself
    src.write_text("class TransformerConfig:\n    moe_token_dispatcher_type: str = 'alltoall'\n")
    assert plan.megatron_has_paged_stash() is False
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert plan.megatron_has_paged_stash() is False


def test_a_search_with_fp8_attention_writes_it_into_every_recipe_and_reads_it_back(tmp_path, capsys):
    from autotune.cli.main import main
    from autotune.recipes.convert import workload_of
    from autotune.recipes.io import load_recipe

    rc = main(["search", "--model", "Qwen3-30B-A3B", "--gpu", "GB300", "--count", "8", "--precision", "mxfp8",
               "--fp8-attention", "--trials", "2", "--runs-dir", str(tmp_path / "runs")])
    capsys.readouterr()
    assert rc == 0
    recipes = sorted((tmp_path / "runs").glob("*/recipes/*.yaml"))
    assert recipes and all("--fp8-dot-product-attention" in p.read_text() for p in recipes)
    assert workload_of(load_recipe(recipes[0])).fp8_attention
    rc = main(["search", "--model", "Qwen3-30B-A3B", "--gpu", "GB300", "--count", "8", "--fp8-attention",
               "--runs-dir", str(tmp_path / "runs2")])
    assert rc == 2 and "--fp8-attention needs an FP8 precision" in capsys.readouterr().err
    assert not (tmp_path / "runs2").exists()


def test_space_and_estimate_take_fp8_attention_as_search_does(capsys):
    import json

    from autotune.cli.main import main
    args = ["--model", "Qwen3-30B-A3B", "--gpu", "GB300", "--count", "8", "--precision", "mxfp8", "--json"]
    best = []
    for extra in ([], ["--fp8-attention"]):
        assert main(["space", *args, "--top", "1", *extra]) == 0
        top = json.loads(capsys.readouterr().out)["top"][0]
        assert top["fp8_attention"] is bool(extra)
        best.append(top["throughput"]["tokens_per_s_per_gpu"])
    assert best[1] > best[0]  # FP8 attention's faster matrix products lift the space's best
    rc = main(["estimate", *args, "--layout", "TP1 PP1 EP8 DP8", "--fp8-attention", "--fp8-output-proj"])
    out = capsys.readouterr().out
    assert rc == 0 and '"fp8_attention": true' in out and "--fp8-dot-product-attention" in out


def test_a_space_without_full_graphs_says_what_the_paged_stash_would_give():
    """The default space leaves full-iteration graphs out (the paged stash needs a newer megatron-core); where its best
    layout would run measurably faster that way, the funnel says so with the number, and not when the space already
    has them or the cluster cannot run them."""
    from autotune.space import SearchSpace, explore
    m = load_model("Qwen3-30B-A3B")
    w = Workload(seq_len=4096, global_batch=512, precision="mxfp8", fp8_attention=True)
    dims = {"ep": [4, 8], "dispatcher": ["alltoall", "hybridep"], "rows_per_microbatch": [4]}
    space = SearchSpace.model_validate({"dimensions": dims})
    note = [n for n in explore(space, m, w, ClusterSpec.of("GB300", 8)).notes if n.startswith("not searched")]
    assert len(note) == 1 and "paged stash" in note[0] and "tokens/s/GPU (+" in note[0]
    assert not [n for n in explore(space, m, w, ClusterSpec.of("GB300", 8, has_paged_stash=False)).notes
                if n.startswith("not searched")]
    full = SearchSpace.model_validate({"dimensions": {**dims, "cuda_graphs": ["none", "full"]}})
    res = explore(full, m, w, ClusterSpec.of("GB300", 8))
    assert not [n for n in res.notes if n.startswith("not searched")]
    assert res.table.row(int(res.kept[0])).cuda_graphs == "full"  # searched, it wins
