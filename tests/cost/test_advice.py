"""The bottleneck and to-fit advice offers only settings not already in effect (cost/advice.py)."""

from autotune.catalog import Workload
from autotune.cost.advice import LEVER_OPTIONS, MEMORY_LEVER_OPTIONS, levers, memory_lever
from autotune.layout import Layout, Recompute

EP_HEAVY = {"ep_comm": 6.0, "compute_experts": 3.0, "imbalance": 1.0}  # ep_comm 60% of a 10 s step


def test_ep_comm_lever_drops_what_the_layout_already_does():
    plain = Layout(world=64, ep=32, pp=2)
    done = plain.with_(ep_overlap=True, dispatcher="hybridep")
    said = levers(EP_HEAVY, 10.0, plain, Workload())[0]
    assert said["term"] == "ep_comm" and said["share"] == 0.6
    assert "--ep-overlap" in said["lever"] and "hybridep" in said["lever"]
    left = levers(EP_HEAVY, 10.0, done, Workload())[0]["lever"]
    assert "--ep-overlap" not in left and "hybridep" not in left and "smaller EP" in left
    # without a layout every option is said: here the same as for the plain layout, which has none of them on
    assert levers(EP_HEAVY, 10.0)[0]["lever"] == said["lever"]


def test_imbalance_lever_offers_aux_loss_only_to_natural_routing():
    parts = {"imbalance": 5.0, "compute_experts": 5.0}
    lay = Layout(world=64, ep=16)
    assert "aux-loss" in levers(parts, 10.0, lay, Workload())[0]["lever"]
    for wl in (Workload(load_balancing_loss=True), Workload(force_balance=True)):
        assert "aux-loss" not in levers(parts, 10.0, lay, wl)[0]["lever"]


def test_tp_comm_and_cuda_graph_levers_follow_the_settings():
    parts = {"tp_comm": 3.0, "host_bound": 3.0, "compute_dense": 4.0}
    lay = Layout(world=8, tp=4)
    said = {d["term"]: d["lever"] for d in levers(parts, 10.0, lay, Workload())}
    assert "--tp-comm-overlap" in said["tp_comm"] and "--cuda-graphs" in said["host_bound"]
    said = {d["term"]: d["lever"] for d in levers(parts, 10.0, lay.with_(tp_comm_overlap=True, cuda_graphs="full"),
                                                  Workload())}
    assert "--tp-comm-overlap" not in said["tp_comm"] and "smaller TP" in said["tp_comm"]
    assert "--cuda-graphs" not in said["host_bound"] and "longer kernels" in said["host_bound"]


def test_memory_lever_skips_recompute_already_full_and_offload_already_whole():
    stage = {"activations": 50, "optimizer": 10, "weights": 5}
    lay = Layout(world=8)
    assert "--recompute" in memory_lever(stage, lay, Workload())["lever"]
    full = lay.with_(recompute=Recompute(granularity="full", method="uniform", num_layers=1))
    said = memory_lever(stage, full, Workload())
    assert said["term"] == "activations" and said["bytes"] == 50 and "--recompute" not in said["lever"]
    opt = {"optimizer": 50, "activations": 10}
    assert "--optimizer-offload" in memory_lever(opt, lay, Workload())["lever"]
    whole = memory_lever(opt, lay.with_(optimizer_offload=1.0), Workload())["lever"]
    assert "--optimizer-offload" not in whole and "distributed optimizer" not in whole and "more DP" in whole


def test_every_term_keeps_an_option_whatever_is_set():
    """Each term has at least one option with no condition, so a lever is never empty."""
    for table in (LEVER_OPTIONS, MEMORY_LEVER_OPTIONS):
        for term, options in table.items():
            assert any(cond is None for _, cond in options), term
