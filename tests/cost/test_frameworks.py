"""What other training stacks keep in memory (cost/_state.py, cost/_sac.py, cost/_sources.py): torch FSDP2 as
torchtitan and NeMo AutoModel run it, Llama 3's FSDP, torchtitan's per-op selective AC, MLA's up-projection recompute,
and the published rows read with their sources' settings: every row that ran is predicted to fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autotune.catalog import ClusterSpec, Workload, load_model
from autotune.cost import TimeCoefficients, estimate_memory, estimate_time
from autotune.cost._raw import step_pieces
from autotune.cost._sac import op_sac_tables
from autotune.cost.measurements import published_measurements
from autotune.cost.memory import owned_params, stage_params
from autotune.errors import BadInput
from autotune.layout import Layout, LayoutTable, Recompute

GiB = 2**30


def _mem(model, w, gpu, lays):
    m = load_model(model)
    t = LayoutTable.from_layouts(lays)
    return m, t, estimate_memory(m, w, ClusterSpec.of(gpu, lays[0].world), t)


def test_bad_framework_or_optimizer_bytes_is_one_line_bad_input():
    with pytest.raises(BadInput, match="framework 'jax'"):
        Workload(framework="jax")
    with pytest.raises(BadInput, match="optimizer_state_bytes"):
        Workload(optimizer_state_bytes=-1)


@pytest.mark.parametrize("pp", [1, 4])
def test_fsdp2_keeps_fp32_shards_and_bf16_only_gathered(pp):
    lay = Layout(world=32, pp=pp, fsdp=True, micro_batch_size=1)
    w = Workload(seq_len=4096, global_batch=64)
    m, t, meg = _mem("Llama-3.1-8B", w, "H100", [lay])
    _, _, tt = _mem("Llama-3.1-8B", dataclasses.replace(w, framework="torchtitan"), "H100", [lay])
    S = pp
    dense, exp = stage_params(m, t, S)
    owned, params = owned_params(t, dense, exp), dense + exp
    units = params / (m.num_layers / pp)  # one decoder layer of the stage, as _state counts a unit
    gathered = 2 * 2 * units if pp == 1 else 2 * params  # two units in flight, or the whole stage under PP
    assert tt.terms["weights"][0] == pytest.approx(4 * owned[0] + gathered[0], rel=0.02)
    assert tt.terms["optimizer"][0] == pytest.approx(8 * owned[0])
    unsharded = 4 * units if pp == 1 else 4 * params  # PP: the stage's grads accumulate until the last micro-batch
    assert tt.terms["grads"][0] == pytest.approx(4 * owned[0] + unsharded[0], rel=0.02)
    if pp == 1:  # Megatron-FSDP keeps a BF16 shard beside the fp32 master: torch FSDP2 does not
        assert tt.terms["weights"][0, 0] + tt.terms["optimizer"][0, 0] == pytest.approx(
            meg.terms["weights"][0, 0] + meg.terms["optimizer"][0, 0] - 2 * owned[0, 0], rel=0.01)


def test_automodel_keeps_bf16_state_and_no_gathered_copy_of_ep_only_experts():
    lay = Layout(world=8, ep=8, fsdp=True, micro_batch_size=1, recompute=Recompute("full", "uniform", 1))
    w = Workload(seq_len=4096, global_batch=64, framework="automodel")
    m, t, am = _mem("Qwen3-30B-A3B", w, "H100", [lay])
    dense, exp = stage_params(m, t, 1)
    owned = owned_params(t, dense, exp)
    assert t.edp[0] == 1 and owned[0, 0] > exp[0, 0]  # experts unsharded by FSDP: owned whole
    assert am.terms["optimizer"][0, 0] == pytest.approx(4 * owned[0, 0])  # BF16 m, v
    # BF16 shards plus the (not resharded) MoE blocks' dense parameters gathered: experts have no gathered copy
    assert am.terms["weights"][0, 0] == pytest.approx(2 * owned[0, 0] + 2 * dense[0, 0])
    _, _, meg = _mem("Qwen3-30B-A3B", dataclasses.replace(w, framework="megatron"), "H100", [lay])
    assert am.peak[0] < meg.peak[0] - 20 * GiB


def test_automodel_moe_blocks_resharded_after_forward_keep_two_units_gathered():
    """moe.reshard_after_forward: true (NeMo AutoModel's Nemotron 3 Super and Ultra YAMLs, Workload.fsdp_reshard_moe):
    the MoE blocks are resharded like any unit, so two units are gathered, not the whole model; the Ultra row
    (128 H100, EP64: experts sharded over 2) fits only so."""
    lay = Layout(world=128, ep=64, fsdp=True, micro_batch_size=2, recompute=Recompute("full", "uniform", 1))
    w = Workload(seq_len=4096, global_batch=256, framework="automodel")
    name = "NVIDIA-Nemotron-3-Ultra-550B-A55B"
    m, t, kept = _mem(name, w, "H100", [lay])
    _, _, resharded = _mem(name, dataclasses.replace(w, fsdp_reshard_moe=True), "H100", [lay])
    dense, exp = stage_params(m, t, 1)
    owned = owned_params(t, dense, exp)
    assert t.edp[0] == 2  # experts are FSDP parameters too
    assert kept.terms["weights"][0, 0] == pytest.approx(2 * owned[0, 0] + 2 * (dense[0, 0] + exp[0, 0]))
    units = (dense[0, 0] + exp[0, 0]) / m.num_layers
    assert resharded.terms["weights"][0, 0] == pytest.approx(2 * owned[0, 0] + 2 * 2 * units, rel=0.02)
    assert not kept.fits[0] and resharded.fits[0]
    row = next(r for r in published_measurements()[0] if r.model == name and r.framework == "automodel")
    assert row.fsdp_reshard_moe and "reshard_after_forward" in row.source


def test_llama3_shards_gradients_and_reduces_them_every_micro_batch():
    lay = Layout(world=512, tp=8, pp=8, fsdp=True, micro_batch_size=1)
    w = Workload(seq_len=8192, global_batch=256)
    m, t, tt = _mem("Llama-3.1-405B", dataclasses.replace(w, framework="torchtitan"), "H100", [lay])
    _, _, l3 = _mem("Llama-3.1-405B", dataclasses.replace(w, framework="llama3"), "H100", [lay])
    assert l3.terms["grads"][0, 0] < 0.2 * tt.terms["grads"][0, 0]  # sharded, not accumulated whole
    assert l3.terms["weights"][0, 0] == pytest.approx(tt.terms["weights"][0, 0])  # both keep the stage gathered
    c = ClusterSpec.of("H100", 512)
    pieces = {fw: step_pieces(m, dataclasses.replace(w, framework=fw), c, t, TimeCoefficients(), 8)
              for fw in ("torchtitan", "llama3")}
    assert pieces["llama3"]["dp_comm"][0] > 2 * pieces["torchtitan"]["dp_comm"][0]  # wire bytes grow with M
    assert pieces["llama3"]["dp_overlap"][0] == t.num_microbatches(256, 8192)[0]  # ... and hide behind M of them


def test_torchtitans_per_op_sac_saves_every_other_matmul():
    m = load_model("Llama-3.1-8B")
    kept, rc, share = op_sac_tables(m)
    h, q, kv, f = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.ffn_hidden_size
    assert kept[0].sum() == pytest.approx(2 * (h + h) + 2 * (q + kv + f + q) + 4 * m.num_heads)
    assert rc[0] == pytest.approx((h * kv + q * h + h * f) / (2 * h * q + 2 * h * kv + 3 * h * f))
    assert 0.2 < share[0] < 0.6
    lay = Layout(world=8, fsdp=True, micro_batch_size=2, recompute=Recompute("selective"))
    w = Workload(seq_len=8192, global_batch=16)
    _, t, meg = _mem("Llama-3.1-8B", w, "H100", [lay])
    _, _, tt = _mem("Llama-3.1-8B", dataclasses.replace(w, framework="torchtitan"), "H100", [lay])
    assert tt.terms["activations"][0, 0] < 0.6 * meg.terms["activations"][0, 0]
    c = ClusterSpec.of("H100", 8)
    rc_time = {fw: estimate_time(m, dataclasses.replace(w, framework=fw), c, t).step_terms["recompute"][0]
               for fw in ("megatron", "torchtitan")}
    assert rc_time["torchtitan"] > rc_time["megatron"]  # a third of the matmuls re-run, not core attention


def test_mla_up_proj_recompute_frees_the_attention_inputs():
    base = Layout(world=256, pp=8, ep=32, micro_batch_size=1)
    lays = [base, base.with_(recompute=Recompute("selective", modules=("mla_up_proj",)))]
    m, t, mem = _mem("DeepSeek-V3", Workload(seq_len=4096, global_batch=1024), "B200", lays)
    a = mem.terms["activations"][:, 0]
    mla = m.mla
    qkv = 2 * m.num_heads * (2 * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) + mla.v_head_dim)
    per_token_layer = (a[0] - a[1]) / a[0]
    assert 0.2 < per_token_layer < 0.4 and qkv > 100_000  # q, k, v: ~a quarter of an MLA+MoE layer's bytes


def test_published_rows_read_their_sources_stacks_and_all_fit():
    kept, _ = published_measurements()
    by = lambda prefix: [m for m in kept if m.source.startswith(prefix)]  # noqa: E731
    assert all(m.framework == "torchtitan" for m in by("torchtitan"))
    assert all(m.framework == "automodel" for m in by("NeMo AutoModel"))
    assert all(m.framework == "llama3" for m in by("Llama 3 Herd"))
    mlm = [m for m in by("Megatron-LM examples/llama") if m.precision != "bf16"]
    assert mlm and all(not m.grads_fp32 and m.fp8_param_gather for m in mlm)
    nemo = by("NeMo 24.07")
    assert nemo and all(not m.grads_fp32 for m in nemo if m.precision != "bf16")
    assert [m.optimizer_state_bytes for m in nemo if m.model == "Nemotron-4-340B"] == [4.0]
    peak = np.array([estimate_memory(m.spec, m.workload, m.cluster, LayoutTable.from_layouts([m.layout])).peak[0]
                     / m.cluster.gpu.memory_bytes for m in kept])
    worst = int(np.argmax(peak))
    assert peak[worst] <= 1.0, f"{kept[worst].label()} ({kept[worst].source}) predicted at {peak[worst]:.0%} of HBM"


def test_linears_a_recipe_keeps_out_of_nvfp4_run_at_their_own_peak():
    from autotune.cost._quant import linear_time_scale
    from autotune.cost.time import TimeCoefficients as TC
    m = load_model("NVIDIA-Nemotron-3-Super-120B-A12B")
    t = LayoutTable.from_layouts([Layout(world=64, ep=64)])
    gpu = ClusterSpec.of("B200", 64).gpu
    w = Workload(precision="nvfp4")
    lin = gpu.fp4_tflops * 1e12 * TC().fp8_gemm
    assert linear_time_scale(m, w, t, 1, gpu, TC(), lin) == (1.0, 1.0)  # nothing exempt: no cost
    every = dataclasses.replace(w, bf16_layers_end=m.num_layers)
    d, e = linear_time_scale(m, every, t, 1, gpu, TC(), lin)
    assert d[0, 0] == pytest.approx(lin / (gpu.bf16_tflops * 1e12)) and e[0, 0] == pytest.approx(d[0, 0])
    recipe = dataclasses.replace(w, bf16_layers_end=14, quant_overrides=(("attention", "bf16"), ("mamba_out_proj", "mxfp8")))
    d, e = linear_time_scale(m, recipe, t, 1, gpu, TC(), lin)
    assert 1.0 < e[0, 0] < d[0, 0] < lin / (gpu.bf16_tflops * 1e12)  # experts only lose the last 14 layers
    with pytest.raises(BadInput, match="quant_overrides"):
        Workload(precision="nvfp4", quant_overrides=(("router", "bf16"),))
    kept, _ = published_measurements()
    sup = [k for k in kept if k.model == m.name and k.precision == "nvfp4" and k.source.startswith("Megatron-Bridge")]
    assert sup and all(k.bf16_layers_end == 14 and "te_quant.cfg" in k.source for k in sup)
