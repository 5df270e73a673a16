"""The configuration gate on the seed recipes and on recipes that change the math."""

from __future__ import annotations

import json

import pytest
import yaml
from gate_helpers import BASE, FLEX, RC2, cli

from autotune.gates.arguments import parse_arguments, recipe_arguments
from autotune.gates.configuration import configuration_gate


def _classes(result):
    return {d["argument"]: d["class"] for d in result.details["differences"]}


def test_seed_recipes_against_the_reference():
    rc2 = configuration_gate(recipe_arguments(RC2), recipe_arguments(BASE))
    assert rc2.status == "pass" and not rc2.needs
    assert _classes(rc2) == {"--recompute-num-layers": "performance", "--moe-shared-expert-overlap": "performance",
                             "--num-rollout": "performance"}
    flex = configuration_gate(recipe_arguments(FLEX), recipe_arguments(BASE))
    assert flex.status == "pass"
    assert _classes(flex)["--moe-token-dispatcher-type"] == "kernel"
    assert _classes(flex)["--moe-shared-expert-overlap"] == "performance"
    assert flex.needs == ["--moe-token-dispatcher-type alltoall -> flex"]
    assert "1 needs a component test" in flex.summary


def test_flex_against_rc2_and_itself():
    both = configuration_gate(recipe_arguments(FLEX), recipe_arguments(RC2))
    assert _classes(both) == {"--recompute-num-layers": "performance", "--moe-token-dispatcher-type": "kernel"}
    same = configuration_gate(recipe_arguments(FLEX), recipe_arguments(FLEX))
    assert same.status == "pass" and same.details["differences"] == [] and same.summary == "pass: the same arguments"


def _edited(tmp_path, name, edit):
    doc = yaml.safe_load(BASE.read_text())
    edit(doc)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_load_balancing_loss_on_fails(tmp_path):
    def lb_on(doc):
        doc["layout"]["summary"] = doc["layout"]["summary"].replace("load-balancing loss off", "load-balancing loss on")
    res = configuration_gate(recipe_arguments(_edited(tmp_path, "lb", lb_on)), recipe_arguments(BASE))
    assert res.status == "fail" and _classes(res) == {"--moe-aux-loss-coeff": "numerics"}
    assert "--moe-aux-loss-coeff 0 -> 0.001" in res.summary


def test_an_explicit_aux_loss_after_model_args_fails(tmp_path):
    def aux(doc):
        doc["run"] = doc["run"].rstrip("\n") + " \\\n  --moe-aux-loss-coeff 1e-3\n"
    res = configuration_gate(recipe_arguments(_edited(tmp_path, "aux", aux)), recipe_arguments(BASE))
    assert res.status == "fail" and _classes(res)["--moe-aux-loss-coeff"] == "numerics"


def test_precision_change_fails(capsys, tmp_path):
    def fp8(doc):
        doc["workload"]["precision"] = "fp8"
    p = _edited(tmp_path, "fp8", fp8)
    res = configuration_gate(recipe_arguments(p), recipe_arguments(BASE))
    # the fp8 class without recipe flags is Megatron's default recipe for it: --fp8-format hybrid --fp8-recipe delayed
    assert res.status == "fail" and _classes(res) == {"--fp8-format": "numerics", "--fp8-recipe": "numerics"}
    rc, out, _ = cli(capsys, "check", "config", "--candidate", p, "--reference", BASE, "--json")
    assert rc == 1 and json.loads(out)["status"] == "fail"

    def fp16(doc):
        doc["workload"]["precision"] = "fp16"
    res = configuration_gate(recipe_arguments(_edited(tmp_path, "fp16", fp16)), recipe_arguments(BASE))
    assert res.status == "fail" and _classes(res) == {"--fp16": "numerics", "--bf16": "numerics"}


def test_unknown_argument_fails_and_names_it():
    res = configuration_gate("--tensor-model-parallel-size 2 --my-new-flag 3", "--tensor-model-parallel-size 1")
    assert res.status == "fail" and "unknown" in res.summary and "--my-new-flag" in res.summary
    assert _classes(res) == {"--tensor-model-parallel-size": "layout", "--my-new-flag": "unknown"}


def test_parse_arguments_last_wins_and_keeps_env_and_placeholders():
    run = ('export NCCL_NVLS_ENABLE=$([ "$NVLINK_COUNT" -gt 0 ] && echo 1 || echo 0)\n'
           'python3 -m <slime entry module> --async \\\n  ${MODEL_ARGS[@]} \\\n  --hf-checkpoint "$HF_CKPT" \\\n'
           '  --recompute-modules core_attn mlp --moe-token-dispatcher-type alltoall --moe-token-dispatcher-type flex\n')
    args = parse_arguments(run, model_args=["--num-experts", "8", "--moe-token-dispatcher-type", "alltoall"])
    assert args["NCCL_NVLS_ENABLE"].startswith("$([") and args["--hf-checkpoint"] == "$HF_CKPT"
    assert args["--recompute-modules"] == "core_attn mlp" and args["--async"] is None
    assert args["--moe-token-dispatcher-type"] == "flex" and args["--num-experts"] == "8"
    assert list(args)[-1] == "--moe-token-dispatcher-type"


@pytest.mark.parametrize("which", ["candidate", "reference"])
def test_cli_config_bad_recipe_exits_2(capsys, tmp_path, which):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nmodel: [\n")
    pair = {"candidate": RC2, "reference": BASE, which: bad}
    rc, out, err = cli(capsys, "check", "config", "--candidate", pair["candidate"], "--reference", pair["reference"])
    assert rc == 2 and "bad.yaml" in err and len(err.strip().splitlines()) == 1 and out == ""


def test_cli_config_prints_the_table(capsys):
    rc, out, _ = cli(capsys, "check", "config", "--candidate", FLEX, "--reference", BASE)
    assert rc == 0 and "kernel" in out and "--moe-token-dispatcher-type" in out and "performance" in out
