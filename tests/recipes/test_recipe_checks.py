"""Derived numbers are recomputed, not trusted: MFU, $ / 1M tokens, window tokens, label, run block vs layout."""

from __future__ import annotations

import pytest

from autotune.catalog import get_gpu, load_model, param_counts
from autotune.recipes import check_recipe, layout_of, run_layout
from autotune.recipes.checks import agrees, printed_decimals

from recipe_seeds import PUBLISHED, SEED_DIR


def test_seeds_have_no_problems(seed):
    assert [str(p) for p in check_recipe(seed)] == []


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_derived_numbers_recompute_to_the_published_ones(name):
    """From the catalog alone (active parameters, GPU peak and price) and the measured tokens/s, the page's
    MFU and $ / 1M tokens come out; the recipe's own derived fields agree at their printed precision."""
    from autotune.recipes import load_recipe

    recipe = load_recipe(SEED_DIR / f"{name}.yaml")
    gpu, n = get_gpu(recipe.gpu.type), param_counts(load_model(recipe.model)).active
    tps = recipe.result.tokens_per_s_per_gpu
    mfu = tps * 6 * n / (gpu.bf16_tflops * 1e12)
    usd = gpu.usd_per_hour / (tps * 3600) * 1e6
    assert f"{mfu:.1%}" == PUBLISHED[name]["mfu_pct"]
    assert f"${usd:.2f}" == PUBLISHED[name]["usd"]
    assert f"{tps:,.1f}" == PUBLISHED[name]["tps"]
    assert agrees(recipe.result.mfu, mfu) and agrees(recipe.result.usd_per_million_tokens, usd, 2)
    lo, hi = recipe.result.window
    assert recipe.result.window_tokens == (hi - lo + 1) * recipe.workload.global_batch * recipe.workload.row_tokens


def test_printed_precision():
    assert printed_decimals(0.134) == 3 and printed_decimals(0.1293) == 4 and printed_decimals(9.0) == 1
    assert printed_decimals(1.5e-05) == 6 and printed_decimals(12.0) == 1
    assert agrees(0.134, 0.13392) and not agrees(0.134, 0.1346)
    assert agrees(0.1293, 0.12929) and not agrees(0.1293, 0.1291)


def _paths(recipe):
    return {p.path for p in check_recipe(recipe) if p.level == "error"}


@pytest.mark.parametrize(
    "field,value,path",
    [
        ("mfu", 0.2, "result.mfu"),
        ("mfu", 0.136, "result.mfu"),
        ("usd_per_million_tokens", 0.85, "result.usd_per_million_tokens"),
        ("window_tokens", 15728641, "result.window_tokens"),
        ("window", [5, 25], "result.window"),
        ("tokens_per_s_per_gpu", 2600.0, "result.mfu"),
    ],
)
def test_wrong_result_numbers_are_caught(seed, field, value, path):
    setattr(seed.result, field, value)
    assert path in _paths(seed)


def test_wrong_active_params_and_memory_are_caught(seed):
    seed.result.active_params.count += 1
    seed.gpu.memory_gb = 80
    assert {"result.active_params.count", "gpu.memory_gb"} <= _paths(seed)


@pytest.mark.parametrize(
    "field,value,path",
    [
        ("label", "TP1 PP4 EP8 DP4", "layout.label"),
        ("dp", 4, "layout.dp"),
        ("rows_per_microbatch", 2, "layout.rows_per_microbatch"),
        ("summary", "TP 2, PP 4, CP 1, EP 8, ETP 1, DP 8; rest", "layout.summary"),
        ("layer_split", [12, 12, 12], "layout.layer_split"),
    ],
)
def test_layout_section_inconsistencies_are_caught(seed, field, value, path):
    setattr(seed.layout, field, value)
    assert path in _paths(seed)


@pytest.mark.parametrize(
    "old,new",
    [
        ("--expert-model-parallel-size 8", "--expert-model-parallel-size 4"),
        ("--recompute-num-layers ", "--recompute-num-layers 3 --ignored "),
        ("--max-tokens-per-gpu 8192", "--max-tokens-per-gpu 16384"),
        ("--actor-num-nodes 4", "--actor-num-nodes 2"),
        ("--num-rollout ", "--num-rollout 99 --ignored "),
        ("--global-batch-size 128", "--global-batch-size 256"),
        ("  --use-precision-aware-optimizer \\\n", ""),
        ("export TORCHINDUCTOR_COMPILE_THREADS=1\n", ""),
    ],
)
def test_run_block_disagreeing_with_the_layout_is_caught(seed, old, new):
    assert old in seed.run
    seed.run = seed.run.replace(old, new)
    assert _paths(seed) & {"run", "env.TORCHINDUCTOR_COMPILE_THREADS"}


def test_dispatcher_in_run_must_match(seed):
    seed.layout.dispatcher = "allgather"
    assert "run" in _paths(seed)


def test_sequence_parallel_flag_at_tp1_is_accepted():
    """Megatron ignores --sequence-parallel at TP 1: the seed's `sequence_parallel: false` is the effective value."""
    from autotune.recipes import load_recipe

    recipe = load_recipe(SEED_DIR / "attune-tp1-pp4-ep8-rc2.yaml")
    ran = run_layout(recipe)
    assert "--sequence-parallel" in recipe.run and ran.sequence_parallel and not ran.sp
    assert recipe.layout.sequence_parallel is False and layout_of(recipe).sp is False
    assert _paths(recipe) == set()
    recipe.layout.sequence_parallel = True  # claiming SP at TP 1 is wrong: it is not in effect
    assert "layout.sequence_parallel" in _paths(recipe)


def test_verified_needs_passing_gates(seed):
    seed.correctness.result = "not run"
    assert "status" in _paths(seed)
    seed.status = "measured"
    assert "status" not in _paths(seed)
    seed.correctness.result = "pass"
    seed.correctness.convergence.result = "fail"
    assert "correctness.result" in _paths(seed)


def test_unknown_gpu_is_a_warning_not_an_error(seed):
    seed.gpu.type = "MI300X"
    problems = check_recipe(seed)
    assert any(p.path == "gpu.type" and p.level == "warning" for p in problems)
