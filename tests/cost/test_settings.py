"""The settings published rows vary beyond the layout, in the time and memory models: EP and TP overlap, CUDA graphs,
token drop, routing, activation offload, and collectives across NVLink domains. Each test states what the physics
must do and checks it on the model's own terms (uncalibrated factors, so a fit cannot hide a wrong direction)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import TimeCoefficients, estimate_memory, estimate_time
from autotune.cost._comm import group_bw, link_bandwidths, routing_load
from autotune.layout import Layout, LayoutTable, Recompute, violations

C = TimeCoefficients()
QWEN = load_model("Qwen3-30B-A3B")
WL = Workload(seq_len=4096, global_batch=256)


def _time(lays, cluster, wl=WL, model=QWEN):
    return estimate_time(model, wl, cluster, LayoutTable.from_layouts(lays), C)


def test_ep_overlap_hides_the_all_to_all_up_to_the_compute_beside_it():
    cl = ClusterSpec.of("H100", 32)
    base = dict(world=32, pp=1, ep=16, micro_batch_size=1)
    off, on = _time([Layout(**base), Layout(**base, ep_overlap=True)], cl).step_terms["ep_comm"]
    assert on < off  # hidden behind another micro-batch's attention and experts
    r = _time([Layout(**base, ep_overlap=True)], cl)
    window = sum(r.step_terms[k][0] for k in ("compute_dense", "compute_attention", "compute_experts",
                                              "memory_bound", "quantize"))
    M = 256 // 32
    # one micro-batch of M is not overlapped; the rest is exposed at least by what exceeds its window, and what is
    # hidden still costs the SMs the all-to-all kernels take
    assert on >= off / M + max(0.0, off * (M - 1) / M - window) - 1e-9
    assert on >= C.ep_overlap_sm * off * (M - 1) / M * 0.5


def test_tp_overlap_takes_effect_only_with_tp_and_sequence_parallel():
    cl = ClusterSpec.of("H100", 8)
    llama = load_model("Llama-3.1-70B")
    lays = [Layout(world=8, tp=8, micro_batch_size=1), Layout(world=8, tp=8, micro_batch_size=1, tp_comm_overlap=True),
            Layout(world=8, tp=1, micro_batch_size=1, tp_comm_overlap=True)]
    r = _time(lays, cl, Workload(seq_len=8192, global_batch=8), llama)
    assert r.step_terms["tp_comm"][1] < r.step_terms["tp_comm"][0]
    assert not lays[2].tp_overlap and r.step_terms["tp_comm"][2] == 0


def test_a_cross_node_ep_group_pays_the_network():
    """EP 16 over two 8-GPU H100 nodes: half of each token's copies leave the node at a NIC's share; flex sends a
    token once per remote node (top-8 over 2 nodes: ~1 copy, not 4) and forwards it over NVLink."""
    cl = ClusterSpec.of("H100", 16)
    inside, across, flex = _time([Layout(world=16, ep=8, micro_batch_size=1), Layout(world=16, ep=16, micro_batch_size=1),
                                  Layout(world=16, ep=16, micro_batch_size=1, dispatcher="flex")], cl).mb_terms["ep_comm"][:, 0]
    nvl, net = link_bandwidths(cl, C)
    assert across > inside * (nvl / net) / 8  # the off-node half crawls at the NIC's share
    assert flex < across / 2


def test_flex_crosses_the_network_near_line_rate():
    """One copy per token (top-1) over 8 nodes: the same network bytes either way, NCCL's all-to-all at `net_eff`
    of the NIC, DeepEP's RDMA kernels at `flex_net`."""
    from autotune.cost._comm import a2a_time
    cl = ClusterSpec.of("B200", 64)
    nccl, flex = (float(a2a_time(4096.0, 1, 14336.0, 64, cl, C, f)) for f in (False, True))
    nvl, net = link_bandwidths(cl, C)
    off = 4096 * 14336 * (1 - 1 / 8)
    assert nccl >= off / net and flex >= off / (net * C.flex_net / C.net_eff)
    assert flex < nccl  # same bytes, the network part faster (flex's NVLink forwarding costs it a little back)


def test_dp_collectives_across_nodes_use_every_nic_of_the_node():
    cl = ClusterSpec.of("H100", 64)
    nvl, net = link_bandwidths(cl, C)
    assert group_bw(cl, 8, 1, C) == pytest.approx(nvl)  # inside one node
    assert group_bw(cl, 64, 1, C) > 4 * net  # 8 members per node share the crossing over 8 NICs
    assert group_bw(cl, 8, 8, C) == pytest.approx(net)  # one member per node: a NIC per hop


def test_token_drop_caps_each_expert_at_its_capacity():
    cl = ClusterSpec.of("H100", 16)
    t = LayoutTable.from_layouts([Layout(world=16, ep=8, micro_batch_size=1, moe_capacity_factor=f)
                                  for f in (0.0, 1.0, 1.25)])
    natural, forced = routing_load(QWEN, WL, t, _mcoef()), routing_load(QWEN, Workload(force_balance=True), t, _mcoef())
    assert natural[0] > 1.0 and forced[0] == 1.0  # the hottest rank carries more unless balancing is forced
    assert natural[1] == forced[1] == 1.0 and natural[2] == 1.25  # padded to capacity, whatever the router does
    r = _time([t.row(i) for i in range(3)], cl).step_terms
    # padding every expert to 1.25 x its even share adds a quarter of the experts' GEMMs and all-to-all; at 1.0 nothing
    assert r["imbalance"][1] == 0
    assert r["imbalance"][2] == pytest.approx(0.25 * (r["compute_experts"][2] + r["ep_comm"][2]))
    assert r["imbalance"][0] > 0  # natural routing: the hottest rank's extra tokens
    # padded capacities are known on the host: no token-count sync per MoE layer (megatron-core's drop_and_pad)
    assert r["layer_overhead"][1] == pytest.approx(r["layer_overhead"][2])
    assert r["layer_overhead"][1] < r["layer_overhead"][0]


def test_natural_imbalance_grows_with_ep_and_shrinks_with_experts_per_rank():
    t = LayoutTable.from_layouts([Layout(world=64, ep=e, micro_batch_size=1) for e in (2, 8, 32, 64)])
    load = routing_load(QWEN, WL, t, _mcoef())
    assert np.all(np.diff(load) > 0)


def test_natural_imbalance_follows_the_share_of_experts_a_token_picks():
    """An expert's share of a micro-batch fluctuates like a count of documents landing in it with probability k / E:
    cv ~ sqrt(E / k - 1). At one expert per rank, Mixtral (8 top-2) on 8 ranks runs evener than Qwen3-30B-A3B (128
    top-8) on 128 would if only the ranks' count differed; the seed's shape (256 top-8, EP 8) gives exactly the
    reference maximum."""
    from autotune.cost._comm import expected_max

    mixtral, qwen35 = load_model("Mixtral-8x7B-v0.1"), load_model("Qwen3.5-122B-A10B")
    ep8 = LayoutTable.from_layouts([Layout(world=8, ep=8, micro_batch_size=1)])
    assert routing_load(qwen35, WL, ep8, _mcoef())[0] == pytest.approx(_mcoef().imbalance_off)
    m = routing_load(mixtral, WL, ep8, _mcoef())[0] - 1.0
    q = routing_load(QWEN, WL, LayoutTable.from_layouts([Layout(world=128, ep=128, micro_batch_size=1)]),
                     _mcoef())[0] - 1.0  # one Qwen3-30B expert per rank
    z = expected_max(np.array([8.0, 128.0]))
    assert m / q == pytest.approx(np.sqrt((8 / 2 - 1) / (128 / 8 - 1)) * z[0] / z[1])
    # the constant-cv reading gave Mixtral's hottest rank sqrt(31 / 3) x this excess (2.7 x the mean load)
    assert 1.0 + m * np.sqrt((256 / 8 - 1) / (8 / 2 - 1)) == pytest.approx(
        1.0 + (_mcoef().imbalance_off - 1.0) * np.sqrt(256 / 8), rel=1e-9)


def test_host_bound_micro_batches_and_cuda_graphs():
    """One 4,096-token row per micro-batch of a 48-layer MoE on B200: the host's launches take longer than the GPU's
    work; a whole-step graph (with token drop: static shapes) removes the host from the loop."""
    cl = ClusterSpec.of("B200", 8)
    wl = Workload(seq_len=4096, global_batch=512, precision="mxfp8")
    lays = [Layout(world=8, ep=8, micro_batch_size=m, cuda_graphs=g, moe_capacity_factor=f)
            for m, g, f in ((1, "none", 0.0), (4, "none", 0.0), (1, "attn", 0.0), (1, "full", 1.0))]
    assert not violations(QWEN, wl, lays[3])
    r = _time(lays, cl, wl)
    host = r.step_terms["host_bound"]
    assert host[0] > 0 and host[1] < host[0] and host[2] < host[0] and host[3] == 0
    assert r.step_terms["layer_overhead"][3] == 0


def test_activation_offload_moves_activations_to_the_host():
    cl = ClusterSpec.of("GB200", 64)
    llama = load_model("Llama-3.1-70B")
    wl = Workload(seq_len=8192, global_batch=256, precision="fp8-tensorwise")
    lays = [Layout(world=64, micro_batch_size=2, fsdp=True, activation_offload_layers=n) for n in (0, 40)]
    t = LayoutTable.from_layouts(lays)
    mem = estimate_memory(llama, wl, cl, t)
    assert mem.terms["activations"][1, 0] < 0.6 * mem.terms["activations"][0, 0]
    r = estimate_time(llama, wl, cl, t, C, mem=mem)
    assert r.step_terms["act_offload"][1] > 0 == r.step_terms["act_offload"][0]


def test_the_settings_rules_name_megatrons_constraints():
    codes = lambda **kw: {v.code for v in violations(QWEN, WL, Layout(world=16, ep=8, **kw))}  # noqa: E731
    assert "ep_overlap_recompute" in codes(ep_overlap=True, recompute=Recompute("full", "uniform", 1))
    assert "ep_overlap_vpp" in codes(ep_overlap=True, pp=2)
    assert "ep_overlap_shared" in codes(ep_overlap=True, moe_shared_expert_overlap=True)
    assert "full_graphs_static_shapes" in codes(cuda_graphs="full")
    assert "capacity_dispatcher" in codes(moe_capacity_factor=1.0, dispatcher="flex")
    assert "offload_no_pp" in codes(activation_offload_layers=4, pp=2)
    assert not codes(ep_overlap=True, pp=2, vpp=2, cuda_graphs="attn")
    # full-iteration graphs: 0.16.1 refuses the A2A overlap beside them (token drop on alltoall), the paged stash's
    # megatron-core (HybridEP) takes the pair, as the Bridge full-iteration recipes run it
    assert "ep_overlap_graphs" in codes(ep_overlap=True, cuda_graphs="full", moe_capacity_factor=1.0)
    assert not codes(ep_overlap=True, cuda_graphs="full", dispatcher="hybridep")


def _mcoef():
    from autotune.cost import MemoryCoefficients

    return MemoryCoefficients()


def test_selective_recompute_modules_follow_megatrons_checks():
    # TransformerConfig.__post_init__ raises on these (megatron-core 0.16): the layout rules say so first
    def codes(model, wl=WL, **kw):
        return {v.code for v in violations(model, wl, Layout(world=16, ep=8 if model.is_moe else 1, **kw))}

    sel = lambda mods: Recompute("selective", modules=tuple(mods))  # noqa: E731
    llama, dsv3 = load_model("Llama-3.1-70B"), load_model("DeepSeek-V3")
    assert "recompute_moe_act" in codes(llama, recompute=sel(["layernorm", "moe_act"]))
    assert "recompute_moe" in codes(llama, recompute=sel(["moe"]))
    assert "recompute_mla_up_proj" in codes(QWEN, recompute=sel(["mla_up_proj"]))
    assert "recompute_mla_up_proj" not in codes(dsv3, recompute=sel(["mla_up_proj"]))
    assert "recompute_shared_experts_overlap" in codes(dsv3, recompute=sel(["shared_experts"]),
                                                       moe_shared_expert_overlap=True)
    delayed = dataclasses.replace(WL, precision="fp8-delayed")
    assert "recompute_fp8_delayed" in codes(QWEN, delayed, recompute=sel(["layernorm"]))
    assert not codes(QWEN, recompute=sel(["layernorm", "moe_act"])) and not codes(llama, recompute=sel(["layernorm"]))
