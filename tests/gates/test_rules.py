"""skill/correctness/numerics_list.yaml covers every argument the project can emit, and bad rule files
are bad input.

The emitted set is derived from the code that writes commands: layout_args over a grid of layouts in both
styles, recipe run blocks (build_run_block) for both gradient settings, slime's MODEL_ARGS for every
catalog model with the load-balancing loss off and on, `autotune export --format megatron` of the seed
recipes, the seed recipes' run blocks and env, and the slime backend's forwarded environment.
"""

from __future__ import annotations

import itertools

import pytest
from gate_helpers import BASE, FLEX, RC2, cli

from autotune.catalog import ClusterSpec, Workload, load_model, model_names
from autotune.errors import ConfigError
from autotune.gates.arguments import parse_arguments, recipe_arguments
from autotune.gates.rules import CLASSES, load_rules
from autotune.layout import Layout, Recompute, format_args, layout_args
from autotune.launch import SEED_ENV, build_run_block
from autotune.recipes.export import megatron_args
from autotune.recipes.io import load_recipe
from autotune.trials.backends import slime as slime_backend
from autotune.launch import slime_model_args


def _layouts():
    recomputes = [Recompute(), Recompute("full", "uniform", 2), Recompute("full", "block", 1),
                  Recompute("selective", modules=("core_attn", "mlp"))]
    for rc, disp, vpp, batching, opt, flags in itertools.product(
            recomputes, ("alltoall", "allgather", "flex"), (1, 2), ("dynamic", "mbs"),
            ("plain", "dist", "precision", "offload"), (False, True)):
        yield Layout(world=32, tp=2, pp=2, vpp=vpp, ep=8, recompute=rc, dispatcher=disp,
                     max_tokens_per_gpu=8192 if batching == "dynamic" else None,
                     micro_batch_size=1 if batching == "mbs" else None,
                     distributed_optimizer=opt != "plain", precision_aware_optimizer=opt == "precision",
                     optimizer_offload=0.5 if opt == "offload" else 0.0, moe_shared_expert_overlap=flags,
                     cross_entropy_fusion=flags, overlap_grad_reduce=flags, overlap_param_gather=flags)
    for graphs in ("none", "router", "attn", "full"):  # the overlap, CUDA-graph, token-drop and offload settings
        yield Layout(world=32, tp=2, pp=2, vpp=2, ep=8, ep_overlap=graphs != "full", tp_comm_overlap=True,
                     cuda_graphs=graphs, moe_capacity_factor=1.0 if graphs == "full" else 0.0)
    yield Layout(world=32, tp=2, ep=8, activation_offload_layers=4)
    yield Layout(world=32, tp=2, ep=8, fsdp=True)  # Megatron FSDP: its sharding flags and checkpoint format
    yield Layout(world=32, tp=2, ep=8, offload_modules=("core_attn", "attn_proj", "expert_fc1"))  # fine-grained
    # uneven layer splits (48 layers): account-for flags, first / last stage layers, the pipeline layout
    for pp, vpp, split in ((2, 5, (4,) + (5,) * 8 + (4,)), (4, 1, (11, 13, 13, 11)), (4, 1, (9, 13, 13, 13)),
                           (4, 2, (7,) + (6,) * 7)):
        yield Layout(world=32, tp=2, pp=pp, vpp=vpp, ep=8, layer_split=split)


def emitted_arguments() -> set[str]:
    seen: set[str] = set()
    cluster = ClusterSpec.of("H200", 32, 8)
    for lay in _layouts():
        for style, moe in itertools.product(("slime", "megatron"), (False, True)):
            seen |= {f for f, _ in layout_args(lay, style, moe=moe)}
        seen |= set(format_args(layout_args(lay)))
    for grads in (True, False):
        for lay in (Layout(world=32, pp=4, ep=8), Layout(world=32, pp=4, ep=8, offload_modules=("moe_act",))):
            seen |= set(parse_arguments(build_run_block(lay, Workload(grads_fp32=grads), cluster)))
    for name in model_names():
        for aux in (0.0, 1e-3):
            seen |= set(parse_arguments(slime_model_args(load_model(name), aux_loss_coeff=aux)))
    for path in (BASE, RC2, FLEX):
        recipe = load_recipe(path)
        seen |= set(recipe_arguments(recipe)) | set(recipe.env)
        seen |= {tok for tok in megatron_args(recipe).split() if tok.startswith("--")}
    seen |= set(SEED_ENV) | set(slime_backend._FORWARDED)
    return {a for a in seen if a.startswith("--") or a.isupper()}


def test_every_emitted_argument_has_a_class():
    rules = load_rules()
    emitted = emitted_arguments()
    assert len(emitted) > 100  # the derivation really walked the code paths
    missing = sorted(a for a in emitted if a not in rules)
    assert not missing, f"add these to skill/correctness/numerics_list.yaml: {missing}"
    assert {r.cls for r in rules.values()} == set(CLASSES)


def test_the_classes_the_issue_names():
    r = load_rules()
    assert r.cls_of("--tensor-model-parallel-size") == "layout"
    assert r.cls_of("--recompute-num-layers") == r.cls_of("--moe-shared-expert-overlap") == "performance"
    assert r.cls_of("--moe-token-dispatcher-type") == r.cls_of("--moe-grouped-gemm") == "kernel"
    assert r.cls_of("--overlap-moe-expert-parallel-comm") == r.cls_of("--tp-comm-overlap") == "performance"
    assert r.cls_of("--cuda-graph-impl") == r.cls_of("--cuda-graph-scope") == "kernel"
    assert r.cls_of("--moe-expert-capacity-factor") == r.cls_of("--moe-pad-expert-input-to-capacity") == "numerics"
    for arg in ("--moe-aux-loss-coeff", "--bf16", "--moe-router-dtype", "--attention-softmax-in-fp32", "--hidden-dropout"):
        assert r.cls_of(arg) == "numerics", arg


@pytest.mark.parametrize("text, needle", [
    ("arguments:\n  --lr: {class: maths, why: x}\n", "unknown class 'maths'"),
    ("arguments:\n  --lr: {class: numerics}\n", "give exactly `class` and `why`"),
    ("arguments: [1, 2]\n", "needs a mapping"),
    ("arguments: {--lr: [\n", "not YAML"),
])
def test_bad_rule_files_are_one_line_bad_input(tmp_path, text, needle):
    p = tmp_path / "rules.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="rules.yaml") as exc:
        load_rules(p)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_cli_with_an_unknown_class_exits_2(capsys, tmp_path):
    p = tmp_path / "rules.yaml"
    p.write_text("arguments:\n  --lr: {class: maths, why: x}\n")
    rc, out, err = cli(capsys, "check", "config", "--candidate", RC2, "--reference", BASE, "--rules", p)
    assert rc == 2 and "unknown class 'maths'" in err and len(err.strip().splitlines()) == 1 and out == ""
