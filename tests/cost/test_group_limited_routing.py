"""Group-limited routing (DeepSeek-V3's n_group 8 / topk_group 4: a token's 8 experts come from 4 of 8 groups of 32
consecutive experts; Megatron's --moe-router-num-groups / --moe-router-group-topk, kept under forced balance) puts a
token's experts in fewer NVLink domains, so the flex dispatcher, which sends a token once to each remote domain
holding one of its experts, moves fewer bytes over the network."""

from dataclasses import replace
from math import comb

import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.catalog.model import from_hf_config
from autotune.cost import TimeCoefficients, estimate_time
from autotune.cost._comm import routing_spread
from autotune.errors import ConfigError
from autotune.layout import Layout, LayoutTable, Recompute

C = TimeCoefficients()


def test_the_catalog_reads_the_group_limit():
    dsv3 = load_model("DeepSeek-V3").moe
    assert (dsv3.router_groups, dsv3.router_group_topk, dsv3.group_limited) == (8, 4, True)
    assert not load_model("Kimi-K2-Instruct").moe.group_limited  # n_group 1: one group, no limit
    assert not load_model("Qwen3-30B-A3B").moe.group_limited  # no n_group at all


@pytest.mark.parametrize("ep, domains", [
    (64, 8 * (1 - comb(7, 4) / comb(8, 4))),  # 8 nodes, one group each: the token's 4 groups are 4 nodes
    (32, 4 * (1 - comb(6, 4) / comb(8, 4))),  # 4 nodes, two groups each: 22 / 7
    (8, 1.0),  # one node
    (256, 4 * 4 * (1 - (3 / 4) ** 2)),  # 32 nodes, a group spans 4: its 2 experts fall on 1.75 of them
])
def test_a_token_reaches_the_domains_its_groups_span(ep, domains):
    groups = routing_spread(256, 8, 8, 4, ep, 8)[1]
    free = routing_spread(256, 8, 1, 0, ep, 8)[1]
    assert groups == pytest.approx(domains)
    assert free == pytest.approx(max(ep // 8, 1) * (1 - (1 - 1 / max(ep // 8, 1)) ** 8))  # 8 free picks
    assert groups <= free


def test_deepseek_v3_across_nodes_sends_less_over_the_network_than_free_routing():
    model, cluster = load_model("DeepSeek-V3"), ClusterSpec.of("H100", 256)
    free = replace(model, moe=replace(model.moe, router_groups=1, router_group_topk=0))
    wl = Workload(seq_len=4096, global_batch=512, force_balance=True)
    lays = [Layout(world=256, pp=4, vpp=8, ep=64, dispatcher=d, recompute=Recompute("full", "uniform", 1))
            for d in ("flex", "alltoall")]
    t = LayoutTable.from_layouts(lays)
    limited = estimate_time(model, wl, cluster, t, C).mb_terms["ep_comm"].sum(axis=1)
    unlimited = estimate_time(free, wl, cluster, t, C).mb_terms["ep_comm"].sum(axis=1)
    assert limited[0] < 0.9 * unlimited[0]  # flex: one copy per remote node, and now fewer nodes
    assert limited[1] == pytest.approx(unlimited[1])  # NCCL's alltoall sends every routed copy: no change


def test_a_group_limit_that_does_not_split_the_experts_is_refused():
    cfg = {"model_type": "deepseek_v3", "hidden_size": 256, "num_hidden_layers": 2, "vocab_size": 1000,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512, "n_routed_experts": 12,
           "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_group": 5, "topk_group": 2}
    with pytest.raises(ConfigError, match="n_group 5"):
        from_hf_config(cfg, "test.json")


def test_estimate_says_how_it_priced_the_routing(capsys):
    """`estimate` shows (and --json gives) what the all-to-all was priced with: the hottest rank's load and the
    NVLink domains a token reaches; a dense model has no such block."""
    import json

    from autotune.cli.main import main

    argv = ["estimate", "--model", "DeepSeek-V3", "--gpu", "H100", "--count", "256", "--layout", "TP1 PP4 VPP8 EP64",
            "--layer-split", "auto", "--dispatcher", "flex", "--routing", "forced", "--global-batch", "1024",
            "--seq-len", "4096"]
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)["moe_routing"]
    assert r["hottest_rank_load"] == 1.0 and r["nvlink_domains"] == 8 and r["domains_per_token"] == pytest.approx(4.0)
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "spans 8 NVLink domains and a token goes once to each of the 4.00 it reaches" in text
    assert main(["estimate", "--model", "Llama-3.1-8B", "--gpu", "H100", "--count", "8", "--layout", "TP1 PP1",
                 "--json"]) == 0
    assert "moe_routing" not in json.loads(capsys.readouterr().out)
