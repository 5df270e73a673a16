"""gpt-oss's biased routed experts: Megatron adds fc2's bias outside the grouped GEMM (TEGroupedMLP._apply_bias)."""

from dataclasses import replace

import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import TimeCoefficients, estimate_time
from autotune.cost._terms import EXPERT_BIAS_BYTES
from autotune.layout import Layout, LayoutTable

C = TimeCoefficients()


def _mem(model, cluster, layout, wl):
    r = estimate_time(model, wl, cluster, LayoutTable.from_layouts([layout]), C)
    return r.mb_terms["memory_bound"][0]


@pytest.mark.parametrize("ep, etp", [(8, 1), (4, 2)])
def test_unfused_expert_bias_add_costs_hbm_traffic_over_every_routed_copy(ep, etp):
    gptoss = load_model("gpt-oss-120b")
    assert gptoss.moe.expert_bias
    plain = replace(gptoss, moe=replace(gptoss.moe, expert_bias=False))
    cluster = ClusterSpec.of("H100", 64)
    wl = Workload(seq_len=4096, global_batch=256)
    lay = Layout(world=64, pp=4, ep=ep, etp=etp, micro_batch_size=2)
    extra = _mem(gptoss, cluster, lay, wl) - _mem(plain, cluster, lay, wl)
    e, h = gptoss.moe, gptoss.hidden_size
    # per stage: 9 MoE layers, 2 x 4096 tokens, top-4 copies, fc2 outputs of hidden width (ETP ranks each add it)
    copies = 2 * 4096 * e.top_k * etp
    want = (gptoss.num_layers // 4) * copies * EXPERT_BIAS_BYTES * h / (cluster.gpu.hbm_gbps * 1e9)
    assert extra == pytest.approx(want, rel=1e-9)
    assert extra[0] > 0.1 * _mem(plain, cluster, lay, wl)[0]  # a sizeable share of the layer's elementwise traffic


def test_unbiased_experts_pay_nothing_extra():
    qwen = load_model("Qwen3-30B-A3B")
    assert not qwen.moe.expert_bias
    cluster = ClusterSpec.of("H100", 16)
    wl = Workload(seq_len=4096, global_batch=64)
    lay = Layout(world=16, ep=16, micro_batch_size=1)
    biased = replace(qwen, moe=replace(qwen.moe, expert_bias=True))
    assert (_mem(biased, cluster, lay, wl) > _mem(qwen, cluster, lay, wl)).all()


@pytest.mark.parametrize("ep, etp, recompute", [(8, 1, None), (4, 2, None), (8, 1, "selective:moe_act")])
def test_the_clamped_glu_moves_its_fc1_output_outside_the_fused_activation(ep, etp, recompute):
    """gpt-oss clamps both GLU halves (swiglu_limit 7) in eager PyTorch before Megatron's fused quick-GeGLU, and joins
    them with a cat (fused_bias_geglu.weighted_bias_quick_geglu_impl): CLAMP_BYTES per element of every routed copy's
    fc1 output (2 x FFN / ETP wide), and the forward's 8 again where moe_act is recomputed."""
    from autotune.cost._terms import CLAMP_BYTES
    from autotune.layout import Recompute

    gptoss = load_model("gpt-oss-120b")
    assert gptoss.moe.activation_clamp == 7.0
    plain = replace(gptoss, moe=replace(gptoss.moe, activation_clamp=0.0))
    cluster = ClusterSpec.of("H100", 64)
    wl = Workload(seq_len=4096, global_batch=256)
    rc = Recompute.parse(recompute) if recompute else Recompute()
    lay = Layout(world=64, pp=4, ep=ep, etp=etp, micro_batch_size=2, recompute=rc)
    extra = _mem(gptoss, cluster, lay, wl) - _mem(plain, cluster, lay, wl)
    e = gptoss.moe
    copies = 2 * 4096 * e.top_k * etp
    per_elem = CLAMP_BYTES + (8.0 if recompute else 0.0)
    want = (gptoss.num_layers // 4) * copies * per_elem * 2 * e.ffn_hidden_size / etp / (cluster.gpu.hbm_gbps * 1e9)
    assert extra == pytest.approx(want, rel=1e-9)


def _activations(model, cluster, layout, wl):
    from autotune.cost import estimate_memory

    return estimate_memory(model, wl, cluster, LayoutTable.from_layouts([layout])).terms["activations"][0]


@pytest.mark.parametrize("recompute, kept", [(None, True), ("selective:moe_act", False), ("selective:moe", False),
                                             ("selective:layernorm", True)])
def test_the_clamped_glu_keeps_a_second_fc1_copy_unless_its_activation_is_recomputed(recompute, kept):
    """The clamps keep their input (views of the fc1 output) and the fused quick-GeGLU the cat of the clamped halves:
    one more copy of 2 x FFN per routed copy (bench/activation_parity.py, gpt-oss-moe: measured / predicted 1.35 ->
    1.00). Recomputing moe_act (or the whole MoE layer) runs the clamps inside the checkpoint: neither copy stays."""
    from autotune.layout import Recompute

    gptoss = load_model("gpt-oss-120b")
    plain = replace(gptoss, moe=replace(gptoss.moe, activation_clamp=0.0))
    cluster = ClusterSpec.of("H100", 64)
    wl = Workload(seq_len=4096, global_batch=256)
    rc = Recompute.parse(recompute) if recompute else Recompute()
    lay = Layout(world=64, pp=4, ep=8, micro_batch_size=1, recompute=rc)
    extra = _activations(gptoss, cluster, lay, wl) - _activations(plain, cluster, lay, wl)
    if not kept:
        assert extra == pytest.approx(0.0, abs=1.0)
        return
    e = gptoss.moe
    per_layer = 4096 * e.top_k * 2 * 2 * e.ffn_hidden_size  # tokens x copies x BF16 x (gate + up)
    assert extra[0] > (gptoss.num_layers // 4) * per_layer  # the stage's layers, each micro-batch in flight at least once


def test_the_fused_grouped_mlp_clamps_inside_its_op():
    """TE's fused grouped MLP (the paged stash's, MXFP8 on Blackwell; megatron-core _make_fused_ops: limit=clamp)
    pays no clamp traffic and keeps no second copy; the same layout with partial graphs (unfused) pays both."""
    gptoss = load_model("gpt-oss-120b")
    plain = replace(gptoss, moe=replace(gptoss.moe, activation_clamp=0.0))
    cluster = ClusterSpec.of("GB200", 64)
    wl = Workload(seq_len=4096, global_batch=512, precision="mxfp8", force_balance=True)
    fused = Layout(world=64, ep=64, micro_batch_size=1, dispatcher="hybridep", cuda_graphs="full")
    unfused = Layout(world=64, ep=64, micro_batch_size=1, dispatcher="hybridep")
    for f in (_mem, _activations):
        assert f(gptoss, cluster, fused, wl) == pytest.approx(f(plain, cluster, fused, wl), rel=1e-12), f.__name__
        assert (f(gptoss, cluster, unfused, wl) > f(plain, cluster, unfused, wl) * 1.01).all(), f.__name__
