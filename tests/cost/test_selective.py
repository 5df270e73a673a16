"""Megatron's selective recompute costs what its modules re-run (cost/_selective.py), not core attention whatever
the modules are."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import evaluate, load_calibration
from autotune.cost._selective import module_gemm_flops
from autotune.cost._terms import microbatch_terms
from autotune.cost.memory import MemoryCoefficients
from autotune.layout import Layout, LayoutTable, SELECTIVE_MODULES
from autotune.layout.core import Recompute

RECOMPUTES = ["none", "selective", "selective:layernorm,moe_act", "selective:mlp", "selective:mla_up_proj",
              "selective:moe", "selective:moe,moe_act", "selective:core_attn,layernorm,moe_act,moe"]


def _table(label: str, recomputes=RECOMPUTES) -> LayoutTable:
    return LayoutTable.from_layouts([Layout.parse(label, recompute=Recompute.parse(r)) for r in recomputes])


def _terms(name: str, gpu: str, count: int, label: str, workload: Workload | None = None):
    model, cluster = load_model(name), ClusterSpec.of(gpu, count)
    t = _table(label)
    cal = load_calibration(gpu)
    _, deps, _ = microbatch_terms(model, workload or Workload(), cluster, t, cal.time, MemoryCoefficients())
    ev = evaluate(model, workload or Workload(), cluster, t, cal)
    shape = (len(t), int(t.pp.max()))  # a share no row has is the scalar 0: every share as (n, S)
    rc = {k: np.broadcast_to(np.asarray(v, dtype=float), shape) for k, v in deps["recompute"].items()}
    return dict(zip(RECOMPUTES, range(len(RECOMPUTES)))), rc, ev


def test_core_attention_re_runs_only_when_named_or_by_default():
    at, rc, _ = _terms("Qwen3-30B-A3B", "H100", 16, "TP1 PP1 EP16 DP16")
    att = rc["compute_attention"][:, 0]
    assert att[at["selective"]] == pytest.approx(1 / 3.5)  # Megatron's default module list is ["core_attn"]
    assert att[at["selective:core_attn,layernorm,moe_act,moe"]] == pytest.approx(1 / 3.5)
    for r in ("none", "selective:layernorm,moe_act", "selective:moe", "selective:mlp"):
        assert att[at[r]] == 0.0, r


def test_modules_that_do_not_act_on_a_model_cost_nothing():
    # Qwen3-30B-A3B: every layer is an MoE layer (no dense MLP for "mlp"), and its attention is not MLA
    at, _, ev = _terms("Qwen3-30B-A3B", "H100", 16, "TP1 PP1 EP16 DP16")
    tps, peak = ev.time.tokens_per_s_per_gpu, ev.memory.peak
    for r in ("selective:mlp", "selective:mla_up_proj"):
        assert tps[at[r]] == pytest.approx(tps[at["none"]], rel=1e-9), r
        assert peak[at[r]] == pytest.approx(peak[at["none"]], rel=1e-9), r


def test_the_moe_module_re_runs_the_whole_moe_forward():
    at, rc, ev = _terms("Qwen3-30B-A3B", "H100", 16, "TP1 PP1 EP16 DP16")
    moe, both = at["selective:moe"], at["selective:moe,moe_act"]
    assert rc["compute_experts"][moe, 0] == pytest.approx(1 / 3)  # the experts' forward: 1 of 3 GEMM passes
    # the routed experts' FFN-width traffic is written again once, also when moe_act is named beside moe
    assert rc["expert_memory"][moe, 0] == pytest.approx(1 / 3)
    assert rc["expert_memory"][both, 0] == pytest.approx(1 / 3)
    # dispatch and combine run again: 6 all-to-alls a layer instead of 4
    ep = ev.time.mb_terms["ep_comm"]
    assert ep[moe, 0] / ep[at["none"], 0] == pytest.approx(6 / 4, rel=0.02)
    tps = ev.time.tokens_per_s_per_gpu
    # dearer than the memory-bound modules, cheaper than nothing's being recomputed is free
    assert tps[moe] < tps[at["selective:layernorm,moe_act"]] < tps[at["none"]]


def test_mla_up_projections_and_dense_mlps_re_run_their_gemms():
    m = load_model("DeepSeek-V3")
    gem = module_gemm_flops(m)
    mla, mlp = SELECTIVE_MODULES.index("mla_up_proj"), SELECTIVE_MODULES.index("mlp")
    assert (gem[:, mla] > 0).all()  # every layer's attention is MLA
    dense_layers = np.array([not m.is_moe_layer(i) for i in range(m.num_layers)])
    assert dense_layers.sum() == 3 and (gem[dense_layers, mlp] > 0).all() and (gem[~dense_layers, mlp] == 0).all()
    at, rc, ev = _terms("DeepSeek-V3", "H100", 256, "TP1 PP8 EP32 DP32")
    dense = rc["compute_dense"]  # the first stage holds the 3 dense layers, the others none
    assert 0 < dense[at["selective:mlp"], 0] < 1 / 3 and (dense[at["selective:mlp"], 1:8] == 0).all()
    assert (0 < dense[at["selective:mla_up_proj"], :8]).all() and (dense[at["selective:mla_up_proj"], :8] < 1 / 3).all()
    tps = ev.time.tokens_per_s_per_gpu
    assert tps[at["selective:mla_up_proj"]] < tps[at["none"]]
    # before, any module list was charged core attention's re-run: MLA's 192-wide heads at 4k tokens cost more
    # than re-running its up projections
    assert tps[at["selective:mla_up_proj"]] > tps[at["selective"]]


def test_torchtitan_selective_is_still_per_op_sac():
    at, rc, _ = _terms("Llama-3.1-8B", "H100", 8, "TP1 PP1 DP8", Workload(framework="torchtitan"))
    assert rc["compute_attention"][at["selective"], 0] == 0.0  # SAC keeps the attention output
    assert rc["compute_dense"][at["selective"], 0] > 0.0  # and re-runs every other matmul


def test_the_moe_checkpoint_keeps_nothing_of_the_shared_experts():
    # MoELayer.forward runs under one checkpoint with moe_layer_recompute: the shared experts' activations go
    # with the routed ones, so naming shared_experts beside moe frees nothing more
    model, cluster = load_model("Qwen3.5-122B-A10B"), ClusterSpec.of("H200", 32)
    t = _table("TP1 PP4 EP8 DP8", ["none", "selective:moe", "selective:moe,shared_experts", "selective:shared_experts"])
    peak = evaluate(model, Workload(), cluster, t, load_calibration("H200")).memory.peak
    assert peak[1] == pytest.approx(peak[2], rel=1e-9) and peak[3] < peak[0] and peak[1] < peak[3]


@pytest.mark.parametrize("name,gpu,count,label", [
    ("Qwen3.5-122B-A10B", "H200", 32, "TP2 PP4 EP8 DP4"),
    ("DeepSeek-V3", "H100", 256, "TP2 PP1 EP32 DP128"),
    ("Llama-3.1-70B", "H100", 32, "TP4 PP2 DP4"),
])
def test_naming_more_modules_never_runs_faster_nor_needs_more_memory(name, gpu, count, label):
    from itertools import combinations

    from autotune.layout import violations

    model = load_model(name)
    sets = [()]
    for k in range(1, len(SELECTIVE_MODULES) + 1):
        sets += list(combinations(SELECTIVE_MODULES, k))
    legal = []
    for mods in sets:
        lay = Layout.parse(label, recompute=Recompute("selective", modules=mods) if mods else Recompute())
        if not violations(model, Workload(), lay):
            legal.append((frozenset(mods), lay))  # the empty set: no recompute
    assert len(legal) >= 8  # Llama: none plus every set of core_attn, layernorm, mlp
    ev = evaluate(model, Workload(), ClusterSpec.of(gpu, count), LayoutTable.from_layouts([l for _, l in legal]),
                  load_calibration(gpu))
    tps, peak = ev.time.tokens_per_s_per_gpu, ev.memory.peak
    for i, (a, _) in enumerate(legal):
        for j, (b, _) in enumerate(legal):
            if a < b:
                assert tps[j] <= tps[i] * (1 + 1e-9), (a, b)
                assert peak[j] <= peak[i] * (1 + 1e-9), (a, b)
