"""NeMo AutoModel's forced balance (FakeBalancedGate, noise 0: token i -> experts (k i + j) mod E) puts a token's k
experts on consecutive experts, so on one or two EP ranks; DeepEP sends a token once per rank holding one of its
experts (fused_a2a.py get_dispatch_layout's is_token_in_rank). Megatron's forced balance draws random logits."""

from dataclasses import replace

import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import TimeCoefficients, estimate_time
from autotune.cost._comm import contiguous_spread
from autotune.layout import Layout, LayoutTable, Recompute

C = TimeCoefficients()


@pytest.mark.parametrize("experts, k, ep, ranks, domains", [
    (128, 8, 8, 1.0, 1.0),  # Qwen3-30B-A3B EP8: 16 experts a rank, 8 consecutive ones never straddle two
    (256, 8, 64, 2.0, 1.0),  # DeepSeek-V3 EP64: 4 a rank, 32 a node
    (128, 6, 8, 1.25, 1.0),  # Nemotron 3 Nano EP8: 6 consecutive of 16 straddle a boundary 1 time in 4
])
def test_the_balanced_gate_reaches_few_ranks(experts, k, ep, ranks, domains):
    assert contiguous_spread(experts, k, ep, 8) == pytest.approx((ranks, domains))


def _ep_comm(model, cluster, lay, wl):
    return float(estimate_time(model, wl, cluster, LayoutTable.from_layouts([lay]), C).mb_terms["ep_comm"][0].sum())


@pytest.mark.parametrize("name, world, lay", [
    ("Qwen3-30B-A3B", 8, dict(ep=8)),
    ("DeepSeek-V3", 256, dict(pp=4, vpp=8, ep=64)),
])
def test_automodel_forced_balance_dispatches_fewer_copies_than_megatrons(name, world, lay):
    model, cluster = load_model(name), ClusterSpec.of("H100", world)
    lay = Layout(world=world, dispatcher="flex", recompute=Recompute("full", "uniform", 1), **lay)
    mega = Workload(seq_len=4096, global_batch=512, force_balance=True, framework="megatron")
    auto = replace(mega, framework="automodel")
    a, m = _ep_comm(model, cluster, lay, auto), _ep_comm(model, cluster, lay, mega)
    assert 0 < a < 0.5 * m
    # natural routing in AutoModel is its real router's: no locality assumed
    assert _ep_comm(model, cluster, lay, replace(auto, force_balance=False)) == pytest.approx(
        _ep_comm(model, cluster, lay, replace(mega, force_balance=False)))


def test_a_table_of_several_ep_sizes_prices_each_layout_as_alone():
    """The spread is looked up per EP group size over the whole table: each row gets its own size's."""
    model, cluster = load_model("Qwen3-30B-A3B"), ClusterSpec.of("H100", 64)
    wl = Workload(seq_len=4096, global_batch=512, force_balance=True, framework="automodel")
    lays = [Layout(world=64, ep=e, pp=p, dispatcher="flex") for e in (8, 16, 32, 64) for p in (1, 2)]
    together = estimate_time(model, wl, cluster, LayoutTable.from_layouts(lays), C).mb_terms["ep_comm"].sum(axis=1)
    alone = [_ep_comm(model, cluster, lay, wl) for lay in lays]
    assert together == pytest.approx(alone, rel=1e-9)
    assert len(set(round(x, 12) for x in alone)) == 4  # one value per EP size: the sizes do differ
