"""The throughput model: hand-computed terms on a tiny dense model, composition, factors, vectorisation, seeds."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model, padded_vocab
from autotune.cost import TimeCoefficients, estimate_time, evaluate, load_calibration
from autotune.cost.calibrate import predict, seed_measurements
from autotune.cost.time import STEP_TERMS
from autotune.layout import Layout, LayoutTable, Recompute

C = TimeCoefficients()
H100 = ClusterSpec.of("H100", 8)
PEAK = 989.4e12


WL = Workload(seq_len=1024, global_batch=8)


def _time(model, layouts, cluster=H100, workload=WL, coef=C):
    return estimate_time(model, workload, cluster, LayoutTable.from_layouts(layouts), coef)


def eff(width, rows):
    return C.gemm * width / (width + C.gemm_width) * rows / (rows + C.gemm_rows)


def test_dense_attention_and_output_terms_by_hand(tiny_dense):
    r = _time(tiny_dense, [Layout(world=8, micro_batch_size=1)])
    tokens = 1024
    # per layer: q 64x64, k and v 64x32, o 64x64, gate+up 2 x 64x128, down 128x64 -> 2 FLOPs per weight
    dense_fwd = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 64 * 128 + 128 * 64) * 4 * tokens
    assert r.mb_terms["compute_dense"][0, 0] == pytest.approx(3 * dense_fwd / (PEAK * eff(64, tokens)))
    # scores + AV: 2 x heads x 2 x head_dim per context token, causal: half the 1024-token row on average
    attn_fwd = 2 * 4 * 2 * 16 * 512 * 4 * tokens
    # head dim 16: one exp per score against 4 x 16 MMA FLOPs, so flash runs far below its d = 128 rate
    d_eff = C.attention * (1 + C.attention_exp) / (1 + C.attention_exp * 128 / 16)
    assert r.mb_terms["compute_attention"][0, 0] == pytest.approx(3.5 * attn_fwd / (PEAK * d_eff))
    v = padded_vocab(tiny_dense, 1)
    out = 3 * 2 * 64 * v * tokens / (PEAK * eff(64, tokens)) + 8 * v * tokens / (3350e9)  # GEMMs + fused loss
    assert r.mb_terms["compute_output"][0, 0] == pytest.approx(out)
    assert r.mb_terms["compute_experts"][0, 0] == 0 and r.mb_terms["ep_comm"][0, 0] == 0
    assert r.step_terms["bubble"][0] == 0  # PP 1


def test_attention_on_pytorchs_kernels_runs_at_flashattention2s_speed(tiny_dense):
    """torchtitan's SDPA (FlashAttention-2) against TE's fused attention: the attention term alone is SDPA_SLOWDOWN
    slower; nothing else moves. A workload naming a kernel autotune does not know is refused."""
    from autotune.cost._terms import SDPA_SLOWDOWN
    from autotune.errors import BadInput

    lay = [Layout(world=8, micro_batch_size=1)]
    te = _time(tiny_dense, lay)
    sdpa = _time(tiny_dense, lay, workload=replace(WL, attention_kernel="sdpa"))
    attention = te.mb_terms["compute_attention"][0, 0]
    assert sdpa.mb_terms["compute_attention"][0, 0] == pytest.approx(SDPA_SLOWDOWN * attention)
    # end to end on a real model (the tiny one's step is bound by its host launches, whatever the kernel)
    llama = load_model("Llama-3.1-8B")
    wl = Workload(seq_len=8192, global_batch=64)
    fast, slow = (_time(llama, lay, workload=replace(wl, attention_kernel=k)).tokens_per_s_per_gpu[0]
                  for k in ("te", "sdpa"))
    assert slow < 0.95 * fast
    for k in ("compute_dense", "compute_output", "memory_bound"):
        assert sdpa.mb_terms[k][0, 0] == pytest.approx(te.mb_terms[k][0, 0])
    with pytest.raises(BadInput, match="attention_kernel"):
        replace(WL, attention_kernel="flash3")


def test_published_rows_name_their_attention_kernel():
    """torchtitan rows run PyTorch's attention, NeMo AutoModel's where its kernels say TorchSDPA or FlexAttn, and
    Megatron's rows TE's."""
    from autotune.cost.calibrate import published_measurements

    kept, _ = published_measurements()
    titan = [m for m in kept if m.source.startswith("torchtitan")]
    auto = [m for m in kept if m.source.startswith("NeMo AutoModel")]
    bridge = [m for m in kept if m.source.startswith("Megatron-Bridge")]
    assert titan and all(m.attention_kernel == "sdpa" for m in titan)
    assert {m.attention_kernel for m in auto} == {"te", "sdpa"}
    # Nano's and Super's rows: kernels=TE + DeepEP + TorchSDPA; Ultra's: TE + DeepEP + torch_mm (TE's attention)
    assert all(m.attention_kernel == ("te" if "Ultra" in m.model else "sdpa") for m in auto if "Nemotron-3" in m.model)
    assert bridge and all(m.attention_kernel == "te" for m in bridge)


def test_tp_comm_by_hand(tiny_dense):
    r = _time(tiny_dense, [Layout(world=8, tp=2, micro_batch_size=1)])
    # AG + RS around attention and MLP, forward and backward: 8 x (tokens x hidden x 2 B) x (TP-1)/TP per layer
    vol = 8 * 1024 * 64 * 2 * 0.5 * 4
    assert r.mb_terms["tp_comm"][0, 0] == pytest.approx(vol / (450e9 * C.nvlink_eff))


def test_step_is_the_sum_of_its_terms_and_microbatches_multiply(tiny_dense):
    r = _time(tiny_dense, [Layout(world=8, micro_batch_size=1), Layout(world=8, pp=2, micro_batch_size=1)])
    total = sum(r.step_terms.values())
    np.testing.assert_allclose(r.step_time, total)
    M = 8 // 8  # global batch 8 over DP 8
    assert r.step_terms["compute_dense"][0] == pytest.approx(M * r.mb_terms["compute_dense"][0, 0])
    assert r.step_terms["bubble"][1] > 0 and set(r.breakdown(1)) == set(STEP_TERMS)
    assert r.tokens_per_s_per_gpu[0] == pytest.approx(1024 * 8 / r.step_time[0] / 8)


def test_factors_scale_terms_and_derived_terms_follow(tiny_dense):
    lay = [Layout(world=8, micro_batch_size=1, recompute=Recompute("full", "uniform", 1))]
    base = _time(tiny_dense, lay)
    doubled = _time(tiny_dense, lay, coef=TimeCoefficients(scale={"compute_dense": 2.0}))
    assert doubled.mb_terms["compute_dense"][0, 0] == pytest.approx(2 * base.mb_terms["compute_dense"][0, 0])
    # full recompute re-runs a forward (1/3 of fwd + bwd): its dense share doubles with the dense factor
    extra = doubled.mb_terms["recompute"][0, 0] - base.mb_terms["recompute"][0, 0]
    assert extra == pytest.approx(base.mb_terms["compute_dense"][0, 0] / 3)
    rc = _time(tiny_dense, lay, coef=TimeCoefficients(scale={"recompute": 0.5}))
    assert rc.mb_terms["recompute"][0, 0] == pytest.approx(0.5 * base.mb_terms["recompute"][0, 0])


def test_vectorised_rows_match_one_at_a_time():
    m = load_model("Qwen3.5-122B-A10B")
    cl, wl = ClusterSpec.of("H200", 64), Workload()
    lays = [Layout(world=64, pp=pp, ep=ep, recompute=Recompute("full", "uniform", n), dispatcher=d,
                   max_tokens_per_gpu=8192) for pp, ep, n, d in
            [(4, 8, 2, "alltoall"), (2, 16, 1, "flex"), (8, 4, 3, "alltoall"), (4, 32, 1, "allgather")]]
    cal = load_calibration("H200")
    together = evaluate(m, wl, cl, LayoutTable.from_layouts(lays), cal).time
    for i, lay in enumerate(lays):
        alone = evaluate(m, wl, cl, LayoutTable.from_layouts([lay]), cal).time
        assert alone.step_time[0] == pytest.approx(together.step_time[i])
        assert alone.breakdown(0) == pytest.approx(together.breakdown(i))


def test_physics_directions():
    m = load_model("Qwen3.5-122B-A10B")
    wl = Workload()
    cl = ClusterSpec.of("H200", 64)

    def t(**kw):
        return _time(m, [Layout(world=64, max_tokens_per_gpu=8192, recompute=Recompute("full", "uniform", 1), **kw)],
                     cl, wl)

    inside, across = t(pp=8, ep=8), t(pp=4, ep=16)  # EP 16 spans two nodes: the off-node share is slower
    a2a_per_layer = lambda r: r.mb_terms["ep_comm"][0, 0] / (48 / r.mb_terms["ep_comm"].shape[1])  # noqa: E731
    assert a2a_per_layer(across) > 2 * a2a_per_layer(inside)
    assert t(pp=4, ep=16, dispatcher="flex").mb_terms["ep_comm"][0, 0] < across.mb_terms["ep_comm"][0, 0]
    more_rc = _time(m, [Layout(world=64, pp=4, ep=8, max_tokens_per_gpu=8192,
                               recompute=Recompute("full", "uniform", 2))], cl, wl)
    assert more_rc.mb_terms["layer_overhead"][0, 0] < t(pp=4, ep=8).mb_terms["layer_overhead"][0, 0]


def test_each_local_experts_gemm_pays_a_fixed_cost_a_faster_gpu_cannot_shrink():
    """Qwen3-30B-A3B (128 experts of FFN 768): every GPU computes the same routed copies whatever EP is; EP 2 splits
    them over 64 local experts, EP 16 over 8. The many-expert rank is slower, more so with a fixed cost per
    expert kernel, and a B200 (2.25x an H100's peak) gains less than its peak on those small GEMMs."""
    m = load_model("Qwen3-30B-A3B")
    wl = Workload(seq_len=4096, global_batch=64)

    def experts(gpu, ep, coef=C):
        r = _time(m, [Layout(world=16, ep=ep, micro_batch_size=1)], ClusterSpec.of(gpu, 16), wl, coef)
        return r.mb_terms["compute_experts"][0, 0]
    no_fixed = replace(C, expert_gemm_s=0.0)
    assert experts("H100", 2) > experts("H100", 16)
    assert experts("H100", 2) / experts("H100", 16) > experts("H100", 2, no_fixed) / experts("H100", 16, no_fixed)
    assert experts("H100", 2) - experts("H100", 2, no_fixed) == pytest.approx(48 * 6 * C.expert_gemm_s * 64)
    assert experts("H100", 2) / experts("B200", 2) < 2250 / 989.4 * 0.95


def test_an_experts_gemms_pay_for_both_sides_not_only_the_narrowest():
    """Qwen3-30B-A3B's experts (hidden 2048, FFN 768) against the same model with a wider hidden size: the narrowest
    side (768) is the same, yet the wider one runs closer to peak (each side is an output width or a depth in one
    of the three passes). The side is 1 / (1 / hidden + (2/3) / FFN) for a GLU (fc1 is twice as wide and has 2/3
    of the FLOPs), 1 / (1 / hidden + 1 / FFN) without one, and never wider than a GEMM of its narrowest side."""
    from autotune.cost._terms import expert_side

    assert expert_side(2048, 768) == pytest.approx(1 / (1 / 2048 + 2 / 3 / 768))
    assert expert_side(2048, 768, gated=False) == pytest.approx(1 / (1 / 2048 + 1 / 768))
    assert expert_side(2048, 768) < 768 < expert_side(1e9, 768)
    m = load_model("Qwen3-30B-A3B")
    wide = replace(m, hidden_size=4096)
    wl = Workload(seq_len=4096, global_batch=64)
    lay = [Layout(world=16, ep=16, micro_batch_size=1)]
    no_fixed = replace(C, expert_gemm_s=0.0)
    per_flop = []
    for spec in (m, wide):
        r = _time(spec, lay, ClusterSpec.of("H100", 16), wl, no_fixed)
        per_flop.append(r.mb_terms["compute_experts"][0, 0] / spec.hidden_size)  # expert FLOPs scale with hidden
    assert per_flop[1] < per_flop[0]
    side = [expert_side(h, 768) for h in (2048, 4096)]
    assert per_flop[0] / per_flop[1] == pytest.approx(
        (side[1] / (side[1] + C.gemm_width)) / (side[0] / (side[0] + C.gemm_width)), rel=1e-6)


def test_a_gemm_computes_its_last_tile_whole(monkeypatch):
    """gpt-oss's hidden size 2880 is 11.25 tiles of 256: each of a dense linear's GEMMs with it as an output side
    (the data and weight gradients of h -> X, the forward and weight gradient of X -> h) computes 12, so the dense
    GEMMs cost (2 x 3072/2880 + 1) / 3 = 1.044x; its experts' 5760-wide fc1 and 2880-wide fc2 pay on both sides. A
    hidden size that tiles evenly (Qwen3-30B-A3B's 2048, its FFN 768) pays nothing. A side under 4 large tiles takes
    the tile of 128 or 256 that wastes less (384, an ETP-split FFN of 768: three of 128), a side under 128 nothing
    (the width curve prices it)."""
    import autotune.cost._terms as terms
    from autotune.cost._terms import linear_pad, tile_pad

    assert tile_pad(384) == 1.0 and tile_pad(64) == 1.0 and tile_pad(1856) == pytest.approx(2048 / 1856)
    assert tile_pad(640) == pytest.approx(1.0) and tile_pad(700) == pytest.approx(768 / 700)

    assert linear_pad(2880) == pytest.approx((2 * 3072 / 2880 + 1) / 3)
    assert linear_pad(2048) == 1.0 and linear_pad(2048, 768) == 1.0
    a, b = 3072 / 2880, 5888 / 5760
    assert linear_pad(2880, 5760) == pytest.approx((a + b + a * b) / 3)
    wl = Workload(seq_len=4096, global_batch=64)

    def mb(name, tile):
        monkeypatch.setattr(terms, "GEMM_TILE", tile)
        m = load_model(name)
        return _time(m, [Layout(world=16, ep=16, micro_batch_size=1)], ClusterSpec.of("H100", 16), wl,
                     replace(C, expert_gemm_s=0.0)).mb_terms  # the per-expert kernels' fixed cost has no tiles

    dense_pad = linear_pad(2880)
    expert_pad = (2 * linear_pad(2880, 5760) + linear_pad(2880, 2880)) / 3  # fc1 holds 2/3 of a GLU expert's FLOPs
    gptoss, whole = mb("gpt-oss-120b", 256), mb("gpt-oss-120b", 1)  # a 1-wide tile: nothing padded
    assert gptoss["compute_dense"][0, 0] / whole["compute_dense"][0, 0] == pytest.approx(dense_pad, rel=1e-9)
    assert expert_pad > 1.05
    assert gptoss["compute_experts"][0, 0] / whole["compute_experts"][0, 0] == pytest.approx(expert_pad, rel=1e-9)
    qwen, qwen_whole = mb("Qwen3-30B-A3B", 256), mb("Qwen3-30B-A3B", 1)
    assert qwen["compute_experts"][0, 0] == pytest.approx(qwen_whole["compute_experts"][0, 0], rel=1e-12)
    assert qwen["compute_dense"][0, 0] == pytest.approx(qwen_whole["compute_dense"][0, 0], rel=1e-12)


def _recipe_layouts():
    from autotune.cli.common import recipe_inputs

    root = Path(__file__).resolve().parents[2] / "recipes" / "qwen3.5-122b-a10b" / "h200"
    names = ["attune-tp1-pp4-ep8-rc2.yaml", "attune-tp1-pp4-ep8.yaml", "attune-tp1-pp4-ep8-flex.yaml"]
    if not all((root / n).exists() for n in names):
        pytest.skip("seed recipes not in this checkout")
    return [recipe_inputs(str(root / n)) for n in names]


def test_seed_measurements_are_the_seed_recipes():
    for m, (doc, model, cluster, workload, lay) in zip(seed_measurements(), _recipe_layouts()):
        assert m.layout == lay and m.model == model.name and m.count == cluster.count
        assert m.tokens_per_s_per_gpu == pytest.approx(doc["result"]["tokens_per_s_per_gpu"])
        assert (m.seq_len, m.global_batch) == (workload.seq_len, workload.global_batch)
        assert m.grads_fp32 == workload.grads_fp32 and m.load_balancing_loss == workload.load_balancing_loss
        assert m.source.startswith("seed page")


def test_seeds_within_10_percent_and_in_order_with_the_shipped_calibration():
    seeds = seed_measurements()
    pred = predict(seeds, load_calibration("H200"))
    meas = np.array([m.tokens_per_s_per_gpu for m in seeds])
    assert np.all(np.abs(pred / meas - 1) < 0.10), pred
    assert pred[0] > pred[1] > pred[2]
    # and through the public path the CLI and the search use
    for m, p in zip(seeds, pred):
        ev = evaluate(m.spec, m.workload, m.cluster, LayoutTable.from_layouts([m.layout]))
        assert ev.time.tokens_per_s_per_gpu[0] == pytest.approx(p)


def test_offload_term_by_hand(tiny_dense):
    """The host's share of the optimizer: fused CPU Adam traffic over this rank's share of the node's DRAM
    bandwidth, overlapped with the gradient and parameter copies over PCIe; the GPU keeps only the rest."""
    from autotune.cost.memory import stage_params

    lays = [Layout(world=8, micro_batch_size=1, optimizer_offload=f) for f in (0.0, 0.5, 1.0)]
    r = _time(tiny_dense, lays)
    dense, expert = stage_params(tiny_dense, LayoutTable.from_layouts(lays[:1]), 1)
    held = float(dense[0, 0] + expert[0, 0]) / 8  # the distributed optimizer shards over DP 8
    g = H100.gpu
    per_param = max((C.cpu_adam_bytes + C.offload_copy_bytes) / (g.host_mem_gbps * 1e9 * C.host_mem_eff / 8),
                    C.offload_copy_bytes / (g.host_link_gbps * 1e9 * C.host_link_eff))  # copies overlap the step
    off, gpu_opt = r.step_terms["offload"], r.step_terms["optimizer"]
    assert off[0] == 0 and off[1] == pytest.approx(0.5 * held * per_param) and off[2] == pytest.approx(held * per_param)
    assert gpu_opt[0] == pytest.approx(held * C.optimizer_bytes / 3350e9)
    assert gpu_opt[1] == pytest.approx(gpu_opt[0] / 2) and gpu_opt[2] == 0


def test_offload_costs_less_on_a_faster_host_down_to_the_pcie_floor():
    from dataclasses import replace

    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    lay = Layout.parse("TP1 PP2 EP8 DP8", max_tokens_per_gpu=8192, recompute=Recompute.parse("full:uniform:2"),
                       optimizer_offload=1.0)
    b200 = ClusterSpec.of("B200", 16)
    faster = [ClusterSpec.of(replace(b200.gpu, host_mem_gbps=k * b200.gpu.host_mem_gbps), 16) for k in (1, 2, 10)]
    base, twice, tenfold = (estimate_time(m, w, c, LayoutTable.from_layouts([lay])).step_terms["offload"][0]
                            for c in faster)
    assert twice == pytest.approx(base / 2)  # DRAM-bound: the host's Adam step paces it
    assert base / 10 < tenfold < base / 2  # then the PCIe copies do: they do not speed up with DRAM


def test_bf16_gradient_reduction_moves_fewer_bytes(tiny_dense):
    """Distributed optimizer: gradient reduce-scatter + bf16 parameter all-gather, 4 + 2 bytes per parameter in
    fp32, 2 + 2 in bf16; without it, an all-reduce of 2 x the gradient bytes."""
    lays = [Layout(world=8, micro_batch_size=1), Layout(world=8, micro_batch_size=1, distributed_optimizer=False)]
    lays = [l.with_(overlap_grad_reduce=False) for l in lays]
    fp32 = _time(tiny_dense, lays).step_terms["dp_comm"]
    bf16 = _time(tiny_dense, lays, workload=replace(WL, grads_fp32=False)).step_terms["dp_comm"]
    assert bf16[0] == pytest.approx(fp32[0] * 4 / 6) and bf16[1] == pytest.approx(fp32[1] / 2)
