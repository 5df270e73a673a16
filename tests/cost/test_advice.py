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
    """Whatever the layout turns on and wherever it runs, every term still says something (a lever is never empty)."""
    from autotune.catalog import ClusterSpec

    plain = Layout(world=64, ep=8)
    everything = plain.with_(ep_overlap=True, dispatcher="hybridep", tp_comm_overlap=True, cuda_graphs="full",
                             optimizer_offload=1.0, fsdp=True, vpp=1,
                             recompute=Recompute(granularity="full", method="uniform", num_layers=1))
    for lay in (plain, everything, plain.with_(ep=64)):
        for wl in (Workload(), Workload(load_balancing_loss=True)):
            for cl in (None, ClusterSpec.of("H100", 64), ClusterSpec.of("GB200", 72)):
                for term in LEVER_OPTIONS:
                    assert levers({term: 1.0}, 1.0, lay, wl, cl)[0]["lever"], (term, lay.label(True), cl)
                for term in MEMORY_LEVER_OPTIONS:
                    assert memory_lever({term: 1}, lay, wl, cl)["lever"], (term, lay.label(True), cl)


def test_ep_comm_lever_knows_where_the_expert_group_sits():
    """On a known cluster the network advice is said only to an EP group that leaves its NVLink domain: EP8 on 8-GPU
    H100 nodes stays inside one (ep_comm is NVLink traffic there), EP32 spans four; a 72-GPU NVL72 domain holds EP32."""
    from autotune.catalog import ClusterSpec

    h100 = ClusterSpec.of("H100", 64)
    inside = levers(EP_HEAVY, 10.0, Layout(world=64, ep=8), Workload(), h100)[0]["lever"]
    assert "stays off the network" not in inside and "once per node" not in inside
    assert "its own GPU" in inside and "--ep-overlap" in inside
    across = levers(EP_HEAVY, 10.0, Layout(world=64, ep=32, pp=2), Workload(), h100)[0]["lever"]
    assert "stays off the network" in across and "once per node" in across and "its own GPU" not in across
    rack = levers(EP_HEAVY, 10.0, Layout(world=72, ep=32), Workload(), ClusterSpec.of("GB200", 72))[0]["lever"]
    assert "stays off the network" not in rack and "its own GPU" in rack
    # without the cluster, the layout's settings still decide and the cluster-only wording is not said
    blind = levers(EP_HEAVY, 10.0, Layout(world=64, ep=8), Workload())[0]["lever"]
    assert "stays off the network" in blind and "its own GPU" not in blind
