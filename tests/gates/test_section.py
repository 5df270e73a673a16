"""Gate results -> the recipe's correctness section; the component judgement; run_gates as the search calls it."""

from __future__ import annotations

import copy

import pytest
from gate_helpers import BASE, CURVE, FLEX, RC2

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.gates.arguments import recipe_arguments
from autotune.gates.component import ComponentSpec, component_gate, judge
from autotune.gates.configuration import configuration_gate
from autotune.gates.result import GateResult
from autotune.gates.section import correctness_section, recipe_status, run_gates
from autotune.layout import Layout, Recompute
from autotune.recipes.checks import check_recipe
from autotune.recipes.emit import recipe_from_candidate
from autotune.recipes.sections import Correctness

# What runner/component.py wrote for alltoall vs allgather at EP2 on this machine (bf16, reduced shape).
NUMBERS = {
    "dispatcher": "allgather", "reference_dispatcher": "alltoall", "dtype": "bf16", "device": "cpu (gloo)",
    "shape": {"hidden": 128, "experts": 8, "topk": 2, "ffn": 64, "tokens_per_rank": 256, "ep": 2},
    "runs": {
        "default": {"output_error": 0.00732, "input_grad_error": 0.01142, "routing_mismatch_vs_default": 0},
        "candidate": {"output_error": 0.00732, "input_grad_error": 0.01142, "routing_mismatch_vs_default": 0},
        "perturbed_weight": {"output_error": 0.0355, "input_grad_error": 0.0357, "routing_mismatch_vs_default": 0},
        "dropped_token": {"output_error": 0.0495, "input_grad_error": 0.0334, "routing_mismatch_vs_default": 1},
    },
    "rerun_bitwise_identical": True,
}


def _fake(numbers):
    return lambda spec: copy.deepcopy(numbers)


def test_judge_passes_and_computes_the_bound():
    status, text, d = judge(NUMBERS)
    assert status == "pass" and d["controls_failed"] == {"perturbed_weight": True, "dropped_token": True}
    grad = next(r for r in d["tensors"] if r["tensor"] == "input gradient")
    assert grad["bound"] == pytest.approx(2 * 0.01142 + 1e-3)
    assert "worst tensor (input gradient)" in text and "negative controls fail" in text


@pytest.mark.parametrize("edit, needle", [
    (lambda n: n["runs"]["candidate"].update(output_error=0.02), "worst tensor (output) relative L2 error 0.02"),
    (lambda n: n["runs"]["candidate"].update(routing_mismatch_vs_default=3), "routing differs on 3 tokens"),
    (lambda n: n.update(rerun_bitwise_identical=False), "the rerun differs"),
    (lambda n: n["runs"]["perturbed_weight"].update(output_error=0.001, input_grad_error=0.001), "not detected: perturbed_weight"),
    (lambda n: n["runs"]["dropped_token"].update(output_error=0.001, input_grad_error=0.001, routing_mismatch_vs_default=0),
     "not detected: dropped_token"),
])
def test_judge_fails(edit, needle):
    numbers = copy.deepcopy(NUMBERS)
    edit(numbers)
    res = component_gate(ComponentSpec(), run=_fake(numbers))
    assert res.status == "fail" and needle in res.summary


def test_flex_without_deepep_is_not_run_and_ep1_moves_nothing():
    res = component_gate(ComponentSpec(dispatcher="flex"), run=_fake(NUMBERS))
    assert res.status == "not_run" and "DeepEP" in res.summary
    assert component_gate(ComponentSpec(ep=1), run=_fake(NUMBERS)).status == "not_run"


def _conv(status="pass"):
    return GateResult(gate="convergence", status=status, summary=f"{status}: x",
                      details={"steps": 20, "correlation": 0.999997, "final_loss_difference": 0.00042,
                               "pointwise_failures": 0, "worst_step_tolerance_ratio": 0.026})


def test_section_matches_the_seed_format_and_validates():
    cfg = configuration_gate(recipe_arguments(FLEX), recipe_arguments(BASE))
    assert cfg.needs == ["--moe-token-dispatcher-type alltoall -> flex"]
    # a flex component test as the GPU script would report it
    comp = GateResult(gate="component", status="pass", summary="pass: routing identical; ...",
                      details={"spec": {"dispatcher": "flex"}, "test": "flex dispatcher against an FP32 reference",
                               "shape": "one MoE layer", "numbers": {"device": "H200"}})
    section = correctness_section(cfg, _conv(), [comp], reference="attune-tp1-pp4-ep8", date="2026-12-03")
    Correctness.model_validate(section)
    assert list(section) == ["result", "summary", "reference", "configuration", "component_tests", "convergence", "rules"]
    assert section["result"] == "pass" and section["summary"] == "passed; 1 component test passed"
    assert section["component_tests"][0]["gpu"] == "H200" and section["convergence"]["correlation"] == 0.999997
    assert recipe_status(section) == "verified"
    # without the component test the flex recipe is not verified, and says why
    missing = correctness_section(cfg, _conv(), [], reference="r")
    assert missing["result"] == "not run" and "no component test for --moe-token-dispatcher-type" in missing["summary"]
    assert recipe_status(missing) == "measured"
    failed = correctness_section(cfg, _conv("fail"), [comp], reference="r")
    assert failed["result"] == "fail" and failed["summary"].startswith("failed: convergence")


def test_run_gates_fills_a_recipe_that_validates():
    model, cluster = load_model("Qwen3.5-122B-A10B"), ClusterSpec.of("H200", 32)
    layout = Layout(world=32, pp=4, ep=8, recompute=Recompute("full", "uniform", 2), max_tokens_per_gpu=8192)
    result, section = run_gates(recipe_arguments(RC2), recipe_arguments(BASE), CURVE, dict(CURVE),
                                reference="attune-tp1-pp4-ep8")
    assert result == "pass" and section["convergence"]["steps"] == 20 and "20-step check" in section["rules"]
    recipe = recipe_from_candidate(model, cluster, layout, Workload(), status=recipe_status(section),
                                   tokens_per_s_per_gpu=2451.44, step_time_cv_percent=0.57, gpu_hours=9.0,
                                   window=(5, 19), steps_per_run=20, stack={"framework": "slime", "megatron_lm": "x",
                                   "pytorch": "2.13", "python": "3.11"}, measured="2026-12-03", gates=section)
    assert recipe.status == "verified" and recipe.correctness.result == "pass" and check_recipe(recipe) == []


def test_predicted_gates_say_not_run_predicted():
    result, section = run_gates(recipe_arguments(FLEX), recipe_arguments(BASE), CURVE, CURVE, predicted=True,
                                reference="simplest legal layout")
    assert result == "not run" and section["convergence"] is None and section["component_tests"] == []
    assert "predicted" in section["summary"] and section["configuration"] == "pass"
    Correctness.model_validate(section)


def test_nan_convergence_fails_the_section():
    bad = dict(CURVE)
    bad[3] = float("nan")
    result, section = run_gates(recipe_arguments(RC2), recipe_arguments(BASE), bad, CURVE, reference="r")
    assert result == "fail" and section["convergence"] is None and "nan at step 3" in section["summary"]
    Correctness.model_validate(section)


def test_candidate_arguments_for_search_layouts():
    from autotune.gates.arguments import candidate_arguments

    model, cluster, work = load_model("Qwen3.5-122B-A10B"), ClusterSpec.of("H200", 32), Workload()
    ref = Layout(world=32, pp=4, ep=8, recompute=Recompute("full", "uniform", 1), max_tokens_per_gpu=8192)
    same_as_seed = candidate_arguments(model, cluster, ref, work)
    assert configuration_gate(same_as_seed, recipe_arguments(BASE).copy()).status == "pass"
    flex = candidate_arguments(model, cluster, ref.with_(dispatcher="flex", tp=2), work)
    res = configuration_gate(flex, same_as_seed)
    assert res.needs == ["--moe-token-dispatcher-type alltoall -> flex"]
    back = configuration_gate(same_as_seed, flex)  # and the other way round
    assert back.needs == ["--moe-token-dispatcher-type flex -> alltoall"]
    result, section = run_gates(same_as_seed, flex, CURVE, CURVE, run_components=False, reference="r")
    assert result == "not run" and "component tests off" in section["summary"]


def test_cli_component_bad_input_and_flex_not_run(capsys):
    from gate_helpers import cli

    for argv, needle in ((("--dispatcher", "alltoall", "--ep", "3"), "--ep 3: give a rank count that divides the "
                          "8 experts (1, 2, 4, 8)"),
                         (("--dispatcher", "alltoall", "--ep", "0"), "--ep 0: give a rank count"),
                         (("--dispatcher", "alltoall", "--dtype", "fp16"), "--dtype 'fp16'"),
                         (("--dispatcher", "deepep"), "dispatcher 'deepep'")):
        rc, out, err = cli(capsys, "check", "component", *argv)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1 and out == ""
    rc, out, _ = cli(capsys, "check", "component", "--dispatcher", "flex")
    assert rc == 1 and "component: not run  " in out and "not run: " not in out and "DeepEP" in out
