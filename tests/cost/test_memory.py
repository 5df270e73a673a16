"""The memory model against hand-computed breakdowns, and its behaviour over layouts."""


from dataclasses import replace

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import MemoryCoefficients, estimate_memory
from autotune.layout import Layout, LayoutTable, Recompute

GiB = 1024**3
C = MemoryCoefficients()


def _mem(model, workload, layouts, gpu="H100", count=None):
    cluster = ClusterSpec.of(gpu, count or layouts[0].world)
    return estimate_memory(model, workload, cluster, LayoutTable.from_layouts(layouts))


def test_small_dense_by_hand(tiny_dense):
    dense = tiny_dense  # tests/conftest.py
    w = Workload(seq_len=256, global_batch=4, steps=4, window=(1, 3))
    r = _mem(dense, w, [Layout(world=2, max_tokens_per_gpu=256)])
    layer = (64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 128 + 2 * 64
    params = 4 * layer + 2 * 256 * 64 + 64
    t = {k: v[0, 0] for k, v in r.terms.items()}
    assert t["weights"] == 2 * params
    assert t["grads"] == 4 * params
    assert t["optimizer"] == pytest.approx(12 * params / 2)  # distributed optimizer over DP 2
    per_token_layer = 2 * (2 * 64) + 2 * 64 + 2 * 64 + 2 * (64 + 2 * 32) + 2 * 64 + 2 * 3 * 128
    assert t["activations"] == pytest.approx(per_token_layer * 4 * 256 * 1 * (1 + C.fragmentation))
    assert t["logits"] == pytest.approx(256 * 256 * 2)  # bf16 logits, TE's fused loss writes the gradient over them
    assert t["dispatcher"] == 0
    assert t["overhead"] == pytest.approx(C.cuda_context + 3 * C.nccl_per_group)
    assert r.peak[0] == pytest.approx(sum(t.values()))
    # an allocator share (0 under expandable segments, MemoryCoefficients.fragmentation) scales the activations alone
    share = estimate_memory(dense, w, ClusterSpec.of("H100", 2), LayoutTable.from_layouts([Layout(
        world=2, max_tokens_per_gpu=256)]), replace(C, fragmentation=0.1))
    assert share.terms["activations"][0, 0] == pytest.approx(per_token_layer * 4 * 256 * 1.1)
    assert share.terms["weights"][0, 0] == t["weights"] and share.terms["logits"][0, 0] == t["logits"]


def test_small_moe_by_hand():
    m = load_model("tiny-moe")
    w = Workload(seq_len=256, global_batch=4, steps=4, window=(1, 3))
    r = _mem(m, w, [Layout(world=4, pp=2, ep=2, max_tokens_per_gpu=256)])
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 16
    dense_layer = attn + 64 * 8 + 3 * 64 * 32 + 2 * 64
    experts_layer = 8 * 3 * 64 * 32
    s0_dense, s1_dense = 2 * dense_layer + 512 * 64, 2 * dense_layer + 512 * 64 + 64
    s_exp = 2 * experts_layer / 2  # EP 2
    w0, w1 = r.terms["weights"][0]
    assert (w0, w1) == (2 * (s0_dense + s_exp), 2 * (s1_dense + s_exp))
    assert r.terms["optimizer"][0, 0] == pytest.approx(12 * (s0_dense / 2 + s_exp / 1))  # DP 2, expert-DP 1
    # the hottest of EP 2 ranks, 4 of the 8 experts each: imbalance_off is the EP 8 x 32-experts-per-rank maximum
    # (256 experts top-8), scaled by the expected maximum of EP normals (Blom) over sqrt(experts per rank), and the
    # experts' cv by sqrt(E / k - 1): top-2 of 8 here against top-8 of 256
    from statistics import NormalDist

    spread = lambda ep, per: NormalDist().inv_cdf((ep - 0.375) / (ep + 0.25)) / np.sqrt(per)  # noqa: E731
    imb = 1 + (C.imbalance_off - 1) * spread(2, 4) / spread(8, 32) * np.sqrt((8 / m.moe.top_k - 1) / (256 / 8 - 1))
    tok = 2 * (2 * 64) + 2 * 64 + (2 * 64 + 2 * 96) + 2 * (64 + 2 * 32) + 2 * 64 + 4 * 2 * 8 \
        + imb * (2 * 2 * 64 + 2 * 2 * 2 * 32 + 2 * 2 * 32) + 2 * 3 * 32
    a0, a1 = r.terms["activations"][0]
    # 1F1B: stage 0 keeps PP - 0 = 2 micro-batches in flight, stage 1 keeps 1
    assert a0 == pytest.approx(tok * 2 * 256 * 2 * (1 + C.fragmentation), rel=2e-3)  # A&S quantile: 4.5e-4
    assert a1 == pytest.approx(tok * 2 * 256 * 1 * (1 + C.fragmentation), rel=2e-3)
    assert r.terms["logits"][0, 0] == 0 and r.terms["logits"][0, 1] > 0
    assert r.terms["dispatcher"][0, 0] == pytest.approx(256 * 2 * 2 * 64 * 2 * imb, rel=2e-3)


def test_seed_layouts_fit_on_h200_and_not_without_recompute():
    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    lays = [Layout.parse("TP1 PP4 EP8 DP8", max_tokens_per_gpu=8192, precision_aware_optimizer=True,
                         recompute=Recompute.parse(rc), dispatcher=d)
            for rc, d in (("full:uniform:2", "alltoall"), ("full:uniform:1", "alltoall"), ("full:uniform:1", "flex"), ("none", "alltoall"))]
    r = _mem(m, w, lays, gpu="H200")
    assert list(r.fits) == [True, True, True, False]
    assert r.peak[0] / GiB > 60  # weights + grads + optimizer alone are ~75 GiB


def test_monotone_in_the_right_directions():
    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    base = dict(max_tokens_per_gpu=8192, recompute=Recompute.parse("full:uniform:1"))
    lays = [Layout.parse("TP1 PP4 EP8 DP8", **base), Layout.parse("TP1 PP2 EP8 DP16", **base),
            Layout.parse("TP1 PP4 EP8 DP8", **{**base, "distributed_optimizer": False}),
            Layout.parse("TP1 PP4 EP8 DP8", max_tokens_per_gpu=16384, recompute=Recompute.parse("full:uniform:1")),
            Layout.parse("TP1 PP4 EP8 DP8", **{**base, "cross_entropy_fusion": False}),
            Layout.parse("TP1 PP4 EP8 DP8", **{**base, "optimizer_offload": 0.5})]
    p = _mem(m, w, lays, gpu="H200").peak
    assert p[1] > p[0]  # fewer stages: more layers per GPU
    assert p[2] > p[0]  # unsharded optimizer
    assert p[3] > p[0]  # two rows per micro-batch
    assert p[4] > p[0]  # unfused cross entropy keeps fp32 logits
    assert p[5] < p[0]  # optimizer offload


def test_selective_and_interleaved():
    m, w = load_model("Qwen3-30B-A3B"), Workload()  # identical layers, so chunks compare exactly
    mk = lambda **kw: Layout.parse("TP2 PP4 EP8 DP4", max_tokens_per_gpu=8192, **kw)  # noqa: E731
    lays = [mk(), mk(recompute=Recompute.parse("selective")), mk(recompute=Recompute.parse("selective:core_attn,moe_act,layernorm")),
            mk(vpp=2), mk(recompute=Recompute.parse("full:block:3"))]
    a = _mem(m, w, lays, gpu="H200").terms["activations"][:, 0]
    assert a[1] == a[0]  # core_attn alone: the checkpoint keeps q, k, v, all that flash attention saves
    assert a[2] < a[1]  # layernorm and moe_act outputs are freed
    assert a[3] > a[0]  # interleaving keeps more in flight on stage 0: 1 + (PP-1)/(PP*VPP)
    assert a[3] / a[0] == pytest.approx(1 + 3 / 8, rel=1e-6)
    assert a[4] < a[0]


def test_vectorised_equals_one_at_a_time():
    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    lays = [Layout.parse(l, max_tokens_per_gpu=8192, recompute=Recompute.parse(rc))
            for l in ("TP1 PP4 EP8 DP8", "TP2 PP2 EP8 DP8", "TP1 PP8 EP4 DP4") for rc in ("none", "full:uniform:2")]
    together = _mem(m, w, lays, gpu="H200").peak
    alone = np.array([_mem(m, w, [l], gpu="H200").peak[0] for l in lays])
    assert np.allclose(together, alone)


def test_offload_moves_the_optimizer_to_host_memory():
    """Qwen3.5-122B on one B200 node: 2.2 TB of weights, gradients and Adam state cannot fit in 8 x 178 GiB; with
    the optimizer on the host it does, and the host holds 16 B per offloaded parameter for each GPU."""
    from dataclasses import replace

    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    mk = lambda f: Layout.parse("TP1 PP1 EP8 DP8", max_tokens_per_gpu=8192,  # noqa: E731
                                recompute=Recompute.parse("full:uniform:1"), optimizer_offload=f)
    r = _mem(m, w, [mk(0.0), mk(0.5), mk(1.0)], gpu="B200")
    assert list(r.fits) == [False, False, True]
    opt = r.terms["optimizer"][:, 0]
    assert opt[1] == pytest.approx(opt[0] / 2) and opt[2] == 0
    held = opt[0] / C.optim_bytes  # parameters this rank's optimizer owns
    assert r.host_bytes[0] == 0 and r.host_bytes[2] == pytest.approx(C.host_offload_bytes * held * 8)
    assert r.oom_reason(0).startswith("predicted OOM") and r.oom_reason(2) is None
    tight = ClusterSpec.of(replace(ClusterSpec.of("B200", 8).gpu, host_mem_gib=512), 8)
    r2 = estimate_memory(m, w, tight, LayoutTable.from_layouts([mk(1.0)]))
    assert not r2.fits[0] and "host memory" in r2.oom_reason(0) and "offload less" in r2.oom_reason(0)


def test_bf16_gradients_halve_the_gradient_buffers():
    m = load_model("Qwen3.5-122B-A10B")
    lay = [Layout.parse("TP1 PP4 EP8 DP8", max_tokens_per_gpu=8192, recompute=Recompute.parse("full:uniform:2"))]
    fp32, bf16 = (_mem(m, Workload(grads_fp32=g), lay, gpu="H200").terms for g in (True, False))
    np.testing.assert_allclose(bf16["grads"], fp32["grads"] / 2)
    np.testing.assert_allclose(bf16["weights"], fp32["weights"])


def test_without_transformer_engine_the_attention_scores_are_kept():
    """megatron.core's own attention (no TE: a CPU, or --no-te) keeps the softmax of the s x s scores for backward:
    per row and head, s^2 x 4 B on a CPU (fp32). Measured on this machine (tiny-moe, 2 CPU ranks, 4,096-token rows,
    two per micro-batch): 4.46 GiB peak against 4.64 predicted; without the term the model said 1.6 GiB, and at
    8,192 tokens every trial was killed by the OOM killer while the model predicted 1.7 GiB."""
    model = load_model("tiny-moe")
    lay = Layout.parse("TP1 PP1 EP1 DP2", world=2, max_tokens_per_gpu=8192)
    t = LayoutTable.from_layouts([lay])
    cpu = ClusterSpec.of("cpu", 2)
    acts = {}
    for s in (2048, 4096):
        mem = estimate_memory(model, Workload(seq_len=s, global_batch=8), cpu, t)
        acts[s] = float(mem.terms["activations"][0, 0])
    rows = {2048: 4, 4096: 2}
    scores = {s: rows[s] * model.num_heads * s * s * 4.0 * model.num_layers for s in acts}
    # the rest of the activations is linear in the tokens (the same 8,192 per micro-batch at both lengths)
    assert acts[4096] - acts[2048] == pytest.approx(scores[4096] - scores[2048], rel=0.02)
    # with Transformer Engine the fused kernel keeps no s x s scores: the activations do not grow with s
    gpu = ClusterSpec.of("H100", 2)
    te = [float(estimate_memory(model, Workload(seq_len=s, global_batch=8), gpu, t).terms["activations"][0, 0])
          for s in (2048, 4096)]
    assert te[1] == pytest.approx(te[0], rel=0.02)
    no_te = ClusterSpec.of("H100", 2, has_te=False)
    assert float(estimate_memory(model, Workload(seq_len=4096, global_batch=8), no_te, t).terms["activations"][0, 0]) \
        > te[1] + 2 * model.num_heads * 4096 * 4096 * 6.0 * model.num_layers * 0.99


def test_cpu_ranks_share_the_host_memory():
    """A CPU 'GPU' is the host: two ranks on it have half its memory each."""
    model = load_model("tiny-moe")
    t = LayoutTable.from_layouts([Layout.parse("TP1 PP1 EP1 DP2", world=2)])
    one = estimate_memory(model, Workload(seq_len=512, global_batch=8), ClusterSpec.of("cpu", 1),
                          LayoutTable.from_layouts([Layout.parse("TP1", world=1)]))
    two = estimate_memory(model, Workload(seq_len=512, global_batch=8), ClusterSpec.of("cpu", 2), t)
    assert two.capacity_bytes == pytest.approx(one.capacity_bytes / 2)
    h100 = estimate_memory(model, Workload(seq_len=512, global_batch=8), ClusterSpec.of("H100", 2), t)
    assert h100.capacity_bytes == ClusterSpec.of("H100", 2).gpu.memory_bytes


def test_memory_results_of_parts_join_into_the_whole():
    """space.explore screens memory a chunk at a time and hands evaluate the joined parts: rows of different PP
    widths joined (and cut to the rows' largest PP) must equal the memory model run on all of them at once, and
    the time model on top of them too."""
    from autotune.cost import evaluate
    from autotune.cost.memory import MemoryResult

    m, w = load_model("Qwen3.5-122B-A10B"), Workload()
    cluster = ClusterSpec.of("H200", 32)
    wide = [Layout.parse(l, max_tokens_per_gpu=8192) for l in ("TP1 PP8 EP4 DP4", "TP2 PP4 VPP2 EP8 DP4")]
    narrow = [Layout.parse(l, max_tokens_per_gpu=8192) for l in ("TP1 PP4 EP8 DP8", "TP2 PP2 EP8 DP8")]
    whole = estimate_memory(m, w, cluster, LayoutTable.from_layouts(narrow + wide[1:]))
    parts = [estimate_memory(m, w, cluster, LayoutTable.from_layouts(narrow)),
             estimate_memory(m, w, cluster, LayoutTable.from_layouts(wide)).take(np.array([1]))]
    assert [next(iter(p.terms.values())).shape[1] for p in parts] == [4, 8]  # the PP8 row set the width
    joined = MemoryResult.concat(parts, stages=4)  # cut back: the largest PP left is 4
    assert joined.total.shape == whole.total.shape
    assert np.array_equal(joined.total, whole.total) and np.array_equal(joined.host_bytes, whole.host_bytes)
    assert all(np.array_equal(a, b) for a, b in zip(joined.params, whole.params))
    t = LayoutTable.from_layouts(narrow + wide[1:])
    reused, fresh = evaluate(m, w, cluster, t, memory=joined), evaluate(m, w, cluster, t)
    assert np.array_equal(reused.time.tokens_per_s_per_gpu, fresh.time.tokens_per_s_per_gpu)
    per_row = [k for k, v in whole.terms.items() if v.strides[1] == 0]  # one value per row, over every stage
    assert per_row and all(joined.terms[k].strides[1] == 0 for k in per_row)  # still views: no (n, S) copy
    padded = MemoryResult.concat(parts[:1] + [estimate_memory(m, w, cluster, LayoutTable.from_layouts(wide))])
    assert padded.total.shape == (4, 8) and np.array_equal(padded.total[:2, 4:], np.zeros((2, 4)))
    with pytest.raises(ValueError, match="3 rows for 2 layouts"):
        evaluate(m, w, cluster, LayoutTable.from_layouts(narrow), memory=joined)
