"""Layout: labels, derived degrees, Megatron's rules with the nearest legal alternative, arguments."""

import pytest

from autotune.catalog import Workload, load_model
from autotune.errors import BadInput, IllegalLayout
from autotune.layout import Layout, LayoutTable, Recompute, format_args, layout_args, layout_from_args, validate, violations

Q = load_model("Qwen3.5-122B-A10B")
W = Workload()


def seed_layout(**kw):
    base = dict(max_tokens_per_gpu=8192, recompute=Recompute.parse("full:uniform:2"), precision_aware_optimizer=True)
    return Layout.parse("TP1 PP4 EP8 DP8", **{**base, **kw})


def test_label_round_trip_and_derived_degrees():
    lay = seed_layout()
    assert (lay.world, lay.dp, lay.expert_dp) == (32, 8, 1)
    assert lay.label() == "TP1 PP4 EP8 DP8"
    assert Layout.parse("EP8, dp8 tp1 pp4").label() == "TP1 PP4 EP8 DP8"
    odd = Layout.parse("TP2 PP2 VPP3 CP2 EP4 ETP2", world=64)
    assert odd.label() == "TP2 PP2 VPP3 CP2 EP4 ETP2 DP8" and odd.expert_dp == 4
    assert not lay.sp and Layout.parse("TP2 PP1", world=2).sp  # SP only takes effect with TP > 1


@pytest.mark.parametrize("bad", ["TP1 PP4 XX8", "TP0 PP4", "TP1 TP2", "PP4"])
def test_bad_labels(bad):
    with pytest.raises(BadInput):
        Layout.parse(bad)


def test_count_mismatch_names_both():
    with pytest.raises(BadInput, match="--count is 16"):
        Layout.parse("TP1 PP4 EP8 DP8", world=16)


def test_seed_layouts_are_legal():
    for rc in ("full:uniform:2", "full:uniform:1"):
        assert violations(Q, W, seed_layout(recompute=Recompute.parse(rc))) == []
    assert violations(Q, W, seed_layout(dispatcher="flex")) == []
    assert violations(Q, W, seed_layout(moe_shared_expert_overlap=True)) == []


def test_every_violation_is_named_with_values_and_a_legal_alternative():
    lay = Layout.parse("TP3 PP5 CP2 EP7", world=384, max_tokens_per_gpu=8192, sequence_parallel=False)
    codes = {v.code for v in violations(Q, W, lay)}
    assert {"heads_tp", "query_groups_tp", "linear_heads_tp", "linear_no_cp", "layers_pp", "experts_ep",
            "moe_tp_needs_sp"} <= codes
    with pytest.raises(IllegalLayout) as exc:
        validate(Q, W, lay)
    msg = str(exc.value)
    assert "num_attention_heads 32 is not a multiple of TP 3" in msg and "nearest legal layout" in msg
    near = exc.value.nearest
    assert near is not None and violations(Q, W, near) == []


def test_rules_that_depend_on_options():
    assert "shared_overlap_alltoall" in {v.code for v in violations(Q, W, seed_layout(dispatcher="allgather", moe_shared_expert_overlap=True))}
    assert "recompute_layers" in {v.code for v in violations(Q, W, seed_layout(recompute=Recompute.parse("full:uniform:13")))}
    assert "row_fits_tokens" in {v.code for v in violations(Q, W, seed_layout(max_tokens_per_gpu=4096))}
    assert "interleaved_microbatches" in {v.code for v in violations(Q, Workload(global_batch=24), seed_layout(vpp=2))}
    dense = load_model("Llama-3.1-70B")
    assert "dense_no_ep" in {v.code for v in violations(dense, W, Layout.parse("TP8 PP1 EP2", world=8))}


def test_table_round_trip():
    lays = [seed_layout(), seed_layout(dispatcher="flex"), Layout(world=32, tp=2, pp=2, vpp=3, ep=4, etp=2,
            recompute=Recompute.parse("selective:core_attn,moe_act"), micro_batch_size=2)]
    t = LayoutTable.from_layouts(lays)
    assert [t.row(i) for i in range(3)] == lays
    assert list(t.dp) == [8, 8, 8]


def test_slime_args_round_trip_from_seed_run_block():
    run = """python3 train_async.py --actor-num-nodes 4 --actor-num-gpus-per-node 8 \\
      --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --context-parallel-size 1 \\
      --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 --sequence-parallel \\
      --recompute-granularity full --recompute-method uniform --recompute-num-layers 2 \\
      --use-dynamic-batch-size --max-tokens-per-gpu 8192 --use-distributed-optimizer \\
      --use-precision-aware-optimizer --cross-entropy-loss-fusion --cross-entropy-fusion-impl te \\
      --moe-token-dispatcher-type alltoall --moe-token-dispatcher-type flex"""
    lay = layout_from_args(run)
    assert lay == seed_layout(dispatcher="flex")
    assert layout_from_args(format_args(layout_args(lay)), world=32) == lay
    meg = format_args(layout_args(lay, "megatron"))
    assert "--micro-batch-size" in meg and meg[meg.index("--moe-token-dispatcher-type") + 1] == "flex"


def test_recompute_parse_errors():
    assert str(Recompute.parse("full:block:4")) == "full:block:4"
    for bad in ("full", "full:uniform", "full:sideways:2", "partial"):
        with pytest.raises(BadInput):
            Recompute.parse(bad)
