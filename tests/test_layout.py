"""Layout: labels, derived degrees, Megatron's rules with the nearest legal alternative, arguments."""

import dataclasses

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
    # run together or joined as a recipe's name writes them; VPP / ETP are not read as PP / TP
    for text in ("TP2PP2VPP3CP2EP4ETP2", "tp2-pp2-vpp3-cp2-ep4-etp2", "TP2_PP2 VPP3,CP2 EP4ETP2",
                 "TP=2 PP=2 VPP=3 CP=2 EP=4 ETP=2", "tp: 2, pp: 2, vpp: 3, cp: 2, ep: 4, etp: 2",
                 "TP 2 PP 2 VPP 3 CP 2 EP 4 ETP 2"):
        assert Layout.parse(text, world=64) == odd, text


@pytest.mark.parametrize("bad", ["TP1 PP4 XX8", "TP0 PP4", "TP1 TP2", "PP4", "TP1PP4XX", "TP1 PP4 DP8 TP1PP2",
                                 "TP=", "TP 2 4", "TP=2.5 PP4", "TP = -2"])
def test_bad_labels(bad):
    with pytest.raises(BadInput):
        Layout.parse(bad)


def test_a_degree_given_twice_names_both():
    with pytest.raises(BadInput, match=r"TP given twice \(TP1 and TP2\); give each degree once"):
        Layout.parse("TP1PP4 EP8 TP2 DP8")


def test_a_count_below_one_gpu_is_refused_before_any_dp_is_suggested():
    with pytest.raises(BadInput, match=r"the GPU count -4 must be at least 1"):  # not 'use DP-1'
        Layout.parse("TP1 PP4 EP8 DP8", world=-4)


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


def test_a_world_tp_pp_cp_do_not_divide_is_named_once_without_a_dp_of_0():
    """TP x PP x CP that does not divide the GPUs leaves no DP: the error says so (world_mp), not again as a global
    batch that 'does not divide over DP 0', and the layout is not labelled DP0."""
    lay = Layout.parse("TP3 PP1 EP8", world=16)
    codes = {v.code for v in violations(Q, W, lay)}
    assert "world_mp" in codes and "dp_batch" not in codes
    assert "DP" not in lay.label() and lay.label().startswith("TP3 PP1")
    with pytest.raises(IllegalLayout) as exc:
        validate(Q, W, lay)
    assert "DP 0" not in str(exc.value) and "DP0" not in str(exc.value)

def test_rules_that_depend_on_options():
    assert "shared_overlap_alltoall" in {v.code for v in violations(Q, W, seed_layout(dispatcher="allgather", moe_shared_expert_overlap=True))}
    assert "recompute_layers" in {v.code for v in violations(Q, W, seed_layout(recompute=Recompute.parse("full:uniform:13")))}
    assert "row_fits_tokens" in {v.code for v in violations(Q, W, seed_layout(max_tokens_per_gpu=4096))}
    # a token cap holding more rows than a DP rank gets is named with the most it may be; a global batch that
    # does not divide over DP is named once, by its own rule, not again as a cap over "0 rows"
    over = {v.code: v.message for v in violations(Q, Workload(global_batch=8), seed_layout(max_tokens_per_gpu=16384))}
    assert "tokens_within_rows" in over and "use at most 8,192" in over["tokens_within_rows"]
    short = {v.code for v in violations(Q, Workload(global_batch=4), seed_layout())}
    assert "dp_batch" in short and "tokens_within_rows" not in short


@pytest.mark.parametrize("dispatcher", ["allgather", "flex", "hybridep"])
def test_a_dense_model_refuses_a_token_dispatcher_with_its_own_reason(dispatcher):
    """A dense model has nothing to dispatch: the error names that and the way out, not an MoE rule (TP x EP)
    with a 'nearest legal layout' that changes the degrees."""
    dense = load_model("Llama-3.1-70B")
    lay = Layout.parse("TP1 PP4 DP8", world=32, dispatcher=dispatcher)
    assert {v.code for v in violations(dense, W, lay)} == {"dense_no_dispatcher"}
    with pytest.raises(IllegalLayout) as exc:
        validate(dense, W, lay)
    msg = str(exc.value)
    assert f"the {dispatcher} token dispatcher has nothing to dispatch" in msg and "--dispatcher" in msg
    assert "nearest legal layout" not in msg and "no legal layout is near" not in msg
    assert violations(dense, W, Layout.parse("TP1 PP4 DP8", world=32)) == []
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


# --- uneven pipeline splits ----------------------------------------------------------------------------
def test_94_layers_over_pp8_vpp4_are_legal_the_way_megatron_makes_them():
    from autotune.layout.splits import legal_splits, megatron_split, split_flags

    m = load_model("Qwen3-235B-A22B")
    w = Workload(seq_len=4096, global_batch=1024)
    even = Layout(world=256, tp=2, pp=8, vpp=4, ep=32, micro_batch_size=1)
    assert any(v.code == "layers_pp" and "--layer-split auto" in v.message and "2,3x30,2" in v.message
               for v in violations(m, w, even))
    split = megatron_split(94, 8, 4, embedding=True, loss=True)  # 96 slots / 32 virtual stages
    assert split[0] == 2 and split[-1] == 2 and set(split[1:-1]) == {3} and sum(split) == 94
    assert split in legal_splits(94, 8, 4) and split_flags(split, 94, 8, 4) == {"embedding": True, "loss": True}
    lay = even.with_(layer_split=split)
    assert not violations(m, w, lay)
    args = format_args(layout_args(lay, "megatron"))
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    with pytest.raises(BadInput, match="needs the model's layer count"):
        layout_from_args(args, world=256)
    assert layout_from_args(args, world=256, num_layers=94).layer_split == split
    assert LayoutTable.from_layouts([lay, even]).row(0) == lay


def test_first_last_and_explicit_layouts_round_trip_through_arguments():
    from autotune.layout.splits import megatron_split

    fl = megatron_split(61, 4, 1, first=13)  # the other 48 evenly over the 3 later stages
    assert fl == (13, 16, 16, 16) and megatron_split(61, 4, 1, first=13, last=16) == fl
    with pytest.raises(BadInput, match="middle stage"):
        megatron_split(61, 4, 2, first=13)  # first must be a multiple of VPP
    short = tuple([4] * 15 + [1])  # every stage full, the last one short: --decoder-last-pipeline-num-layers 1
    args = format_args(layout_args(Layout(world=128, pp=16, micro_batch_size=1, layer_split=short), "megatron"))
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "1"
    odd = (1, 3, 3, 1)  # stage 0 holds chunks of 1 and 3: no flag builds it, the pipeline layout string does
    args = format_args(layout_args(Layout(world=8, pp=2, vpp=2, micro_batch_size=1, layer_split=odd), "megatron"))
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et|ttt|ttt|tL"
    # the layout string's four stages over PP 2 say VPP 2: Megatron refuses --num-virtual-stages-per-pipeline-rank
    # beside it, and the reading takes VPP from the string
    assert "--num-virtual-stages-per-pipeline-rank" not in args
    assert layout_from_args(args, world=8).layer_split == odd and layout_from_args(args, world=8).vpp == 2
    even = format_args(layout_args(Layout(world=8, pp=2, vpp=2, micro_batch_size=1), "megatron"))
    assert even[even.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"  # no layout string: the flag says it
    flags = format_args(layout_args(Layout(world=64, pp=4, micro_batch_size=1, layer_split=fl), "megatron"))
    assert layout_from_args(flags, world=64, num_layers=61).layer_split == fl
    with pytest.raises(BadInput, match="non-negative layer counts"):
        Layout(world=8, pp=2, layer_split=(4, 4, 4))
    with pytest.raises(BadInput, match=r"layer split 1,2x46,1 \(48 stages\): give PP x VPP = 4 "):
        Layout(world=8, pp=4, layer_split=(1,) + (2,) * 46 + (1,))  # a long split named the way it was written


def test_a_split_of_equal_stages_is_the_even_split():
    """`--layer-split 12x4` on 48 layers over PP 4 is what Megatron does with no split flag: the same layout
    (label, key, arguments), not an "uneven" one."""
    even = Layout(world=32, pp=4, ep=8, max_tokens_per_gpu=8192)
    written = even.with_(layer_split=(12, 12, 12, 12))
    assert written == even and written.layer_split == ()
    assert format_args(layout_args(written, "megatron")) == format_args(layout_args(even, "megatron"))


def test_the_cost_model_follows_the_split():
    from autotune.catalog import ClusterSpec
    from autotune.cost import evaluate
    from autotune.cost.calibrate import Calibration

    m = load_model("Llama-3.1-405B")
    w = Workload(seq_len=8192, global_batch=512)
    c = ClusterSpec.of("H100", 1024)
    base = Layout(world=1024, tp=8, pp=8, vpp=2, micro_batch_size=1, recompute=Recompute.parse("full:uniform:1"))
    emb = base.with_(layer_split=(7,) + (8,) * 14 + (7,))  # 126 + embedding + loss = 128 slots
    front = base.with_(layer_split=(9,) + (8,) * 13 + (7, 6))  # same layers, the first stage heavier
    ev = evaluate(m, w, c, LayoutTable.from_layouts([emb, front]), Calibration("H100"))
    mem = ev.memory.terms["weights"]
    assert mem[1, 0] > mem[0, 0]  # 9 + 8 layers on stage 0 against 7 + 8
    assert ev.time.step_time[1] > ev.time.step_time[0]  # the slowest stage paces the pipeline


def test_the_overlap_graph_drop_and_offload_settings_round_trip_through_megatron_arguments():
    from autotune.layout import format_args, layout_args, layout_from_args

    lays = [Layout(world=32, tp=2, pp=2, vpp=2, ep=8, ep_overlap=True, tp_comm_overlap=True, cuda_graphs="attn"),
            Layout(world=32, ep=8, cuda_graphs="full", moe_capacity_factor=1.25, micro_batch_size=2),
            Layout(world=32, tp=2, ep=8, cuda_graphs="router", activation_offload_layers=4, micro_batch_size=1)]
    for lay in lays:
        argv = format_args(layout_args(lay, "megatron", 8192, moe=True))
        back = layout_from_args(argv, world=32)
        for f in ("ep_overlap", "tp_comm_overlap", "cuda_graphs", "moe_capacity_factor", "activation_offload_layers"):
            assert getattr(back, f) == getattr(lay, f), (f, argv)
    assert "--tp-comm-overlap" not in format_args(layout_args(Layout(world=8, tp_comm_overlap=True)))  # TP 1


def test_settings_label_tells_layouts_of_one_label_apart():
    from autotune.layout.describe import full_label, settings_label

    a = Layout(world=32, tp=2, pp=4, ep=8, recompute=Recompute.parse("full:block:2"), max_tokens_per_gpu=8192)
    b = dataclasses.replace(a, moe_shared_expert_overlap=True, optimizer_offload=0.5)
    assert a.label() == b.label() and settings_label(a) != settings_label(b)
    assert settings_label(a) == "full:block:2, alltoall, max 8,192 tokens/GPU"
    assert settings_label(b).endswith("moe shared expert overlap, optimizer offload 0.5")
    assert settings_label(dataclasses.replace(a, distributed_optimizer=False)).endswith("no distributed optimizer")
    assert full_label(Layout(world=8), moe=False) == "TP1 PP1 DP8 [no recompute]"


def test_precision_switches_round_trip_for_every_precision_and_class():
    """One table gives Megatron's precision flags to the recipe export and the configuration gate: a workload
    precision reads back as itself, a recipe's class as Megatron's default recipe for it, FP8 and FP4 train in BF16
    around their GEMMs, and an unknown precision is a one-line error naming the choices once each."""
    from autotune.catalog import PRECISIONS, precision_of_class, recipe_precision
    from autotune.errors import BadInput
    from autotune.layout.args import precision_from_args, precision_switches

    for p in PRECISIONS:
        flags = dict(precision_switches(p))
        assert "--bf16" in flags and precision_from_args(flags)[0] == p
        cls = recipe_precision(p)
        assert precision_from_args(dict(precision_switches(cls)))[0] == precision_of_class(cls)
    assert dict(precision_switches("fp8-tensorwise", fp8_param_gather=True))["--fp8-recipe"] == "tensorwise"
    assert "--fp8-param-gather" in dict(precision_switches("fp8-tensorwise", fp8_param_gather=True))
    assert precision_switches("fp16") == [("--fp16", None)] and precision_switches("fp32") == []
    with pytest.raises(BadInput) as err:
        precision_switches("int8")
    assert str(err.value).count("bf16") == 1 and "mxfp8" in str(err.value)


def test_split_text_folds_runs_and_reads_back():
    from autotune.layout.splits import parse_split, split_text

    assert split_text(()) == "even" and parse_split("even") == ()
    assert split_text((2, 3, 3, 3, 2)) == "2,3x3,2" and split_text((3, 3, 2)) == "3,3,2"
    for sp in ((2,) + (3,) * 30 + (2,), (1, 2, 2, 1), (5,), (0, 4, 4, 0)):
        assert parse_split(split_text(sp)) == sp
    assert parse_split("2,3,3,2") == (2, 3, 3, 2)
    for bad in ("2,x3", "a", "2,-1", "3x"):
        with pytest.raises(BadInput):
            parse_split(bad)


def test_megatron_start_up_refusals_are_rules_over_the_table():
    """Combinations Megatron-LM 1dcf0daf refuses at start-up are illegal layouts, row by row over a LayoutTable
    (the space's path) as for one layout (estimate's): optimizer offload without the precision-aware optimizer
    (arguments.py:1188), with --fp8-param-gather outside delayed scaling (1193), router graphs on a dense model
    (transformer_config.py:1777), full recompute beside partial graphs (1805), selective recompute of moe beside
    graphs of the router (1813), ETP > 1 for experts with biases (1614), a token cap whose rows do not divide a DP
    rank's (num_microbatches_calculator.py:340)."""
    from autotune.layout import legal_mask

    q30, dense, oss = load_model("Qwen3-30B-A3B"), load_model("Llama-3.1-8B"), load_model("gpt-oss-20b")
    w = Workload(seq_len=8192, global_batch=128)
    full, moe_rc = Recompute.parse("full:uniform:1"), Recompute.parse("selective:layernorm,moe")
    cases = [  # (model, workload, legal layout, the same with one setting Megatron refuses, rule)
        (dense, w, Layout(world=16, tp=2, pp=2, optimizer_offload=0.5, precision_aware_optimizer=True,
                          max_tokens_per_gpu=8192),
         dict(precision_aware_optimizer=False), "offload_precision_aware"),
        (dense, Workload(precision="fp8-delayed", fp8_param_gather=True), Layout(
            world=16, tp=2, pp=2, optimizer_offload=0.5, precision_aware_optimizer=True, max_tokens_per_gpu=8192),
         None, None),
        (dense, w, Layout(world=16, tp=2, pp=2, cuda_graphs="attn", max_tokens_per_gpu=8192),
         dict(cuda_graphs="router"), "graphs_router_dense"),
        (dense, w, Layout(world=16, tp=2, pp=2, cuda_graphs="full", recompute=full, max_tokens_per_gpu=8192),
         dict(cuda_graphs="attn"), "graphs_full_recompute"),
        (q30, w, Layout(world=16, tp=2, pp=2, vpp=2, ep=4, cuda_graphs="router", max_tokens_per_gpu=8192),
         dict(recompute=full), "graphs_full_recompute"),
        (q30, w, Layout(world=16, tp=2, pp=2, vpp=2, ep=4, recompute=moe_rc, max_tokens_per_gpu=8192),
         dict(cuda_graphs="router"), "graphs_router_moe_recompute"),
        (q30, w, Layout(world=16, tp=2, pp=2, vpp=2, ep=4, recompute=moe_rc, max_tokens_per_gpu=8192),
         dict(cuda_graphs="attn"), "graphs_router_moe_recompute"),  # an MoE model's attn graphs capture the router
        (oss, w, Layout(world=16, tp=2, pp=2, max_tokens_per_gpu=8192), dict(etp=2), "expert_bias_etp"),
        (q30, w, Layout(world=16, ep=8, max_tokens_per_gpu=65536), dict(max_tokens_per_gpu=65537 + 8192),
         "tokens_within_rows"),
        # 3 rows per micro-batch over a DP rank's 8: slime packs 3, 3, 2 (the Megatron export takes 2 rows)
        (q30, w, Layout(world=16, ep=8, max_tokens_per_gpu=24576), None, None),
    ]
    for m, wl, ok, change, code in cases:
        assert violations(m, wl, ok) == [], (m.name, ok)
        if change is None:
            continue
        bad_lay = ok.with_(**change)
        assert [v.code for v in violations(m, wl, bad_lay)] == [code], (code, violations(m, wl, bad_lay))
        assert list(legal_mask(m, wl, LayoutTable.from_layouts([ok, bad_lay, ok]))) == [True, False, True]
    tensorwise = Workload(precision="fp8-tensorwise", fp8_param_gather=True)
    lay = Layout(world=16, tp=2, pp=2, optimizer_offload=0.5, precision_aware_optimizer=True, max_tokens_per_gpu=8192)
    assert [v.code for v in violations(dense, tensorwise, lay)] == ["offload_fp8_param_gather"]
    assert violations(dense, tensorwise, lay.with_(optimizer_offload=0.0)) == []
    assert oss.bias_linear and not q30.bias_linear and not dense.bias_linear


def test_a_qkv_bias_alone_keeps_the_other_linears_bias_free():
    """Megatron's add_bias_linear is on unless --disable-bias-linear: a model with a QKV bias only (Qwen2) needs
    both flags, or every linear (and an MoE model's experts, at ETP 1 only) would grow a bias."""
    import dataclasses

    from autotune.launch import slime_model_args

    qwen2ish = dataclasses.replace(load_model("Llama-3.1-8B"), attention_bias=True)
    args = slime_model_args(qwen2ish)
    assert "--disable-bias-linear" in args and "--add-qkv-bias" in args and not qwen2ish.bias_linear
    oss = slime_model_args(load_model("gpt-oss-20b"))
    assert "--add-qkv-bias" in oss and "--disable-bias-linear" not in oss


def test_a_first_or_last_stage_count_leaving_middle_stages_empty_is_not_megatrons_flags():
    """(0, 61) over PP 2: --decoder-last-pipeline-num-layers 61 leaves Megatron a middle stage with no layers, which
    it refuses; the split is written as the pipeline layout instead (the embedding alone on the first stage)."""
    from autotune.layout.args import split_args
    from autotune.layout.splits import megatron_split, parse_split, split_config, split_flags

    with pytest.raises(BadInput):
        megatron_split(61, 2, 1, last=61)
    assert split_flags((0, 61), 61, 2, 1) is None
    assert split_config((0, 61), 61, 2, 1) == {"pipeline_model_parallel_layout": "E|" + "t" * 61 + "L"}
    flags = dict(split_args(Layout(world=2, pp=2, layer_split=(0, 61))))
    assert set(flags) == {"--pipeline-model-parallel-layout"}
    with pytest.raises(BadInput):
        parse_split("1x2000000000")  # refused before a list that size is built


def test_megatron_pipeline_layout_strings_are_read_as_megatron_reads_them():
    """--pipeline-model-parallel-layout's grammar (megatron-core PipelineParallelLayerLayout): '|' between virtual
    stages, commas cosmetic, 'x*N' and '(...)*N' repeats (groups may nest), 'm' MTP layers after the decoder layers.
    DeepSeek-V3's layouts from Megatron's docs and the MoE model zoo place 61 decoder layers and one MTP layer."""
    import re

    from autotune.layout.splits import parse_pipeline_layout, pipeline_layout_text

    stages, mtp = parse_pipeline_layout("Et*4|(tttt|)*14tmL")
    assert stages == (4,) + (4,) * 14 + (1,) and sum(stages) == 61 and mtp == 1
    stages, mtp = parse_pipeline_layout("Et*3|(tt|)*29,m|L")  # PP16 x VPP2: MTP and loss on stages of their own
    assert len(stages) == 32 and stages[:2] == (3, 2) and stages[-2:] == (0, 0) and sum(stages) == 61 and mtp == 1
    assert parse_pipeline_layout("Et|((tt|)*2)*3tL")[0] == (1, 2, 2, 2, 2, 2, 2, 1)  # nested groups
    assert parse_pipeline_layout("E t*2 | t*3 L") == ((2, 3), 0)  # spaces as cosmetic as commas
    # what the layout writes, it reads back (the export's string for an odd split)
    assert parse_pipeline_layout(pipeline_layout_text((1, 3, 3, 1)))[0] == (1, 3, 3, 1)
    for bad, why in [("tEL", "embedding 'E' must appear once"), ("Et|Lt", "loss 'L' must appear once"),
                     ("EtmtL", "MTP layers 'm' come after"), ("Ex|L", "unknown letter"), ("Et*|L", "a repeat"),
                     ("E(tt|L", "a repeat"), ("", "empty"), ("E(t|)*99999999999L", "unrolls to more than"),
                     ("E" + "(t|)*1" * 5000 + "L", "stages, more than 4,096")]:
        with pytest.raises(BadInput, match=re.escape(why)):
            parse_pipeline_layout(bad)
    # a run block's layout string with groups is read (it was refused before), its stage count setting VPP
    lay = layout_from_args(["--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout",
                            "Et*4|(tttt|)*14tmL"], world=256)
    assert lay.vpp == 4 and lay.layer_split == (4,) * 15 + (1,)
    with pytest.raises(BadInput, match=r"16 stages on PP 4 x VPP 2"):  # Megatron takes VPP from the string
        layout_from_args(["--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2",
                          "--pipeline-model-parallel-layout", "Et*4|(tttt|)*14tmL"], world=256)


def test_a_batch_that_does_not_divide_over_dp_names_the_nearest_multiple():
    """The rule's message gives the way out: the nearest multiple of DP above the batch; with that batch the layout
    is legal, and no 'nearest layout' is offered in place of the batch the message already names."""
    lay = Layout.parse("TP1 PP4 EP2", world=24)  # DP 6
    [v] = [v for v in violations(Q, W, lay) if v.code == "dp_batch"]
    assert "global batch 128 rows does not divide over DP 6 (use --global-batch 132, the nearest multiple of 6" in v.message
    assert violations(Q, Workload(global_batch=132), lay) == []


def test_estimate_takes_a_default_batch_the_layouts_dp_divides_and_says_so(capsys):
    """`estimate` with no --global-batch on a layout whose DP the default 128 rows do not divide: the nearest multiple
    of DP, with a note; --global-batch 128 given stays an error naming that multiple."""
    import json

    from autotune.cli.main import main

    args = ["estimate", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "24", "--layout", "TP2 PP2"]
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["global_batch"] == 132
    assert any(n.startswith("--global-batch 132 by default: the default 128 rows do not divide over DP 6")
               for n in out["notes"])
    assert main([*args, "--global-batch", "128"]) == 2
    assert "use --global-batch 132" in capsys.readouterr().err
