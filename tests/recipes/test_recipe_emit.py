"""Emission: the run block is rebuilt from layout + workload exactly as the seed writes it, names and words
follow the seed, and a recipe built from a candidate validates and recomputes."""

from __future__ import annotations

import shlex
from dataclasses import replace

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.errors import BadInput
from autotune.layout import Layout, Recompute, layout_from_args
from autotune.launch import build_run_block
from autotune.recipes import (
    check_recipe,
    cluster_of,
    dump_recipe,
    highlights,
    layout_of,
    load_recipe,
    parse_recipe,
    recipe_from_candidate,
    recipe_name,
    run_layout,
    summarize,
    workload_of,
)
from autotune.recipes.checks import agrees
from autotune.recipes.convert import is_moe

from recipe_seeds import SEED_DIR

STACK = {"framework": "slime 0.3.0", "megatron_lm": "megatron-core 0.16.0", "pytorch": "2.11.0", "python": "3.12"}


def _rebuilt(seed) -> str:
    return build_run_block(layout_of(seed), workload_of(seed), cluster_of(seed),
                           loss_mask=seed.workload.dataset.build.loss_mask, moe=is_moe(seed))


def _argv(run: str) -> list[str]:
    return shlex.split(run.replace("\\\n", " "), comments=True)


def test_run_block_round_trip_argument_by_argument(seed):
    """From the layout section (+ summary) and the workload alone, the seed's command comes back."""
    rebuilt = _rebuilt(seed)
    assert _argv(rebuilt) == _argv(seed.run)
    assert rebuilt.splitlines() == seed.run.splitlines()  # same lines: grouping and order too
    assert rebuilt == seed.run


def test_round_trip_follows_the_layout_not_a_template():
    second = load_recipe(SEED_DIR / "attune-tp1-pp4-ep8.yaml")
    argv = _argv(_rebuilt(second))
    assert argv[argv.index("--num-rollout") + 1] == "14"
    assert argv.index("--attention-backend") < argv.index("--moe-shared-expert-overlap") < argv.index("--cross-entropy-loss-fusion")
    flex = load_recipe(SEED_DIR / "attune-tp1-pp4-ep8-flex.yaml")
    argv = _argv(_rebuilt(flex))
    assert argv[-2:] == ["--moe-token-dispatcher-type", "flex"]
    assert "--moe-shared-expert-overlap" not in argv


def test_names_and_words_follow_the_seed(seed_path):
    seed = load_recipe(seed_path)
    lay, work = layout_of(seed), workload_of(seed)
    assert recipe_name(seed.author.name, lay, work) == seed_path.stem
    assert highlights(lay, work) == seed.layout.highlights
    assert lay.label() == seed.layout.label


def test_summary_in_the_seed_words():
    for name in ("attune-tp1-pp4-ep8-rc2", "attune-tp1-pp4-ep8-flex"):
        seed = load_recipe(SEED_DIR / f"{name}.yaml")
        assert summarize(layout_of(seed), workload_of(seed)) == seed.layout.summary


def test_recipe_names_mark_what_differs():
    w = Workload()
    base = Layout(world=32, pp=4, ep=8, recompute=Recompute("full", "uniform", 1), max_tokens_per_gpu=8192)
    assert recipe_name("autotune", base, w) == "autotune-tp1-pp4-ep8"
    assert recipe_name("ATTUNE", base.with_(tp=2, vpp=2, dispatcher="allgather"), w) == "attune-tp2-pp4-vpp2-ep8-allgather"
    assert recipe_name("x", base.with_(recompute=Recompute(), max_tokens_per_gpu=16384), w) == "x-tp1-pp4-ep8-norc-mt16k"


def _candidate(**over):
    model = load_model("Qwen3.5-122B-A10B")
    cluster = ClusterSpec.of("H200", 32)
    layout = Layout(world=32, tp=2, pp=4, ep=8, recompute=Recompute("selective", modules=("core_attn", "moe_act")),
                    max_tokens_per_gpu=16384, precision_aware_optimizer=True, dispatcher="flex")
    kw = dict(status="measured", tokens_per_s_per_gpu=2100.456, step_time_cv_percent=0.8, gpu_hours=3.5,
              window=(3, 11), steps_per_run=12, stack=STACK, measured="2026-12-01")
    work = over.pop("workload", Workload())
    kw.update(over)
    return model, cluster, layout, recipe_from_candidate(model, cluster, layout, work, **kw)


def test_recipe_from_candidate_validates_and_recomputes():
    model, cluster, layout, recipe = _candidate()
    assert check_recipe(recipe) == []
    again = parse_recipe(dump_recipe(recipe, "n"))
    assert again == recipe and check_recipe(again) == []
    assert run_layout(recipe) == layout
    assert layout_of(recipe).sp and recipe.layout.sequence_parallel  # TP 2: SP in effect
    assert recipe.layout.label == "TP2 PP4 EP8 DP4" and recipe.layout.rows_per_microbatch == 2
    assert recipe.result.window_tokens == 9 * 128 * 8192
    assert "--num-rollout 12" in recipe.run
    n = recipe.result.active_params.count
    assert agrees(recipe.result.mfu, 2100.456 * 6 * n / (cluster.gpu.bf16_tflops * 1e12))
    assert recipe.correctness.result == "not run" and recipe.correctness.convergence is None
    assert recipe.status == "measured" and recipe.result.runs == 1


def test_emitted_sp_disagreement_is_caught():
    _, _, _, recipe = _candidate()
    recipe.layout.sequence_parallel = False
    assert any(p.path == "run" for p in check_recipe(recipe))


def test_predicted_recipe_has_no_run_numbers():
    _, _, _, recipe = _candidate(status="predicted", step_time_cv_percent=None, gpu_hours=None)
    assert recipe.result.runs == 0 and recipe.result.gpu_hours is None and recipe.result.mfu_note
    assert check_recipe(recipe) == []


def test_recipe_from_candidate_reproduces_a_seed():
    seed = load_recipe(SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml")
    model, work = load_model(seed.model), workload_of(seed)
    recipe = recipe_from_candidate(
        model, cluster_of(seed), layout_of(seed), replace(work, steps=3, window=(0, 1)),
        status="verified", tokens_per_s_per_gpu=seed.result.tokens_per_s_per_gpu, step_time_cv_percent=0.57,
        gpu_hours=8.96, window=tuple(seed.result.window), steps_per_run=seed.result.steps_per_run,
        stack=seed.stack.model_dump(), measured="2026-10-13", author="ATTUNE",
        gates=seed.correctness.model_dump(), dataset=seed.workload.dataset.model_dump(),
    )
    assert recipe.run == seed.run and recipe.layout == seed.layout and recipe.env == seed.env
    assert agrees(seed.result.mfu, recipe.result.mfu) and recipe.result.usd_per_million_tokens == seed.result.usd_per_million_tokens
    assert recipe.result.window_tokens == seed.result.window_tokens
    assert check_recipe(recipe) == []


def test_verified_without_gates_and_wrong_world_are_refused():
    with pytest.raises(BadInput, match="gate"):
        _candidate(status="verified")
    model, cluster, layout, _ = _candidate()
    with pytest.raises(BadInput, match="32"):
        build_run_block(layout.with_(world=16), Workload(), cluster)


def test_run_block_reads_back_for_any_layout():
    cluster = ClusterSpec.of("H200", 64)
    for layout in (
        Layout(world=64, tp=4, pp=2, vpp=3, cp=2, ep=16, etp=2, recompute=Recompute("full", "block", 4), micro_batch_size=2),
        Layout(world=64, tp=1, pp=8, ep=8, optimizer_offload=0.5, moe_shared_expert_overlap=True, cross_entropy_fusion=False,
               micro_batch_size=1),
    ):
        run = build_run_block(layout, Workload(), cluster)
        assert layout_from_args(run) == layout


def test_gradient_dtype_is_written_and_read_back(seed):
    """fp32 gradient reduction is a workload setting: written as the seed's flag, absent for bf16 grads."""
    assert workload_of(seed).grads_fp32  # every seed reduces in fp32
    _, _, layout, bf16 = _candidate(workload=Workload(grads_fp32=False), status="predicted", step_time_cv_percent=None,
                                    gpu_hours=None)
    assert "--accumulate-allreduce-grads-in-fp32" not in bf16.run and "--attention-softmax-in-fp32" in bf16.run
    assert workload_of(bf16).grads_fp32 is False and check_recipe(bf16) == []
    assert bf16.layout.summary.endswith("; bf16 gradient reduction")
    assert recipe_name("autotune", layout, Workload(grads_fp32=False)).endswith("-g16")
    assert not recipe_name("autotune", layout, Workload()).endswith("-g16")


def test_derived_numbers_follow_the_printed_throughput():
    """MFU and $ are derived from tokens/s/GPU as the recipe prints it (2 decimals), as the checks recompute them:
    derived from the unrounded number, a few throughputs printed an MFU the recipe's own check (and `export`)
    refused."""
    from autotune.catalog import param_counts
    from autotune.cost.flops import mfu_of

    model, cluster = load_model("Qwen3.5-122B-A10B"), ClusterSpec.of("H200", 32)
    n, peak = param_counts(model).active, cluster.gpu.bf16_tflops
    # throughputs whose MFU rounds differently from the unrounded and the printed number (found, not assumed)
    t = 2000 + np.arange(200_000) * 0.0013
    edge = t[np.round(mfu_of(t, n, peak), 4) != np.round(mfu_of(np.round(t, 2), n, peak), 4)]
    assert len(edge), "no throughput at a rounding edge in the range scanned"
    for tps in edge[:3].tolist():
        _, _, _, recipe = _candidate(tokens_per_s_per_gpu=tps)
        assert check_recipe(recipe) == [], tps


@pytest.mark.parametrize("precision, cls", [("bf16", None), ("mxfp8", "FP8"), ("nvfp4", "FP4")])
def test_low_precision_recipes_may_pass_the_bf16_peak_and_say_so(precision, cls):
    """MFU is taken on the dense BF16 peak (the seed's definition), so an FP8 / FP4 recipe can pass 1: the schema
    takes it and the note says why (an NVFP4 search on GB300 died writing its recipes at MFU 1.05)."""
    model, cluster = load_model("Llama-3.1-70B"), ClusterSpec.of("GB300", 16)
    layout = Layout(world=16, tp=4, pp=2, micro_batch_size=1)
    from autotune.catalog import param_counts

    fast = 1.2 * cluster.gpu.bf16_tflops * 1e12 / (6 * param_counts(model).active)  # MFU 1.2
    recipe = recipe_from_candidate(model, cluster, layout, Workload(precision=precision), status="predicted",
                                   tokens_per_s_per_gpu=fast, step_time_cv_percent=None, gpu_hours=None,
                                   window=(5, 19), steps_per_run=20, stack=STACK,
                                   measured="2026-12-04")
    assert recipe.result.mfu == pytest.approx(1.2, abs=1e-3) and check_recipe(recipe) == []
    note = recipe.result.mfu_note
    assert "not measured" in note
    assert (f"{cls} GEMMs run above" in note) if cls else ("BF16 peak" not in note)
