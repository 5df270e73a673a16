"""Megatron FSDP in the cost model and the arguments: parameters and gradients sharded over DP."""

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import evaluate
from autotune.cost.calibrate import Calibration
from autotune.layout import Layout, LayoutTable, format_args, layout_args, layout_from_args


def test_fsdp_shards_weights_and_grads_and_pays_per_microbatch_gathers():
    m = load_model("Llama-3.1-70B")
    w = Workload(seq_len=8192, global_batch=256)
    c = ClusterSpec.of("H100", 64)
    ddp = Layout(world=64, tp=8, micro_batch_size=1)
    fsdp = ddp.with_(fsdp=True)
    ev = evaluate(m, w, c, LayoutTable.from_layouts([ddp, fsdp]), Calibration("H100"))
    wt, gr = ev.memory.terms["weights"][:, 0], ev.memory.terms["grads"][:, 0]
    assert wt[1] < 0.35 * wt[0] and gr[1] < 0.35 * gr[0]  # 1/8 shard plus two gathered layers
    assert wt[1] > wt[0] / 8  # the gathered layers in flight are not sharded
    assert ev.memory.terms["optimizer"][1, 0] == ev.memory.terms["optimizer"][0, 0]  # dist-opt already shards it
    assert ev.time.step_terms["dp_comm"][1] >= ev.time.step_terms["dp_comm"][0]
    args = format_args(layout_args(fsdp, "megatron"))
    assert "--use-megatron-fsdp" in args and "optim_grads_params" in args
    assert layout_from_args(args, world=64).fsdp


def test_estimate_takes_a_split_and_fsdp(capsys):
    from autotune.cli.main import main

    args = ["estimate", "-m", "Qwen3-235B-A22B", "-g", "H100", "-n", "256", "-l", "TP2 PP8 VPP4 EP32",
            "--seq-len", "4096", "--global-batch", "1024", "--micro-batch-size", "1", "--json"]
    assert main(args) == 2
    assert "--layer-split auto" in capsys.readouterr().err  # the rule names the way out
    assert main(args + ["--layer-split", "auto", "--fsdp"]) == 0
    out = capsys.readouterr().out
    assert "--account-for-loss-in-pipeline-split" in out and "--use-megatron-fsdp" in out
    assert main(args + ["--layer-split", "3,x"]) == 2
